// gradsyncctl: the operator's view of a gradsyncd, over its admin service (proto/admin.proto).
//
//   gradsyncctl [--admin unix:PATH] [--json] [--watch SECONDS] COMMAND [ARGS]
//
// Exit status: 0 ok; 1 the daemon answered with an error; 2 bad usage; 3 the daemon is not
// reachable (not running, or no admin socket there); 4 access denied; 5 the daemon, or a job's
// worker (inflight), did not answer in time; 6 drain: jobs were still there at the bound, or
// config set: a job did not take the change.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <array>
#include <chrono>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fstream>
#include <sstream>
#include <map>

#include "client/ctl/json.h"
#include "client/ctl/render.h"
#include "proto/admin.grpc.pb.h"
#include "shared/host_port.h"
#include "shared/socket_names.h"

namespace {

namespace v1 = gradsync::admin::v1;
using namespace gradsync::ctl;

constexpr int kOk = 0, kDaemonError = 1, kUsage = 2, kUnreachable = 3, kDenied = 4, kHung = 5, kIncomplete = 6;
constexpr char kDefaultAdmin[] = "unix:/run/gradsync/admin.sock";

const char kUsageText[] =
    "Usage: gradsyncctl [--admin unix:PATH] [--json] [--watch SECONDS] COMMAND [ARGS]\n"
    "\n"
    "Shows and steers what the node's gradsyncd is doing, over its admin service.\n"
    "\n"
    "Commands:\n"
    "  status             version, uptime, backends, devices, the configuration in effect\n"
    "  jobs               every job: state, ranks, sets, operations done and pending, last error\n"
    "  clients            every connected trainer: pid, uid, job, rank, state, idle time\n"
    "  stats [JOB]        operations, bytes, latency quantiles; time waiting for local ranks, for\n"
    "                     other nodes, reducing and in the collective; per bucket; each rank's\n"
    "                     readiness lag behind the first: who is the straggler\n"
    "  inflight [JOB]     operations not finished, which ranks have not submitted them or marked\n"
    "                     which buckets ready, and which other nodes have not reached them (or do\n"
    "                     not answer): who holds a stalled job\n"
    "  trace -o FILE [--last N] [JOB]\n"
    "                     the last N operations of every job (or JOB) as Chrome trace JSON: open\n"
    "                     FILE in https://ui.perfetto.dev (N: at most 256, default all kept)\n"
    "  config get         the settings in effect\n"
    "  config set [--job JOB] NAME=VALUE...\n"
    "                     change settings without a restart: log-level (at once), and for running\n"
    "                     jobs bucket-cap-bytes, timeout-ms, execution-timeout-ms, from an\n"
    "                     operation every node of the job agrees on (privileged)\n"
    "  drain [--timeout SECONDS] [--cancel]\n"
    "                     refuse new jobs and wait up to SECONDS (default 0) for the jobs there are\n"
    "                     to end; --cancel accepts new jobs again (privileged)\n"
    "\n"
    "Options:\n"
    "  --admin ADDR     the daemon's admin service: unix:PATH, or HOST:PORT over mutual TLS (default\n"
    "                   $GRADSYNC_ADMIN, else the admin socket beside $GRADSYNC_SOCKET, else\n"
    "                   unix:/run/gradsync/admin.sock)\n"
    "  --tls-cert FILE, --tls-key FILE, --tls-ca FILE\n"
    "                   for HOST:PORT: this client's certificate and key, and the CA that signed the\n"
    "                   daemon's (default $GRADSYNC_ADMIN_TLS_CERT, _KEY, _CA). The daemon takes the\n"
    "                   certificate's common name as a local user name, or as an administrator's\n"
    "  --tls-server-name NAME  the name the daemon's certificate must carry, when not the host given\n"
    "  --json           print the reply as JSON (for scripts)\n"
    "  --watch SECONDS  repeat every SECONDS until interrupted (jobs, clients, stats, inflight)\n"
    "\n"
    "Privileged commands are for root, gradsyncd's own user and its admin group (--admin-group).\n"
    "\n"
    "Exit status: 0 ok, 1 the daemon answered with an error, 2 bad usage, 3 the daemon is not\n"
    "reachable, 4 access denied, 5 the daemon (or a job's worker, for inflight) did not answer in\n"
    "time: busy or hung, 6 drain: jobs still there at the bound; config set: a job did not take\n"
    "the change.\n";

struct Options {
  std::string admin;
  bool json = false;
  double watch = 0;
  std::string command;
  std::string job;
  std::string output;       // trace -o
  uint32_t last = 0;        // trace --last
  double drain_timeout = 0;  // drain --timeout
  bool cancel = false;       // drain --cancel
  std::vector<std::string> settings;  // config set NAME=VALUE
  // --admin HOST:PORT: mutual TLS with this client's certificate and key and the CA that
  // signed the daemon's.
  std::string tls_cert, tls_key, tls_ca, tls_server_name;
  bool tcp() const { return admin.rfind("unix:", 0) != 0; }
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "gradsyncctl: %s\n\n%s", message.c_str(), kUsageText);
  return kUsage;
}

