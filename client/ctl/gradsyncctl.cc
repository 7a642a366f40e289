// gradsyncctl: the operator's view of a gradsyncd, over its admin service (proto/admin.proto).
//
//   gradsyncctl [--admin unix:PATH] [--json] [--watch SECONDS] status|jobs|clients|stats [JOB]|inflight [JOB]
//
// Exit status: 0 ok; 1 the daemon answered with an error; 2 bad usage; 3 the daemon is not
// reachable (not running, or no admin socket there); 4 access denied; 5 the daemon, or a job's
// worker (inflight), did not answer in time.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "client/ctl/table.h"
#include "proto/admin.grpc.pb.h"

namespace {

namespace v1 = gradsync::admin::v1;
using gradsync::ctl::human_bytes;
using gradsync::ctl::human_ms;
using gradsync::ctl::Table;

constexpr int kOk = 0, kDaemonError = 1, kUsage = 2, kUnreachable = 3, kDenied = 4, kHung = 5;
constexpr char kDefaultAdmin[] = "unix:/run/gradsync/admin.sock";

const char kUsageText[] =
    "Usage: gradsyncctl [--admin unix:PATH] [--json] [--watch SECONDS] COMMAND\n"
    "\n"
    "Shows what the node's gradsyncd is doing, over its admin service.\n"
    "\n"
    "Commands:\n"
    "  status           version, uptime, backends, devices, the configuration in effect\n"
    "  jobs             every job: state, ranks, sets, operations done and pending, last error\n"
    "  clients          every connected trainer: pid, uid, job, rank, state, idle time\n"
    "  stats [JOB]      operations, bytes, latency quantiles, waiting vs executing, and each\n"
    "                   rank's readiness lag behind the first: who is the straggler\n"
    "  inflight [JOB]   operations not finished, and which ranks have not submitted them or\n"
    "                   marked which buckets ready: who holds a stalled job\n"
    "\n"
    "Options:\n"
    "  --admin ADDR     the daemon's admin socket (default $GRADSYNC_ADMIN, else unix:/run/gradsync/admin.sock)\n"
    "  --json           print the reply as JSON (for scripts)\n"
    "  --watch SECONDS  repeat every SECONDS until interrupted (jobs, clients, stats, inflight)\n"
    "\n"
    "Exit status: 0 ok, 1 the daemon answered with an error, 2 bad usage, 3 the daemon is not\n"
    "reachable, 4 access denied, 5 the daemon (or a job's worker, for inflight) did not answer in\n"
    "time: busy or hung.\n";

struct Options {
  std::string admin;
  bool json = false;
  double watch = 0;
  std::string command;
  std::string job;
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "gradsyncctl: %s\n\n%s", message.c_str(), kUsageText);
  return kUsage;
}

// gRPC says "unavailable" for a missing daemon, a socket we may not open, and a daemon that
// closed on us because it does not allow this user; a plain connect tells them apart.
int why_unavailable(const Options& o, const grpc::Status& status) {
  const std::string path = o.admin.substr(5);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int connected = fd < 0 ? -1 : ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (connected == 0) {
    std::fprintf(stderr,
                 "gradsyncctl: access denied: gradsyncd at %s closed the connection: uid %u is not allowed there "
                 "(gradsyncd --allow-uid; default: its own user and root)\n",
                 o.admin.c_str(), static_cast<unsigned>(::getuid()));
    return kDenied;
  }
  if (error == EACCES || error == EPERM) {
    std::fprintf(stderr,
                 "gradsyncctl: access denied: cannot open gradsyncd's admin socket %s (its file permissions: the "
                 "daemon admits only its own user and root unless started with --allow-uid)\n",
                 o.admin.c_str());
    return kDenied;
  }
  std::fprintf(stderr, "gradsyncctl: cannot reach gradsyncd at %s: %s (is it running? is --admin or $GRADSYNC_ADMIN right?)\n",
               o.admin.c_str(), status.error_message().c_str());
  return kUnreachable;
}

// An RPC failure as the operator should read it, and the exit status that goes with it.
int rpc_failed(const grpc::Status& status, const Options& o) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) return why_unavailable(o, status);
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (status.error_message() == "Deadline Exceeded") {  // gRPC's own: no answer at all
        std::fprintf(stderr, "gradsyncctl: gradsyncd at %s did not answer within 10 s (hung?)\n", o.admin.c_str());
      } else {  // the daemon's: a thread of it did not answer
        std::fprintf(stderr, "gradsyncctl: gradsyncd at %s: %s\n", o.admin.c_str(), status.error_message().c_str());
      }
      return kHung;
    case grpc::StatusCode::PERMISSION_DENIED:
      std::fprintf(stderr, "gradsyncctl: access denied by gradsyncd at %s: %s\n", o.admin.c_str(),
                   status.error_message().c_str());
      return kDenied;
    default:
      std::fprintf(stderr, "gradsyncctl: gradsyncd at %s: %s\n", o.admin.c_str(), status.error_message().c_str());
      return kDaemonError;
  }
}

std::string json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string ranks_text(const google::protobuf::RepeatedField<int32_t>& ranks) {
  if (ranks.empty()) return "-";
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  return text;
}

