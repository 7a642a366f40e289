#include "daemon/config/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "daemon/config/config_file.h"
#include "daemon/util/safe_text.h"
#include "shared/host_port.h"
#include "shared/socket_names.h"
#include "shared/version.h"

namespace gradsync {
namespace {

// A uid, given as a number or as a user name.
std::optional<uid_t> uid_of(const std::string& name) {
  if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos && name.size() <= 10) {
    const unsigned long value = std::stoul(name);
    if (value <= std::numeric_limits<uid_t>::max()) return static_cast<uid_t>(value);
    return std::nullopt;
  }
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
    return std::nullopt;
  }
  return found->pw_uid;
}

}  // namespace

namespace po = boost::program_options;

ParsedConfig parse_daemon_config(int argc, const char* const* argv) {
  DaemonConfig config;
  std::string log_level = "info";
  std::string config_file;
  uint64_t timeout_ms = config.default_timeout.count();
  uint64_t max_timeout_ms = config.max_timeout.count();
  uint64_t execution_timeout_ms = config.execution_timeout.count();
  uint64_t nccl_keep_s = config.nccl_keep_idle.count();
  uint64_t drain_timeout_ms = config.drain_timeout.count();
  uint64_t peer_key_ttl_s = config.peer_key_ttl.count();
  uint64_t connection_timeout_ms = config.connection_timeout.count();
  std::vector<std::string> allowed;
  std::vector<std::string> legacy;
  std::vector<std::string> admin;

  po::options_description general("Options");
  general.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("config", po::value(&config_file),
       "read settings from this TOML file (keys are the flags' names, e.g. timeout-ms = 30000, "
       "allow-uid = [1000, 1001]); flags given here win over it");
  po::options_description settings("Settings (flags or config file)");
  settings.add_options()
      ("socket", po::value(&config.socket_path)->default_value(config.socket_path),
       "Unix control socket that trainers connect to")
      ("admin", po::value(&admin)->composing(),
       "admin service (gradsyncctl): unix:PATH, none, or HOST:PORT for TCP with mutual TLS as well "
       "(repeatable; default: beside the control socket, /run/gradsync/admin.sock for the default "
       "socket, SOCKET.admin for another)")
      ("admin-tls-cert", po::value(&config.admin_tls_cert), "TCP admin: this daemon's certificate (PEM)")
      ("admin-tls-key", po::value(&config.admin_tls_key), "TCP admin: its private key (PEM)")
      ("admin-tls-ca", po::value(&config.admin_tls_ca),
       "TCP admin: the CA certificate (PEM) that callers' certificates must be signed by; every caller "
       "must present one")
      ("admin-tls-admin-cn", po::value(&config.admin_tls_admin_cns)->composing(),
       "TCP admin: a certificate common name that may make mutating calls and see every job "
       "(repeatable); other callers are the local user their common name names")
      ("admin-group", po::value(&config.admin_group),
       "group whose members may change settings (gradsyncctl config set) and drain the daemon, and "
       "see every user's jobs; root and the daemon's own user always may (default: no group)")
      ("metrics", po::value(&config.metrics_address),
       "serve Prometheus metrics at http://HOST:PORT/metrics (default: off); every job's series are "
       "visible to whoever reaches it")
      ("timeout-ms", po::value(&timeout_ms)->default_value(timeout_ms),
       "default bound on every wait of a job, in milliseconds (a job may ask for its own)")
      ("max-timeout-ms", po::value(&max_timeout_ms)->default_value(max_timeout_ms),
       "largest timeout a job may ask for, in milliseconds")
      ("execution-timeout-ms", po::value(&execution_timeout_ms)->default_value(execution_timeout_ms),
       "bound on executing one bucket (a hang, not a slow rank or peer), in milliseconds")
      ("drain-timeout-ms", po::value(&drain_timeout_ms)->default_value(drain_timeout_ms),
       "at SIGTERM, how long operations already submitted may take to finish before the jobs are "
       "failed and gradsyncd exits, in milliseconds (joins are refused meanwhile)")
      ("connection-timeout-ms", po::value(&connection_timeout_ms)->default_value(connection_timeout_ms),
       "close a control connection whose request frame stays incomplete this long, or that has not "
       "joined a job this long after its last request, in milliseconds (joined trainers are never "
       "timed out)")
      ("max-connections-per-user", po::value(&config.limits.connections_per_user)->default_value(config.limits.connections_per_user),
       "control connections one user may hold open (each is a descriptor of the daemon's)")
      ("max-jobs-per-user", po::value(&config.limits.jobs_per_user)->default_value(config.limits.jobs_per_user),
       "jobs one user may run in this daemon at once")
      ("max-jobs", po::value(&config.limits.jobs)->default_value(config.limits.jobs),
       "jobs this daemon runs at once, of all users (each has a worker thread, two across nodes)")
      ("max-pending-registrations-per-user",
       po::value(&config.limits.pending_registrations_per_user)->default_value(config.limits.pending_registrations_per_user),
       "tensor-set registrations one user may have waiting for their barrier at once")
      ("max-segments-per-client", po::value(&config.limits.segments_per_client)->default_value(config.limits.segments_per_client),
       "memory segments one client may announce (each is a mapping in the daemon; see vm.max_map_count)")
      ("max-segments-per-user", po::value(&config.limits.segments_per_user)->default_value(config.limits.segments_per_user),
       "memory segments all of one user's clients may hold (keep users x this below vm.max_map_count)")
      ("max-tensors-per-client", po::value(&config.limits.tensors_per_client)->default_value(config.limits.tensors_per_client),
       "tensors one client may register, over all its sets")
      ("max-segment-bytes", po::value(&config.limits.segment_bytes)->default_value(0),
       "largest memory segment a client may announce, in bytes; 0: the machine's physical memory")
      ("max-bytes-per-user", po::value(&config.limits.bytes_per_user)->default_value(0),
       "bytes one user's segments may map into the daemon, with its registrations being checked (64 "
       "bytes a tensor); 0: the machine's physical memory")
      ("max-bytes", po::value(&config.limits.bytes_total)->default_value(0),
       "the same, all users together; 0: twice the physical memory, at most 64 TiB (half the address "
       "space)")
      ("max-local-world-size", po::value(&config.limits.local_world_size)->default_value(config.limits.local_world_size),
       "largest local world size (ranks on this node) a job may declare, at most 1024")
      ("reduce-threads", po::value(&config.reduce_threads)->default_value(0),
       "threads that reduce buckets, shared by all jobs; 0 means one per CPU")
      ("allow-uid", po::value(&allowed)->composing(),
       "user allowed to connect, by uid or user name (repeatable); default: the daemon's own user and root")
      ("legacy-ipc-uid", po::value(&legacy)->composing(),
       "user id whose trainers may register GPU memory from other allocators (PyTorch's caching "
       "allocator) as legacy CUDA IPC handles (repeatable); default: nobody. A handle is not proof "
       "of ownership: trust only users who trust each other")
      ("nccl-keep-idle-s", po::value(&nccl_keep_s)->default_value(nccl_keep_s),
       "seconds to keep a job's idle NCCL communicators after the job ends, so that restarted "
       "trainers re-joining it with the same layout reuse them instead of creating new ones; 0: never")
      ("log-level", po::value(&log_level)->default_value(log_level), "debug, info, warning or error")
      ("peer-listen", po::value(&config.peer_listen),
       "HOST:PORT of the peer service other daemons rendezvous through (port 0: any free port; "
       "default 0.0.0.0:29590 with a token or TLS, else 127.0.0.1:29590: unauthenticated, it may "
       "listen on loopback only)")
      ("peer-token-file", po::value(&config.peer_token_file),
       "file holding the cluster token (the same on every node, mode 0600; make one with "
       "openssl rand -hex 32): it never travels; every peer call carries a proof made with it (an HMAC "
       "of the call, its time and a nonce, bound to the daemon called)")
      ("peer-key-ttl-s", po::value(&peer_key_ttl_s)->default_value(peer_key_ttl_s),
       "seconds the peer store keeps the keys of a job nobody touches (a job's keys are deleted when "
       "every node ended it; this covers a node that never did)")
      ("peer-tls-cert", po::value(&config.peer_tls_cert), "peer service: this daemon's certificate (PEM)")
      ("peer-tls-key", po::value(&config.peer_tls_key), "peer service: its private key (PEM)")
      ("peer-tls-ca", po::value(&config.peer_tls_ca),
       "peer service: the cluster's CA certificate (PEM); peers must present certificates it signed")
      ("peer-advertise", po::value(&config.peer_advertise_host),
       "host other daemons reach this one at (default: the listen host, or the hostname)")
      ("gloo-transport", po::value(&config.gloo_transport)->default_value(config.gloo_transport),
       "engine transport across nodes: tcp or ibverbs")
      ("gloo-iface", po::value(&config.gloo_iface), "tcp: network interface for Gloo (default: the advertised host)")
      ("gloo-ib-device", po::value(&config.gloo_ib_device), "ibverbs: device name, e.g. mlx5_0")
      ("gloo-ib-port", po::value(&config.gloo_ib_port)->default_value(1), "ibverbs: port")
      ("gloo-ib-index", po::value(&config.gloo_ib_index)->default_value(0), "ibverbs: GID index")
      ("gloo-slice-bytes", po::value(&config.gloo_slice_bytes)->default_value(config.gloo_slice_bytes),
       "an allreduce larger than this crosses nodes as Gloo calls of this size, each overlapped with the "
       "local reduction of the next; smaller overlaps more, but each call has a fixed cost (4096 to 2^40)");

  po::options_description all;
  all.add(general).add(settings);

  std::ostringstream usage;
  usage << "Usage: gradsyncd [options]\n\n"
        << "gradsyncd reduces the gradients of the trainers on this node. Trainers connect to its\n"
        << "control socket, register shared-memory tensors once, and signal each step through\n"
        << "shared-memory rings.\n\n"
        << all;

  ParsedConfig result;
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, all), vm);
    if (vm.count("config")) {
      std::vector<FileSetting> file;
      if (Status s = read_config_file(vm["config"].as<std::string>(), &file); !s.ok()) {
        result.message = "gradsyncd: " + s.message();
        result.exit_code = 2;
        return result;
      }
      std::map<std::string, std::string> seen;  // setting -> where the file first sets it
      for (const FileSetting& setting : file) {
        const auto file_error = [&](const std::string& why) {
          result.message = "gradsyncd: config file " + setting.where + ": " + why;
          result.exit_code = 2;
          return result;
        };
        if (!settings.find_nothrow(setting.name, false)) {
          return file_error("unknown setting '" + setting.name + "' (gradsyncd --help lists them)");
        }
        if (auto [first, fresh] = seen.emplace(setting.name, setting.where); !fresh) {
          return file_error(setting.name + " is set twice: here and at " + first->second +
                            " (an underscore stands for a dash: timeout_ms is timeout-ms)");
        }
        // A flag given on the command line wins over the file, repeatable ones too: their
        // values would otherwise be merged, and a list such as allow-uid could only grow.
        if (vm.count(setting.name) && !vm[setting.name].defaulted()) continue;
        po::option option(setting.name, setting.values);
        option.original_tokens = {setting.where};
        // One at a time, so that a value the flag cannot take is reported at its line.
        po::parsed_options one(&settings);
        one.options.push_back(std::move(option));
        try {
          po::store(one, vm);
        } catch (const po::error& e) {
          return file_error(e.what());
        }
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    result.message = std::string("gradsyncd: ") + e.what() + "\nTry 'gradsyncd --help'.";
    result.exit_code = 2;
    return result;
  }
  if (vm.count("help")) {
    result.message = usage.str();
    return result;
  }
  if (vm.count("version")) {
    result.message = std::string("gradsyncd ") + kGradsyncVersion + " (protocol " +
                     std::to_string(kProtocolVersion) + ")";
    return result;
  }
  auto fail = [&](const std::string& why) {
    result.message = "gradsyncd: " + why + "\nTry 'gradsyncd --help'.";
    result.exit_code = 2;
    return result;
  };
  std::string why;  // what parse_host_port found wrong
  if (!parse_log_level(log_level, &config.log_level)) {
    return fail("--log-level must be debug, info, warning or error, not '" + log_level + "'");
  }
  if (config.socket_path.empty()) return fail("--socket must not be empty");
  for (const std::string& a : admin) {
    if (a == "none" || a.rfind("unix:", 0) == 0) {
      if (!config.admin_address.empty() && config.admin_address != a) {
        return fail("--admin names two Unix sockets (or one and none): '" + config.admin_address + "' and '" + a + "'");
      }
      config.admin_address = a;
    } else {
      // HOST:PORT, [IPv6]:PORT: no other gRPC address scheme (unix-abstract:, vsock:, ipv4:),
      // which would skip the socket checks or TLS.
      if (HostPort tcp; !parse_host_port(a, &tcp, &why)) {
        return fail("--admin must be unix:PATH, none or HOST:PORT, not '" + a + "': " + why);
      }
      if (!config.admin_tcp.empty()) return fail("--admin names two TCP addresses: '" + config.admin_tcp + "' and '" + a + "'");
      config.admin_tcp = a;
    }
  }
  if (config.admin_address.empty()) config.admin_address = "unix:" + admin_socket_for(config.socket_path);
  if (!config.admin_tcp.empty() &&
      (config.admin_tls_cert.empty() || config.admin_tls_key.empty() || config.admin_tls_ca.empty())) {
    return fail("--admin " + config.admin_tcp +
                " (TCP) requires mutual TLS: give --admin-tls-cert, --admin-tls-key and --admin-tls-ca");
  }
  if (config.admin_tcp.empty() && (!config.admin_tls_cert.empty() || !config.admin_tls_key.empty() ||
                                   !config.admin_tls_ca.empty() || !config.admin_tls_admin_cns.empty())) {
    return fail("--admin-tls-* apply to the admin service over TCP: give --admin HOST:PORT too");
  }
  // Bounds are at most a day: larger values (or "-1", which the parser wraps to 2^64 - 1)
  // would overflow the deadlines computed from them.
  constexpr uint64_t kDayMs = 86'400'000;
  for (const auto& [name, value] : {std::pair<const char*, uint64_t>{"--timeout-ms", timeout_ms},
                                    {"--max-timeout-ms", max_timeout_ms},
                                    {"--execution-timeout-ms", execution_timeout_ms}}) {
    if (value > kDayMs) return fail(std::string(name) + " must be at most 86400000 (a day), not " + std::to_string(value));
  }
  if (timeout_ms == 0) return fail("--timeout-ms must be positive");
  if (max_timeout_ms < timeout_ms) return fail("--max-timeout-ms must be at least --timeout-ms");
  config.default_timeout = std::chrono::milliseconds(timeout_ms);
  config.max_timeout = std::chrono::milliseconds(max_timeout_ms);
  if (execution_timeout_ms == 0) return fail("--execution-timeout-ms must be positive");
  config.execution_timeout = std::chrono::milliseconds(execution_timeout_ms);
  if (drain_timeout_ms > 600'000) return fail("--drain-timeout-ms must be at most 600000");
  if (connection_timeout_ms < 100 || connection_timeout_ms > 86'400'000) {
    return fail("--connection-timeout-ms must be from 100 to 86400000");
  }
  config.connection_timeout = std::chrono::milliseconds(connection_timeout_ms);
  config.drain_timeout = std::chrono::milliseconds(drain_timeout_ms);
  {
    const LocalLimits& l = config.limits;
    for (const auto& [name, value] : {std::pair<const char*, uint64_t>{"--max-connections-per-user", l.connections_per_user},
                                      {"--max-jobs-per-user", l.jobs_per_user},
                                      {"--max-jobs", l.jobs},
                                      {"--max-pending-registrations-per-user", l.pending_registrations_per_user},
                                      {"--max-segments-per-client", l.segments_per_client},
                                      {"--max-segments-per-user", l.segments_per_user},
                                      {"--max-tensors-per-client", l.tensors_per_client},
                                      {"--max-local-world-size", l.local_world_size}}) {
      if (value == 0) return fail(std::string(name) + " must be positive");
    }
    if (l.local_world_size > 1024) return fail("--max-local-world-size must be at most 1024");
    if (l.jobs > 4096) return fail("--max-jobs must be at most 4096 (each job has a thread)");
    if (l.connections_per_user > 65536) return fail("--max-connections-per-user must be at most 65536");
  }
  if (config.reduce_threads == 0) config.reduce_threads = std::max(1u, std::thread::hardware_concurrency());
  if (config.reduce_threads > 256) return fail("--reduce-threads must be at most 256");
  for (const auto& [flag, names, uids] : {std::tuple{"--allow-uid", &allowed, &config.allowed_uids},
                                          std::tuple{"--legacy-ipc-uid", &legacy, &config.legacy_ipc_uids}}) {
    uids->clear();
    for (const std::string& name : *names) {
      const std::optional<uid_t> uid = uid_of(name);
      if (!uid) {
        return fail(std::string(flag) + ": '" + name + "' is neither a uid nor a user on this machine (give a number, "
                    "or a user name that `id -u NAME` knows)");
      }
      uids->push_back(*uid);
    }
  }
  if (HostPort metrics; !config.metrics_address.empty() && !parse_host_port(config.metrics_address, &metrics, &why)) {
    return fail("--metrics must be HOST:PORT (for example 127.0.0.1:9464, or 0.0.0.0:9464 for every interface), not '" +
                config.metrics_address + "': " + why);
  }
  if (nccl_keep_s > 86'400) return fail("--nccl-keep-idle-s must be at most 86400 (a day)");
  if (peer_key_ttl_s == 0 || peer_key_ttl_s > 30 * 86'400) return fail("--peer-key-ttl-s must be from 1 to 2592000 (30 days)");
  config.peer_key_ttl = std::chrono::seconds(peer_key_ttl_s);
  config.nccl_keep_idle = std::chrono::seconds(nccl_keep_s);
  // Other nodes read it from this node's formation record (node_record.h): one printable word.
  const std::string& advertise = config.peer_advertise_host;
  if (advertise.size() > 255 ||
      std::any_of(advertise.begin(), advertise.end(), [](char c) { return c <= ' ' || c >= 0x7f; })) {
    return fail("--peer-advertise must be a host name or address (printable ASCII, no spaces, at most 255 "
                "bytes), not '" + safe_text(advertise, 64) + "'");
  }
  const bool peer_auth = !config.peer_token_file.empty() || !config.peer_tls_ca.empty();
  if (config.peer_listen.empty()) config.peer_listen = peer_auth ? "0.0.0.0:29590" : "127.0.0.1:29590";
  HostPort listen;
  if (!parse_host_port(config.peer_listen, &listen, &why)) {
    return fail("--peer-listen must be HOST:PORT, not '" + config.peer_listen + "': " + why);
  }
  if (!peer_auth) {
    // An address, not a name (which could resolve anywhere): 127.0.0.0/8 or ::1.
    if (listen.host == "localhost" && !listen.bracketed) {
      listen.host = "127.0.0.1";
      config.peer_listen = listen.text();
    }
    in_addr v4{};
    in6_addr v6{};
    const bool loopback =
        (!listen.bracketed && ::inet_pton(AF_INET, listen.host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) ||
        (listen.bracketed && ::inet_pton(AF_INET6, listen.host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6));
    if (!loopback) {
      return fail("--peer-listen " + config.peer_listen +
                  ": the peer service is not authenticated, so it may listen on loopback only; for other "
                  "nodes to reach it give --peer-token-file FILE (the same token on every node) or "
                  "--peer-tls-cert, --peer-tls-key and --peer-tls-ca");
    }
  }
  if (config.gloo_transport != "tcp" && config.gloo_transport != "ibverbs") {
    return fail("--gloo-transport must be tcp or ibverbs, not '" + config.gloo_transport + "'");
  }
  if (config.gloo_transport == "ibverbs" && config.gloo_ib_device.empty()) {
    return fail("--gloo-transport ibverbs needs --gloo-ib-device");
  }
  if (config.gloo_slice_bytes < kMinSliceBytes || config.gloo_slice_bytes > kMaxSliceBytes) {
    return fail("--gloo-slice-bytes must be between " + std::to_string(kMinSliceBytes) + " and " +
                std::to_string(kMaxSliceBytes) + ", not " + std::to_string(config.gloo_slice_bytes));
  }
  result.config = config;
  return result;
}

}  // namespace gradsync