// Whether something listens at the Unix socket PATH: a connect that succeeds, or that the
// listener's full accept queue turns away for now (EAGAIN).
bool socket_answers(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const bool answers = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 || errno == EAGAIN;
  ::close(fd);
  return answers;
}

// gRPC says "unavailable" for a missing daemon, a socket we may not open, and a daemon that
// closed on us because it does not allow this user; a plain connect tells them apart.
int why_unavailable(const Options& o, const grpc::Status& status) {
  if (o.tcp()) {
    const std::string& text = status.error_message();
    // A daemon that refuses the client certificate closes the connection in the handshake.
    const bool tls = text.find("ssl") != std::string::npos || text.find("SSL") != std::string::npos ||
                     text.find("handshake") != std::string::npos || text.find("certificate") != std::string::npos ||
                     text.find("Socket closed") != std::string::npos;
    std::fprintf(stderr, "gradsyncctl: %s gradsyncd at %s: %s%s\n", tls ? "access denied: TLS with" : "cannot reach",
                 o.admin.c_str(), text.c_str(),
                 tls ? " (does the daemon's --admin-tls-ca sign this --tls-cert, and --tls-ca the daemon's?)"
                     : " (is it running? is --admin or $GRADSYNC_ADMIN right?)");
    return tls ? kDenied : kUnreachable;
  }
  const std::string path = o.admin.substr(5);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int connected = fd < 0 ? -1 : ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  const int error = errno;
  // Connected, yet gRPC failed: either the admin service closed on this user, or the socket is
  // no admin socket at all. Opened as gRPC does, gradsyncd's control socket answers with a
  // frame of its own protocol (a refusal) rather than HTTP/2, and an admin socket that does not
  // allow this user closes without a word.
  std::array<std::byte, 4> first{};
  size_t got = 0;
  bool closed = false;  // the daemon closed it (a refusal); else it stayed silent (busy)
  if (connected == 0) {
    static constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    if (::send(fd, kPreface, sizeof kPreface - 1, MSG_NOSIGNAL) > 0) {
      pollfd readable{fd, POLLIN, 0};
      while (got < first.size() && ::poll(&readable, 1, 1000) == 1) {
        const ssize_t n = ::recv(fd, first.data() + got, first.size() - got, 0);
        if (n <= 0) {
          closed = true;
          break;
        }
        got += static_cast<size_t>(n);
      }
    } else {
      closed = true;
    }
  }
  if (fd >= 0) ::close(fd);
  if (got == first.size() && !gradsync::is_http2_server_start(first)) {
    std::fprintf(stderr,
                 "gradsyncctl: %s is not gradsyncd's admin socket: it does not speak gRPC (gradsyncd's control "
                 "socket, for trainers, answers this way). Its admin socket is unix:%s: pass --admin "
                 "unix:%s, or set $GRADSYNC_SOCKET to the control socket\n",
                 path.c_str(), gradsync::admin_socket_for(path).c_str(), gradsync::admin_socket_for(path).c_str());
    return kUsage;
  }
  if (connected == 0 && got == 0 && !closed) {
    std::fprintf(stderr,
                 "gradsyncctl: gradsyncd at %s accepted the connection but did not answer: busy (a flood of "
                 "connections?) or hung: %s\n",
                 o.admin.c_str(), status.error_message().c_str());
    return kHung;
  }
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

// How long a call may take: 10 s, plus what a drain was told to wait, plus the minute a
// settings change may wait for a job's nodes to agree.
std::chrono::seconds call_bound(const Options& o) {
  return std::chrono::seconds(10) +
         std::chrono::duration_cast<std::chrono::seconds>(std::chrono::duration<double>(o.drain_timeout)) +
         std::chrono::seconds(o.command == "config" ? 60 : 0);
}

// An RPC failure as the operator should read it, and the exit status that goes with it.
int rpc_failed(const grpc::Status& status, const Options& o) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) return why_unavailable(o, status);
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (status.error_message() == "Deadline Exceeded") {  // gRPC's own: no answer at all
        std::fprintf(stderr, "gradsyncctl: gradsyncd at %s did not answer within %lld s (hung?)\n", o.admin.c_str(),
                     static_cast<long long>(call_bound(o).count()));
      } else {  // the daemon's: a thread of it did not answer
        std::fprintf(stderr, "gradsyncctl: gradsyncd at %s: %s\n", o.admin.c_str(), status.error_message().c_str());
      }
      return kHung;
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      std::fprintf(stderr, "gradsyncctl: access denied by gradsyncd at %s: %s\n", o.admin.c_str(),
                   status.error_message().c_str());
      return kDenied;
    default:
      std::fprintf(stderr, "gradsyncctl: gradsyncd at %s: %s\n", o.admin.c_str(), status.error_message().c_str());
      return kDaemonError;
  }
}

