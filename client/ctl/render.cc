#include "client/ctl/render.h"

#include <cstdio>

#include "client/ctl/table.h"

namespace gradsync::ctl {
namespace {

namespace v1 = admin::v1;

std::string ranks_text(const google::protobuf::RepeatedField<int32_t>& ranks) {
  if (ranks.empty()) return "-";
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  return text;
}

std::string seconds_text(double s) {
  char text[32];
  if (s <= 0) return "-";
  if (s >= 1e100) return ">100 s";
  if (s < 1e-3) {
    std::snprintf(text, sizeof text, "%.0f us", s * 1e6);
  } else if (s < 1) {
    std::snprintf(text, sizeof text, "%.0f ms", s * 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.0f s", s);
  }
  return text;
}

// "p50 <= 3 ms, p99 <= 30 ms (n 120)": quantiles are bucket bounds, so "at most".
std::string histogram_text(const v1::Histogram& h) {
  if (h.count() == 0) return "-";
  return "p50 <= " + seconds_text(h.p50_seconds()) + ", p99 <= " + seconds_text(h.p99_seconds()) + " (n " +
         std::to_string(h.count()) + ")";
}

std::string node_text(const v1::RemoteNode& n) {
  std::string text = "node " + std::to_string(n.node()) + " (" + n.address() + "): ";
  if (n.unreachable()) return text + "unreachable: " + n.error();
  if (!n.error().empty()) return text + n.error();
  if (n.current_seq() == 0) return text + "idle, " + std::to_string(n.operations_done()) + " operations done";
  return text + "at operation " + std::to_string(n.current_seq()) + ", bucket " + std::to_string(n.current_bucket()) +
         (n.executing() ? " (executing)" : " (waiting for its local ranks)");
}

}  // namespace

std::string print_status(const v1::GetStatusReply& r) {
  std::string out = "gradsyncd " + r.version() + ", pid " + std::to_string(r.pid()) + ", uid " +
                    std::to_string(r.uid()) + ", up " + human_ms(r.uptime_ms()) + "\n";
  std::string backends, engines;
  for (const auto& b : r.backends()) backends += (backends.empty() ? "" : ", ") + b;
  for (const auto& e : r.engines()) engines += (engines.empty() ? "" : ", ") + e;
  out += "memory:  " + backends + "\nengines: " + engines + "\ndevices: " + r.devices() + "\n";
  out += "jobs: " + std::to_string(r.jobs()) + ", clients: " + std::to_string(r.clients()) + "\n";
  out += "control socket: " + r.control_socket() + ", peer service: " + r.peer_address() + "\n";
  out += "peer store: " + std::to_string(r.peer_store_jobs()) + " jobs, " + human_bytes(r.peer_store_bytes()) + ", " +
         std::to_string(r.peer_store_waiting_gets()) + " waiting gets\n\n";
  Table table({"SETTING", "VALUE"});
  for (const auto& c : r.config()) table.add({c.name(), c.value()});
  return out + table.render();
}

std::string print_jobs(const v1::ListJobsReply& r) {
  if (r.jobs().empty()) return "no jobs\n";
  Table table({"JOB", "UID", "STATE", "WORLD", "NODE", "LOCAL RANKS", "SETS", "REGISTERED", "OPS DONE", "PENDING",
               "AGE", "LAST ERROR"});
  for (const auto& j : r.jobs()) {
    table.add({j.id(), std::to_string(j.uid()), j.state(), std::to_string(j.world_size()),
               std::to_string(j.node()) + "/" + std::to_string(j.nodes()), ranks_text(j.local_ranks_joined()),
               std::to_string(j.sets()), human_bytes(j.registered_bytes()), std::to_string(j.operations_done()),
               std::to_string(j.operations_pending()), human_ms(j.age_ms()),
               j.last_error().empty() ? "-" : j.last_error()});
  }
  return table.render();
}

std::string print_clients(const v1::ListClientsReply& r) {
  if (r.clients().empty()) return "no clients\n";
  Table table({"PID", "UID", "NAME", "JOB", "RANK", "LOCAL", "STATE", "SEGMENTS", "IDLE"});
  for (const auto& c : r.clients()) {
    table.add({std::to_string(c.pid()), std::to_string(c.uid()), c.name().empty() ? "-" : c.name(),
               c.job().empty() ? "-" : c.job(), c.rank() < 0 ? "-" : std::to_string(c.rank()),
               c.local_rank() < 0 ? "-" : std::to_string(c.local_rank()), c.state(),
               std::to_string(c.segments()) + " (" + human_bytes(c.segment_bytes()) + ")", human_ms(c.idle_ms())});
  }
  return table.render();
}

std::string print_stats(const v1::GetStatsReply& r) {
  if (r.jobs().empty()) return "no jobs\n";
  std::string out;
  for (const auto& j : r.jobs()) {
    out += "job " + j.job() + " (uid " + std::to_string(j.uid()) + "): " + std::to_string(j.operations()) +
           " operations, " + std::to_string(j.buckets()) + " buckets, " + human_bytes(j.bytes()) + " reduced, " +
           (j.cross_node_bytes() > 0 ? human_bytes(j.cross_node_bytes()) + " carried across nodes, " : "") +
           std::to_string(j.operations_pending()) + " pending\n";
    Table table({"  TIME", "QUANTILES"});
    table.add({"  operation latency", histogram_text(j.operation_latency())});
    table.add({"  waiting for local ranks, per bucket", histogram_text(j.waiting_for_ranks())});
    table.add({"  executing, per bucket", histogram_text(j.executing())});
    table.add({"    waiting for other nodes", histogram_text(j.waiting_for_peers())});
    table.add({"    local reduction", histogram_text(j.local_reduction())});
    table.add({"    collective across nodes", histogram_text(j.collective())});
    for (const auto& lag : j.readiness_lag()) {
      table.add({"  rank " + std::to_string(lag.rank()) + " readiness lag", histogram_text(lag.lag())});
    }
    out += table.render();
    if (!j.buckets_stats().empty()) {
      Table buckets({"  BUCKET", "LAUNCHES", "BYTES", "WAITING FOR LOCAL RANKS", "EXECUTING"});
      for (const auto& b : j.buckets_stats()) {
        buckets.add({"  " + std::to_string(b.bucket()), std::to_string(b.launches()), human_bytes(b.bytes()),
                     histogram_text(b.waiting_for_ranks()), histogram_text(b.executing())});
      }
      out += buckets.render();
    }
  }
  return out;
}

std::string print_inflight(const v1::GetInFlightReply& r) {
  std::string out;
  for (const auto& job : r.jobs()) {
    out += "job " + job.job() + " (uid " + std::to_string(job.uid()) + ")";
    if (!job.unavailable().empty()) {
      out += ": " + job.unavailable() + "\n";
      continue;
    }
    if (job.operations().empty()) {
      out += ": nothing in flight\n";
    } else {
      out += "\n";
      Table table({"  OP", "KIND", "AGE", "NOT SUBMITTED BY", "BUCKET", "GROUP", "BYTES", "NOT READY ON RANKS"});
      for (const auto& op : job.operations()) {
        const std::string head = "  " + std::to_string(op.seq());
        if (op.buckets().empty()) {
          table.add({head, op.kind(), human_ms(op.age_ms()), ranks_text(op.ranks_not_submitted()), "-", "-", "-", "-"});
        }
        bool first = true;
        for (const auto& b : op.buckets()) {
          table.add({first ? head : "", first ? op.kind() : "", first ? human_ms(op.age_ms()) : "",
                     first ? ranks_text(op.ranks_not_submitted()) : "", std::to_string(b.bucket()), b.group(),
                     human_bytes(b.bytes()), b.launched() ? "(executing)" : ranks_text(b.ranks_not_ready())});
          first = false;
        }
      }
      out += table.render();
      const auto& head = job.operations(0);
      if (!head.nodes_behind().empty() && !head.buckets().empty()) {
        out += "  operation " + std::to_string(head.seq()) + ", bucket " + std::to_string(head.buckets(0).bucket()) +
               " is not reached by:\n";
        for (const auto& n : head.nodes_behind()) out += "    " + node_text(n) + "\n";
      }
    }
    if (!job.nodes().empty()) {
      out += "  other nodes:\n";
      for (const auto& n : job.nodes()) out += "    " + node_text(n) + "\n";
    }
  }
  return out.empty() ? "no jobs\n" : out;
}

std::string print_config(const v1::GetStatusReply& r) {
  Table table({"SETTING", "VALUE"});
  for (const auto& c : r.config()) table.add({c.name(), c.value()});
  return table.render();
}

std::string print_config_change(const v1::SetConfigReply& r) {
  std::string out;
  for (const auto& j : r.jobs()) {
    out += "job " + j.job() + " (uid " + std::to_string(j.uid()) + "): " +
           (j.error().empty() ? "new settings from operation " + std::to_string(j.from_operation()) + " on every node"
                              : "not changed: " + j.error()) +
           "\n";
  }
  if (r.jobs().empty()) out += "no job settings changed\n";
  for (const auto& c : r.config()) {
    if (c.name() == "log-level") out += "log level: " + c.value() + "\n";
  }
  return out;
}

std::string print_drain(const v1::DrainReply& r) {
  if (!r.draining()) return "gradsyncd accepts new jobs again\n";
  if (r.jobs_left().empty()) return "drained: gradsyncd refuses new jobs and has none left\n";
  std::string out = "gradsyncd refuses new jobs; " + std::to_string(r.jobs_left_size()) + " still there:\n";
  for (const auto& job : r.jobs_left()) out += "  " + job + "\n";
  return out;
}

std::string print_trace(const v1::DumpTraceReply& r) {
  return std::to_string(r.operations()) + " operations traced\n";
}

}  // namespace gradsync::ctl