std::string print_status(const v1::GetStatusReply& r) {
  std::string out = "gradsyncd " + r.version() + ", pid " + std::to_string(r.pid()) + ", uid " +
                    std::to_string(r.uid()) + ", up " + human_ms(r.uptime_ms()) + "\n";
  std::string backends, engines;
  for (const auto& b : r.backends()) backends += (backends.empty() ? "" : ", ") + b;
  for (const auto& e : r.engines()) engines += (engines.empty() ? "" : ", ") + e;
  out += "memory:  " + backends + "\nengines: " + engines + "\ndevices: " + r.devices() + "\n";
  out += "jobs: " + std::to_string(r.jobs()) + ", clients: " + std::to_string(r.clients()) + "\n";
  out += "control socket: " + r.control_socket() + ", peer service: " + r.peer_address() + "\n\n";
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

std::string print_stats(const v1::GetStatsReply& r) {
  if (r.jobs().empty()) return "no jobs\n";
  std::string out;
  for (const auto& j : r.jobs()) {
    out += "job " + j.job() + " (uid " + std::to_string(j.uid()) + "): " + std::to_string(j.operations()) +
           " operations, " + std::to_string(j.buckets()) + " buckets, " + human_bytes(j.bytes()) + " reduced, " +
           std::to_string(j.operations_pending()) + " pending\n";
    Table table({"  TIME", "QUANTILES"});
    table.add({"  operation latency", histogram_text(j.operation_latency())});
    table.add({"  waiting for local ranks, per bucket", histogram_text(j.waiting_for_ranks())});
    table.add({"  executing, per bucket", histogram_text(j.executing())});
    for (const auto& lag : j.readiness_lag()) {
      table.add({"  rank " + std::to_string(lag.rank()) + " readiness lag", histogram_text(lag.lag())});
    }
    out += table.render();
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
      continue;
    }
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
  }
  return out.empty() ? "no jobs\n" : out;
}

// The exit status a reply itself calls for: inflight with a job whose worker did not answer.
int reply_status(const google::protobuf::Message& reply) {
  if (const auto* inflight = dynamic_cast<const v1::GetInFlightReply*>(&reply)) {
    for (const auto& job : inflight->jobs()) {
      if (job.unavailable().find("did not answer") != std::string::npos) return kHung;
    }
  }
  return kOk;
}

template <class Reply, class Call>
int run_call(const Options& o, Call call, std::string (*print)(const Reply&)) {
  auto channel = grpc::CreateChannel(o.admin, grpc::InsecureChannelCredentials());
  auto stub = v1::Admin::NewStub(channel);
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    Reply reply;
    const grpc::Status status = call(*stub, &context, &reply);
    if (!status.ok()) return rpc_failed(status, o);
    if (o.watch > 0 && !o.json) std::printf("\033[H\033[2J");  // a fresh screen per round
    std::fputs((o.json ? json(reply) + "\n" : print(reply)).c_str(), stdout);
    std::fflush(stdout);
    if (o.watch <= 0) return reply_status(reply);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.watch));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const char* env = std::getenv("GRADSYNC_ADMIN");
  o.admin = env && *env ? env : kDefaultAdmin;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsageText, stdout);
      return kOk;
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--admin" || arg == "--watch") {
      if (i + 1 >= argc) return usage_error(arg + " needs a value");
      const std::string value = argv[++i];
      if (arg == "--admin") {
        o.admin = value;
      } else {
        char* end = nullptr;
        o.watch = std::strtod(value.c_str(), &end);
        if (!end || *end || !(o.watch > 0)) return usage_error("--watch needs a positive number of seconds, not '" + value + "'");
      }
    } else if (arg.rfind("--", 0) == 0) {
      return usage_error("unknown option " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.empty()) return usage_error("no command given");
  o.command = positional[0];
  static const char* kCommands[] = {"status", "jobs", "clients", "stats", "inflight"};
  if (std::find(std::begin(kCommands), std::end(kCommands), o.command) == std::end(kCommands)) {
    return usage_error("unknown command '" + o.command + "'");
  }
  if (o.admin.rfind("unix:", 0) != 0 || o.admin.size() == 5) {
    return usage_error("--admin must be unix:PATH, not '" + o.admin + "'");
  }
  const bool takes_job = o.command == "inflight" || o.command == "stats";
  if (positional.size() > (takes_job ? 2u : 1u)) return usage_error("too many arguments for " + o.command);
  if (takes_job && positional.size() == 2) o.job = positional[1];
  if (o.command == "status") {
    if (o.watch > 0) return usage_error("--watch applies to jobs, clients, stats and inflight");
    return run_call<v1::GetStatusReply>(
        o, [](v1::Admin::Stub& s, grpc::ClientContext* c, v1::GetStatusReply* r) { return s.GetStatus(c, {}, r); },
        print_status);
  }
  if (o.command == "jobs") {
    return run_call<v1::ListJobsReply>(
        o, [](v1::Admin::Stub& s, grpc::ClientContext* c, v1::ListJobsReply* r) { return s.ListJobs(c, {}, r); },
        print_jobs);
  }
  if (o.command == "clients") {
    return run_call<v1::ListClientsReply>(
        o, [](v1::Admin::Stub& s, grpc::ClientContext* c, v1::ListClientsReply* r) { return s.ListClients(c, {}, r); },
        print_clients);
  }
  if (o.command == "stats") {
    const std::string job = o.job;
    return run_call<v1::GetStatsReply>(
        o,
        [job](v1::Admin::Stub& s, grpc::ClientContext* c, v1::GetStatsReply* r) {
          v1::GetStatsRequest request;
          request.set_job(job);
          return s.GetStats(c, request, r);
        },
        print_stats);
  }
  if (o.command == "inflight") {
    const std::string job = o.job;
    return run_call<v1::GetInFlightReply>(
        o,
        [job](v1::Admin::Stub& s, grpc::ClientContext* c, v1::GetInFlightReply* r) {
          v1::GetInFlightRequest request;
          request.set_job(job);
          return s.GetInFlight(c, request, r);
        },
        print_inflight);
  }
  return usage_error("unknown command '" + o.command + "'");
}