std::string json(const google::protobuf::Message& message) { return gradsync::ctl::to_json(message); }

// The exit status a reply itself calls for: inflight with a job whose worker did not answer; a
// drain with jobs left; a settings change a job did not take.
int reply_status(const google::protobuf::Message& reply) {
  if (const auto* inflight = dynamic_cast<const v1::GetInFlightReply*>(&reply)) {
    for (const auto& job : inflight->jobs()) {
      if (job.unavailable().find("did not answer") != std::string::npos) return kHung;
    }
  }
  if (const auto* drain = dynamic_cast<const v1::DrainReply*>(&reply)) {
    if (drain->draining() && !drain->jobs_left().empty()) return kIncomplete;
  }
  if (const auto* change = dynamic_cast<const v1::SetConfigReply*>(&reply)) {
    for (const auto& job : change->jobs()) {
      if (!job.error().empty()) return kIncomplete;
    }
  }
  return kOk;
}

// config set's NAME=VALUE arguments as a request; an error names the bad argument.
std::string parse_settings(const Options& o, v1::SetConfigRequest* request) {
  request->set_job(o.job);
  for (const std::string& arg : o.settings) {
    const auto eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) return "'" + arg + "' is not NAME=VALUE";
    const std::string name = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (name == "log-level") {
      request->set_log_level(value);
      continue;
    }
    char* end = nullptr;
    errno = 0;
    const unsigned long long number = std::strtoull(value.c_str(), &end, 10);
    const bool numeric = !value.empty() && value[0] != '-' && end && *end == 0 && errno == 0;
    if (name == "bucket-cap-bytes" || name == "timeout-ms" || name == "execution-timeout-ms") {
      if (!numeric) return name + " needs a non-negative integer, not '" + value + "'";
      if (name == "bucket-cap-bytes") request->set_bucket_cap_bytes(number);
      if (name == "timeout-ms") request->set_timeout_ms(number);
      if (name == "execution-timeout-ms") request->set_execution_timeout_ms(number);
      continue;
    }
    return "unknown setting '" + name + "' (log-level, bucket-cap-bytes, timeout-ms, execution-timeout-ms)";
  }
  return {};
}

// A PEM file's text; false (after saying why) when it cannot be read.
bool read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    std::fprintf(stderr, "gradsyncctl: cannot read %s\n", path.c_str());
    return false;
  }
  *out = text.str();
  return true;
}

