#include "daemon/admin/admin_service.h"

#include <unistd.h>

#include <algorithm>

#include "daemon/config/setting.h"
#include "daemon/peer/peer_server.h"  // to_grpc

namespace gradsync::admin {
namespace {

void fill(const JobInfo& in, v1::Job* out) {
  out->set_id(in.id);
  out->set_uid(in.uid);
  out->set_incarnation(in.incarnation);
  out->set_state(in.state);
  out->set_world_size(in.world_size);
  out->set_local_world_size(in.local_world_size);
  out->set_node(in.node);
  out->set_nodes(in.nodes);
  for (const auto& [name, ranks] : in.groups) {
    v1::Group* group = out->add_groups();
    group->set_name(name);
    for (int r : ranks) group->add_ranks(r);
  }
  for (int r : in.local_ranks_joined) out->add_local_ranks_joined(r);
  out->set_sets(in.sets);
  out->set_registered_bytes(in.registered_bytes);
  out->set_operations_done(in.operations_done);
  out->set_operations_pending(in.operations_pending);
  out->set_last_error(in.last_error);
  out->set_age_ms(static_cast<uint64_t>(in.age.count()));
}

void fill(const RemoteNode& in, v1::RemoteNode* out) {
  out->set_node(in.node);
  out->set_address(in.address);
  out->set_unreachable(in.unreachable);
  out->set_error(in.error);
  out->set_operations_done(in.operations_done);
  out->set_current_seq(in.current_seq);
  out->set_current_bucket(in.current_bucket);
  out->set_executing(in.executing);
}

void fill(const Histogram& in, v1::Histogram* out) {
  out->set_count(in.count());
  out->set_sum_seconds(in.sum_seconds());
  out->set_p50_seconds(in.quantile_seconds(0.5));
  out->set_p99_seconds(in.quantile_seconds(0.99));
  for (double bound : Histogram::kBoundsSeconds) out->add_bounds_seconds(bound);
  for (uint64_t count : in.counts()) out->add_counts(count);
}

}  // namespace

grpc::Status AdminService::GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                                    v1::GetStatsReply* reply) {
  uid_t uid = 0;
  bool sees_all = false;
  if (grpc::Status denied = check_reader(context, &uid, &sees_all); !denied.ok()) return denied;
  std::vector<JobStatistics> jobs;
  if (Status s = view_->stats(request->job(), sees_all ? std::nullopt : std::optional<uid_t>(uid), &jobs); !s.ok()) {
    return to_grpc(s);
  }
  for (const JobStatistics& j : jobs) {
    if (!sees_all && j.job.uid != uid) continue;
    v1::JobStats* out = reply->add_jobs();
    out->set_job(j.job.id);
    out->set_uid(j.job.uid);
    out->set_operations(j.stats.operations);
    out->set_buckets(j.stats.buckets);
    out->set_bytes(j.stats.bytes);
    out->set_cross_node_bytes(j.stats.cross_node_bytes);
    out->set_operations_pending(j.job.operations_pending);
    fill(j.stats.operation_latency, out->mutable_operation_latency());
    fill(j.stats.waiting_for_ranks, out->mutable_waiting_for_ranks());
    fill(j.stats.executing, out->mutable_executing());
    fill(j.stats.waiting_for_peers, out->mutable_waiting_for_peers());
    fill(j.stats.local_reduction, out->mutable_local_reduction());
    fill(j.stats.collective, out->mutable_collective());
    for (const auto& [index, b] : j.stats.buckets_by_index) {
      v1::BucketStats* bucket = out->add_buckets_stats();
      bucket->set_bucket(index);
      bucket->set_launches(b.launches);
      bucket->set_bytes(b.bytes);
      fill(b.waiting_for_ranks, bucket->mutable_waiting_for_ranks());
      fill(b.executing, bucket->mutable_executing());
    }
    for (size_t r = 0; r < j.stats.readiness_lag.size(); ++r) {
      v1::RankLag* lag = out->add_readiness_lag();
      lag->set_rank(j.job.node * j.job.local_world_size + static_cast<int>(r));
      fill(j.stats.readiness_lag[r], lag->mutable_lag());
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::check_reader(grpc::ServerContext* context, uid_t* uid, bool* sees_all) const {
  Caller who;
  std::string why;
  if (!caller_(context, &who, &why)) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why);
  *uid = who.uid;
  if (who.admin_certificate) {
    *sees_all = true;
    return grpc::Status::OK;
  }
  const std::string name = who.certificate.empty() ? "uid " + std::to_string(who.uid)
                                                   : "certificate '" + who.certificate + "' (uid " +
                                                         std::to_string(who.uid) + ")";
  if (!view_->allowed(who.uid)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        name + " is not allowed on this gradsyncd (gradsyncd --allow-uid; default: its own user and root)");
  }
  // Over TCP only the certificates listed as administrators' are privileged: one naming root
  // or the daemon's user reads that user's jobs, and changes nothing.
  *sees_all = who.certificate.empty() && view_->privileged(who.uid);
  return grpc::Status::OK;
}

grpc::Status AdminService::check_admin(grpc::ServerContext* context, const char* call, uid_t* uid,
                                       std::string* who) const {
  bool privileged = false;
  if (grpc::Status denied = check_reader(context, uid, &privileged); !denied.ok()) return denied;
  Caller caller;
  std::string why;
  caller_(context, &caller, &why);
  *who = (caller.certificate.empty() ? "uid " + std::to_string(*uid) : "certificate '" + caller.certificate + "'") +
         " from " + context->peer();
  if (!privileged) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        std::string(call) + " changes the daemon: only root, gradsyncd's own user and members of its "
                                            "admin group (gradsyncd --admin-group), or over TCP certificates listed "
                                            "with --admin-tls-admin-cn, may call it; " +
                            (caller.certificate.empty() ? "uid " + std::to_string(*uid)
                                                        : "certificate '" + caller.certificate + "'") +
                            " is none of them");
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest*,
                                     v1::GetStatusReply* reply) {
  uid_t uid = 0;
  bool sees_all = false;
  if (grpc::Status denied = check_reader(context, &uid, &sees_all); !denied.ok()) return denied;
  DaemonStatus status;
  if (Status s = view_->status(&status); !s.ok()) return to_grpc(s);
  reply->set_version(status.version);
  reply->set_uptime_ms(static_cast<uint64_t>(status.uptime.count()));
  reply->set_pid(status.pid);
  reply->set_uid(status.uid);
  for (const auto& b : status.backends) reply->add_backends(b);
  for (const auto& e : status.engines) reply->add_engines(e);
  reply->set_devices(status.devices);
  for (const auto& [name, value] : status.config) {
    // Who else may use the daemon is the privileged callers' business.
    if (!sees_all && (name == "allow-uid" || name == "legacy-ipc-uid")) continue;
    v1::ConfigEntry* entry = reply->add_config();
    entry->set_name(name);
    entry->set_value(value);
  }
  if (sees_all) {
    reply->set_jobs(status.jobs);
    reply->set_clients(status.clients);
  } else {  // other users' activity is the privileged callers' business: the caller's own
    std::vector<JobInfo> jobs;
    std::vector<ClientInfo> clients;
    if (Status s = view_->jobs(&jobs); !s.ok()) return to_grpc(s);
    if (Status s = view_->clients(&clients); !s.ok()) return to_grpc(s);
    reply->set_jobs(static_cast<uint32_t>(
        std::count_if(jobs.begin(), jobs.end(), [uid](const JobInfo& j) { return j.uid == uid; })));
    reply->set_clients(static_cast<uint32_t>(
        std::count_if(clients.begin(), clients.end(), [uid](const ClientInfo& c) { return c.uid == uid; })));
  }
  reply->set_control_socket(status.control_socket);
  reply->set_peer_address(status.peer_address);
  if (sees_all) {  // other users' rendezvous traffic is the privileged callers' business
    reply->set_peer_store_jobs(status.peer_store_jobs);
    reply->set_peer_store_bytes(status.peer_store_bytes);
    reply->set_peer_store_waiting_gets(status.peer_store_waiting_gets);
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                                    v1::ListJobsReply* reply) {
  uid_t uid = 0;
  bool sees_all = false;
  if (grpc::Status denied = check_reader(context, &uid, &sees_all); !denied.ok()) return denied;
  std::vector<JobInfo> jobs;
  if (Status s = view_->jobs(&jobs); !s.ok()) return to_grpc(s);
  for (const JobInfo& job : jobs) {
    if (sees_all || job.uid == uid) fill(job, reply->add_jobs());
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListClients(grpc::ServerContext* context, const v1::ListClientsRequest*,
                                       v1::ListClientsReply* reply) {
  uid_t uid = 0;
  bool sees_all = false;
  if (grpc::Status denied = check_reader(context, &uid, &sees_all); !denied.ok()) return denied;
  std::vector<ClientInfo> clients;
  if (Status s = view_->clients(&clients); !s.ok()) return to_grpc(s);
  for (const ClientInfo& in : clients) {
    if (!sees_all && in.uid != uid) continue;
    v1::Client* out = reply->add_clients();
    out->set_pid(in.pid);
    out->set_uid(in.uid);
    out->set_name(in.name);
    out->set_job(in.job);
    out->set_rank(in.rank);
    out->set_local_rank(in.local_rank);
    out->set_state(in.state);
    out->set_segments(in.segments);
    out->set_segment_bytes(in.segment_bytes);
    out->set_idle_ms(static_cast<uint64_t>(in.idle.count()));
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::GetInFlight(grpc::ServerContext* context, const v1::GetInFlightRequest* request,
                                       v1::GetInFlightReply* reply) {
  uid_t uid = 0;
  bool sees_all = false;
  if (grpc::Status denied = check_reader(context, &uid, &sees_all); !denied.ok()) return denied;
  std::vector<JobOperations> jobs;
  if (Status s = view_->in_flight(request->job(), sees_all ? std::nullopt : std::optional<uid_t>(uid), &jobs); !s.ok()) {
    return to_grpc(s);
  }
  for (const JobOperations& job : jobs) {
    if (!sees_all && job.job.uid != uid) continue;
    v1::JobInFlight* out = reply->add_jobs();
    out->set_job(job.job.id);
    out->set_uid(job.job.uid);
    out->set_unavailable(job.unavailable);
    for (const RemoteNode& node : job.nodes) fill(node, out->add_nodes());
    for (const PendingOperation& op : job.operations) {
      v1::PendingOperation* o = out->add_operations();
      o->set_seq(op.seq);
      o->set_kind(op.kind);
      o->set_set(op.set);
      o->set_age_ms(static_cast<uint64_t>(op.age.count()));
      for (int r : op.ranks_not_submitted) o->add_ranks_not_submitted(r);
      for (const PendingBucket& b : op.buckets) {
        v1::PendingBucket* ob = o->add_buckets();
        ob->set_bucket(b.bucket);
        ob->set_group(b.group);
        ob->set_bytes(b.bytes);
        ob->set_launched(b.launched);
        for (int r : b.ranks_not_ready) ob->add_ranks_not_ready(r);
      }
      for (const RemoteNode& node : op.nodes_behind) fill(node, o->add_nodes_behind());
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::DumpTrace(grpc::ServerContext* context, const v1::DumpTraceRequest* request,
                                     v1::DumpTraceReply* reply) {
  uid_t uid = 0;
  bool sees_all = false;
  if (grpc::Status denied = check_reader(context, &uid, &sees_all); !denied.ok()) return denied;
  std::vector<JobTrace> traces;
  if (Status s = view_->traces(request->job(), request->operations(),
                               sees_all ? std::nullopt : std::optional<uid_t>(uid), &traces);
      !s.ok()) {
    return to_grpc(s);
  }
  std::vector<JobTrace> visible;
  uint32_t operations = 0;
  for (JobTrace& trace : traces) {
    if (!sees_all && trace.job.uid != uid) continue;
    operations += static_cast<uint32_t>(trace.operations.size());
    visible.push_back(std::move(trace));
  }
  if (!request->job().empty() && visible.empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job '" + request->job() + "' of uid " + std::to_string(uid) +
                                                         " on this gradsyncd");
  }
  reply->set_chrome_trace_json(chrome_trace_json(visible));
  reply->set_operations(operations);
  return grpc::Status::OK;
}

grpc::Status AdminService::SetConfig(grpc::ServerContext* context, const v1::SetConfigRequest* request,
                                     v1::SetConfigReply* reply) {
  uid_t uid = 0;
  std::string who;
  if (grpc::Status denied = check_admin(context, "SetConfig", &uid, &who); !denied.ok()) return denied;
  log_.info("SetConfig by " + who + ": " + request->ShortDebugString());
  SettingsChange change;
  change.job = request->job();
  if (request->has_log_level()) {
    // Read by the log level's declaration (config/settings.cc), as the flag and the file are.
    const std::vector<SettingSpec> settings = daemon_settings();
    DaemonConfig parsed;
    std::string why;
    if (!find_setting(settings, "log-level")->parse({request->log_level()}, &parsed, &why)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "log-level " + why);
    }
    change.log_level = parsed.log_level;
  }
  if (request->has_bucket_cap_bytes()) change.settings.bucket_cap = request->bucket_cap_bytes();
  if (request->has_timeout_ms()) change.settings.timeout = std::chrono::milliseconds(request->timeout_ms());
  if (request->has_execution_timeout_ms()) {
    change.settings.execution_timeout = std::chrono::milliseconds(request->execution_timeout_ms());
  }
  if (!change.log_level && change.settings.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "SetConfig names nothing to change (log_level, bucket_cap_bytes, timeout_ms, "
                        "execution_timeout_ms)");
  }
  std::vector<JobChange> changes;
  if (Status s = view_->change_settings(change, &changes); !s.ok()) return to_grpc(s);
  for (const JobChange& c : changes) {
    v1::JobConfigChange* out = reply->add_jobs();
    out->set_job(c.job.id);
    out->set_uid(c.job.uid);
    out->set_from_operation(c.from_seq);
    out->set_error(c.error);
  }
  DaemonStatus status;
  if (Status s = view_->status(&status); s.ok()) {
    for (const auto& [name, value] : status.config) {
      v1::ConfigEntry* entry = reply->add_config();
      entry->set_name(name);
      entry->set_value(value);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                                 v1::DrainReply* reply) {
  uid_t uid = 0;
  std::string who;
  if (grpc::Status denied = check_admin(context, "Drain", &uid, &who); !denied.ok()) return denied;
  log_.info("Drain by " + who + ": " + request->ShortDebugString());
  if (request->timeout_ms() > 3'600'000) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "timeout_ms must be at most 3600000 (an hour)");
  }
  bool draining = false;
  std::vector<std::string> left;
  if (Status s = view_->drain(std::chrono::milliseconds(request->timeout_ms()), request->cancel(),
                              [context] { return context->IsCancelled(); }, &draining, &left);
      !s.ok()) {
    return to_grpc(s);
  }
  reply->set_draining(draining);
  for (auto& job : left) reply->add_jobs_left(job);
  return grpc::Status::OK;
}

}  // namespace gradsync::admin
