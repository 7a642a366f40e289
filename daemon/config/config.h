// gradsyncd's configuration: parsed once, from flags and an optional config file, into one
// struct that the Daemon passes down. Nothing below main() reads flags or the environment.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "daemon/util/local_limits.h"
#include "daemon/engine/host_engine.h"
#include "daemon/rendezvous/etcd_settings.h"
#include "daemon/util/log.h"

namespace gradsync {

struct DaemonConfig {
  std::string socket_path = "/run/gradsync/gradsync.sock";
  // The admin service: "unix:PATH", or "none". Empty: beside the control socket
  // (/run/gradsync/admin.sock for the default socket; "<socket>.admin" for another).
  std::string admin_address;
  // The admin service over TCP as well, HOST:PORT; empty: not. It requires mutual TLS: the
  // daemon's certificate and key, and the CA that signs its callers' certificates. A caller
  // is the local user its certificate's common name names, or privileged when that name is in
  // admin_tls_admin_cns.
  std::string admin_tcp;
  std::string admin_tls_cert, admin_tls_key, admin_tls_ca;
  std::vector<std::string> admin_tls_admin_cns;
  // Members of this group may make the admin service's mutating calls (SetConfig, Drain) and
  // see every user's jobs, like root and the daemon's own user. Empty: nobody else.
  std::string admin_group;
  // Prometheus /metrics over HTTP on HOST:PORT; empty (the default): off.
  std::string metrics_address;
  // Bound for every wait of a job (registration barrier, a step's stragglers) unless the job
  // asks for its own, which is capped at max_timeout.
  std::chrono::milliseconds default_timeout{30'000};
  std::chrono::milliseconds max_timeout{600'000};
  // Bound on one bucket in flight (local reduce, the collective across nodes, fan-out), apart
  // from the waiting the job timeout bounds. The default matches PyTorch's NCCL watchdog.
  std::chrono::milliseconds execution_timeout{600'000};
  // SIGTERM: how long operations already submitted may take to finish before every job is
  // failed with "gradsyncd is shutting down".
  std::chrono::milliseconds drain_timeout{2'000};
  // A control connection is closed when a request frame it began stays incomplete this long,
  // or when it has not joined a job this long after its last request.
  std::chrono::milliseconds connection_timeout{60'000};
  size_t reduce_threads = 0;  // 0: one per hardware thread
  // What one local user, client or job may hold (--max-*; local_limits.h).
  LocalLimits limits;
  LogLevel log_level = LogLevel::kInfo;
  // Users whose processes may connect, checked with SO_PEERCRED. Empty: the daemon's own user
  // and root.
  std::vector<uid_t> allowed_uids;
  // Users whose processes may register device memory from other allocators as legacy CUDA IPC
  // handles. Empty (the default): nobody; such a handle is not proof of ownership, so this is
  // for nodes whose trainers' users trust each other.
  std::vector<uid_t> legacy_ipc_uids;
  // How long idle NCCL communicators of an ended job are kept for restarted trainers re-joining
  // it with the same layout (nccl/park.h); 0: never.
  std::chrono::seconds nccl_keep_idle{300};

  // The peer service (daemon-to-daemon rendezvous, gRPC). Port 0 picks a free port. Without
  // authentication (peer_auth.h) it may listen on loopback only, and that is the default then;
  // with it, the default is every interface.
  std::string peer_listen;
  std::string peer_token_file;
  // How long the peer store keeps a job's keys that nobody touches (a job whose nodes never all
  // ended).
  std::chrono::seconds peer_key_ttl{24 * 3600};
  std::string peer_tls_cert, peer_tls_key, peer_tls_ca;
  // The host other daemons reach this one at; empty: the listen host, or this machine's
  // hostname when listening on every interface.
  std::string peer_advertise_host;
  // etcd, for jobs whose rendezvous is "etcd://..." (rendezvous/etcd_settings.h).
  EtcdSettings etcd;
  // Gloo, the engine across nodes.
  std::string gloo_transport = "tcp";  // tcp or ibverbs
  std::string gloo_iface;              // tcp: bind this interface instead of the advertised host
  std::string gloo_ib_device;          // ibverbs: device name
  int gloo_ib_port = 1;
  int gloo_ib_index = 0;
  // An allreduce larger than this crosses nodes in Gloo calls of this size (engine.h).
  uint64_t gloo_slice_bytes = kDefaultSliceBytes;
  uint64_t integrity_check_every = 0;  // 0: off
};

inline constexpr int kDefaultPeerPort = 29590;
inline constexpr uint64_t kMinSliceBytes = 4096;
inline constexpr uint64_t kMaxSliceBytes = 1ull << 40;

// Outcome of parsing: either a config, or text to print and an exit code (--help, --version,
// or an error naming the bad option).
struct ParsedConfig {
  std::optional<DaemonConfig> config;
  std::string message;
  int exit_code = 0;
};

ParsedConfig parse_daemon_config(int argc, const char* const* argv);

}  // namespace gradsync