template <class Reply, class Call>
int run_call(const Options& o, Call call, std::string (*print)(const Reply&)) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(256 << 20);  // a trace of many jobs is tens of MiB
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (o.tcp()) {
    grpc::SslCredentialsOptions ssl;
    if (!read_file(o.tls_ca, &ssl.pem_root_certs) || !read_file(o.tls_key, &ssl.pem_private_key) ||
        !read_file(o.tls_cert, &ssl.pem_cert_chain)) {
      return kUsage;
    }
    credentials = grpc::SslCredentials(ssl);
    if (!o.tls_server_name.empty()) arguments.SetSslTargetNameOverride(o.tls_server_name);
  }
  auto channel = grpc::CreateCustomChannel(o.admin, credentials, arguments);
  auto stub = v1::Admin::NewStub(channel);
  int unavailable = 0;
  for (;;) {
    grpc::ClientContext context;
    Reply reply;
    context.set_deadline(std::chrono::system_clock::now() + call_bound(o));
    const grpc::Status status = call(*stub, &context, &reply);
    // A busy daemon's accept queue can refuse a connect for a moment (a flood of connections
    // it is closing): try again a few times before calling it unreachable or denied.
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !o.tcp() && socket_answers(o.admin.substr(5)) &&
        ++unavailable < 8) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(250 * unavailable, 1000)));
      continue;
    }
    if (!status.ok()) return rpc_failed(status, o);
    unavailable = 0;
    // A fresh screen per round on a terminal; into a pipe or a file, rounds follow each other.
    if (o.watch > 0 && !o.json && ::isatty(STDOUT_FILENO)) std::printf("\033[H\033[2J");
    if (!o.output.empty()) {
      // trace -o FILE: the JSON goes to the file, the summary to stdout.
      const v1::DumpTraceReply* trace = nullptr;
      if constexpr (std::is_same_v<Reply, v1::DumpTraceReply>) trace = &reply;
      std::ofstream file(o.output, std::ios::binary | std::ios::trunc);
      if (trace) file << trace->chrome_trace_json();
      if (!file.flush()) {
        std::fprintf(stderr, "gradsyncctl: cannot write %s: %s\n", o.output.c_str(), std::strerror(errno));
        return kDaemonError;
      }
      if (!o.json) {
        std::string summary = print(reply);
        summary.pop_back();  // its newline
        std::printf("%s written to %s (open it in https://ui.perfetto.dev)\n", summary.c_str(), o.output.c_str());
        return kOk;
      }
      std::printf("{\n  \"operations\": %u,\n  \"file\": \"%s\"\n}\n", trace ? trace->operations() : 0u,
                  o.output.c_str());
      return kOk;
    }
    std::fputs((o.json ? json(reply) + "\n" : print(reply)).c_str(), stdout);
    std::fflush(stdout);
    if (o.watch <= 0) return reply_status(reply);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.watch));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value && *value ? value : "");
  };
  // $GRADSYNC_ADMIN, else the admin socket beside the trainers' $GRADSYNC_SOCKET, else the
  // system daemon's.
  o.admin = !env("GRADSYNC_ADMIN").empty()  ? env("GRADSYNC_ADMIN")
            : !env("GRADSYNC_SOCKET").empty() ? "unix:" + gradsync::admin_socket_for(env("GRADSYNC_SOCKET"))
                                              : kDefaultAdmin;
  o.tls_cert = env("GRADSYNC_ADMIN_TLS_CERT");
  o.tls_key = env("GRADSYNC_ADMIN_TLS_KEY");
  o.tls_ca = env("GRADSYNC_ADMIN_TLS_CA");
  std::vector<std::string> positional;
  bool last_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsageText, stdout);
      return kOk;
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--cancel") {
      o.cancel = true;
    } else if (arg == "--admin" || arg == "--watch" || arg == "--job" || arg == "-o" || arg == "--last" ||
               arg == "--timeout" || arg == "--tls-cert" || arg == "--tls-key" || arg == "--tls-ca" ||
               arg == "--tls-server-name") {
      if (i + 1 >= argc) return usage_error(arg + " needs a value");
      const std::string value = argv[++i];
      char* end = nullptr;
      if (arg == "--admin") {
        o.admin = value;
      } else if (arg == "--tls-cert") {
        o.tls_cert = value;
      } else if (arg == "--tls-key") {
        o.tls_key = value;
      } else if (arg == "--tls-ca") {
        o.tls_ca = value;
      } else if (arg == "--tls-server-name") {
        o.tls_server_name = value;
      } else if (arg == "--job") {
        o.job = value;
      } else if (arg == "-o") {
        o.output = value;
      } else if (arg == "--last") {
        const unsigned long n = std::strtoul(value.c_str(), &end, 10);
        if (value.empty() || value[0] == '-' || !end || *end || n == 0 || n > 256) {
          return usage_error("--last needs a number of operations from 1 to 256, not '" + value + "'");
        }
        o.last = static_cast<uint32_t>(n);
        last_given = true;
      } else if (arg == "--timeout") {
        o.drain_timeout = std::strtod(value.c_str(), &end);
        if (!end || *end || !(o.drain_timeout >= 0) || o.drain_timeout > 3600) {
          return usage_error("--timeout needs a number of seconds from 0 to 3600, not '" + value + "'");
        }
      } else {
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
  static const char* kCommands[] = {"status", "jobs", "clients", "stats", "inflight", "trace", "config", "drain"};
  if (std::find(std::begin(kCommands), std::end(kCommands), o.command) == std::end(kCommands)) {
    return usage_error("unknown command '" + o.command + "'");
  }
  if (o.admin == "unix:") return usage_error("--admin must be unix:PATH or HOST:PORT, not 'unix:'");
  if (gradsync::HostPort tcp; o.tcp()) {
    if (std::string why; !gradsync::parse_host_port(o.admin, &tcp, &why)) {
      return usage_error("--admin must be unix:PATH or HOST:PORT, not '" + o.admin + "': " + why);
    }
  }
  if (o.tcp() && (o.tls_cert.empty() || o.tls_key.empty() || o.tls_ca.empty())) {
    return usage_error("--admin " + o.admin + " is TCP, which needs mutual TLS: give --tls-cert, --tls-key and --tls-ca");
  }
  const bool watchable = o.command == "jobs" || o.command == "clients" || o.command == "stats" || o.command == "inflight";
  if (o.watch > 0 && !watchable) return usage_error("--watch applies to jobs, clients, stats and inflight");
  if (!o.output.empty() && o.command != "trace") return usage_error("-o applies to trace");
  if (last_given && o.command != "trace") return usage_error("--last applies to trace");
  if ((o.cancel || o.drain_timeout > 0) && o.command != "drain") return usage_error("--timeout and --cancel apply to drain");
  if (!o.job.empty() && o.command != "config") return usage_error("--job applies to config set (other commands take JOB as an argument)");
  const bool takes_job = o.command == "inflight" || o.command == "stats" || o.command == "trace";
  if (o.command == "config") {
    if (positional.size() < 2 || (positional[1] != "get" && positional[1] != "set")) {
      return usage_error("config needs get or set");
    }
    if (positional[1] == "get") {
      if (positional.size() > 2 || !o.job.empty()) return usage_error("config get takes no arguments");
      return run_call<v1::GetStatusReply>(
          o, [](v1::Admin::Stub& s, grpc::ClientContext* c, v1::GetStatusReply* r) { return s.GetStatus(c, {}, r); },
          print_config);
    }
    o.settings.assign(positional.begin() + 2, positional.end());
    if (o.settings.empty()) return usage_error("config set needs NAME=VALUE");
    v1::SetConfigRequest request;
    if (std::string bad = parse_settings(o, &request); !bad.empty()) return usage_error(bad);
    return run_call<v1::SetConfigReply>(
        o,
        [request](v1::Admin::Stub& s, grpc::ClientContext* c, v1::SetConfigReply* r) { return s.SetConfig(c, request, r); },
        print_config_change);
  }
  if (positional.size() > (takes_job ? 2u : 1u)) return usage_error("too many arguments for " + o.command);
  if (takes_job && positional.size() == 2) o.job = positional[1];
  if (o.command == "status") {
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
    v1::GetStatsRequest request;
    request.set_job(o.job);
    return run_call<v1::GetStatsReply>(
        o, [request](v1::Admin::Stub& s, grpc::ClientContext* c, v1::GetStatsReply* r) { return s.GetStats(c, request, r); },
        print_stats);
  }
  if (o.command == "inflight") {
    v1::GetInFlightRequest request;
    request.set_job(o.job);
    return run_call<v1::GetInFlightReply>(
        o,
        [request](v1::Admin::Stub& s, grpc::ClientContext* c, v1::GetInFlightReply* r) { return s.GetInFlight(c, request, r); },
        print_inflight);
  }
  if (o.command == "trace") {
    if (o.output.empty()) return usage_error("trace needs -o FILE");
    v1::DumpTraceRequest request;
    request.set_job(o.job);
    request.set_operations(o.last);
    return run_call<v1::DumpTraceReply>(
        o, [request](v1::Admin::Stub& s, grpc::ClientContext* c, v1::DumpTraceReply* r) { return s.DumpTrace(c, request, r); },
        print_trace);
  }
  if (o.command == "drain") {
    v1::DrainRequest request;
    request.set_timeout_ms(static_cast<uint32_t>(o.drain_timeout * 1000));
    request.set_cancel(o.cancel);
    return run_call<v1::DrainReply>(
        o, [request](v1::Admin::Stub& s, grpc::ClientContext* c, v1::DrainReply* r) { return s.Drain(c, request, r); },
        print_drain);
  }
  return usage_error("unknown command '" + o.command + "'");
}
