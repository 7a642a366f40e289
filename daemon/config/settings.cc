// The declarations of gradsyncd's settings (setting.h). Each one is here once: its name, its
// help, when it applies, its field and its bounds. Rules that join two settings (a TCP admin
// address needs its TLS files, an unauthenticated peer service listens on loopback only) are
// parse_daemon_config's, after every setting was read.
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <limits>
#include <optional>
#include <type_traits>

#include "daemon/config/setting.h"
#include "daemon/util/safe_text.h"
#include "shared/host_port.h"

namespace gradsync {
namespace {

// A field of DaemonConfig, for a const or a mutable config alike.
#define GS_FIELD(member) [](auto& c) -> auto& { return c.member; }

// Reads a non-negative integer: digits only ("-1", "+1", " 1" and "1k" are refused, where a
// stream would wrap "-1" to 2^64 - 1).
std::optional<uint64_t> read_integer(const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  if (text.empty() || text[0] < '0' || text[0] > '9') return std::nullopt;
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

// A uid, given as a number or as a user name.
std::optional<uid_t> uid_of(const std::string& name) {
  if (std::optional<uint64_t> number = read_integer(name)) {
    if (*number <= std::numeric_limits<uid_t>::max()) return static_cast<uid_t>(*number);
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

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

// What every kind of setting of one field shares: the name, the help, when it applies, the copy.
template <class Field>
SettingSpec declare(std::string name, Field field, Reload reload, std::string help) {
  SettingSpec spec;
  spec.name = std::move(name);
  spec.help = std::move(help);
  spec.reload = reload;
  spec.copy = [field](const DaemonConfig& from, DaemonConfig* to) { field(*to) = field(from); };
  return spec;
}

// `show` from `text`: the text, or `when_empty` for an empty one.
void show_text(SettingSpec* spec, std::string when_empty) {
  spec->show = [text = spec->text, when_empty = std::move(when_empty)](const DaemonConfig& c) {
    std::string shown = text(c);
    return shown.empty() ? when_empty : shown;
  };
}

// One value of a setting that is not repeatable (TOML could give an array).
bool one_value(const std::vector<std::string>& values, std::string* why) {
  if (values.size() == 1) return true;
  *why = "takes one value, not " + std::to_string(values.size());
  return false;
}

// An integer from `low` to `high` (`note`, e.g. " (a day)", follows the bound), into a field of
// any integer or std::chrono::duration type.
template <class Field>
SettingSpec integer(std::string name, Field field, uint64_t low, uint64_t high, std::string note, Reload reload,
                    std::string help) {
  using Value = std::remove_cvref_t<decltype(field(std::declval<DaemonConfig&>()))>;
  constexpr auto count = [](const Value& v) -> uint64_t {
    if constexpr (std::is_integral_v<Value>) {
      return static_cast<uint64_t>(v);
    } else {
      return static_cast<uint64_t>(v.count());
    }
  };
  SettingSpec spec = declare(std::move(name), field, reload, std::move(help));
  spec.parse = [field, low, high, note](const std::vector<std::string>& values, DaemonConfig* c, std::string* why) {
    if (!one_value(values, why)) return false;
    const std::optional<uint64_t> value = read_integer(values[0]);
    if (!value || *value < low || *value > high) {
      *why = "must be an integer from " + std::to_string(low) + " to " + std::to_string(high) + note + ", not '" +
             safe_text(values[0], 64) + "'";
      return false;
    }
    field(*c) = Value(*value);
    return true;
  };
  spec.text = [field, count](const DaemonConfig& c) { return std::to_string(count(field(c))); };
  show_text(&spec, "");
  return spec;
}

// Text; `check` (optional) refuses what the field cannot hold, setting *why.
template <class Field>
SettingSpec text(std::string name, Field field, Reload reload, std::string help, std::string when_empty,
                 std::function<bool(const std::string&, std::string*)> check = {}) {
  SettingSpec spec = declare(std::move(name), field, reload, std::move(help));
  spec.parse = [field, check](const std::vector<std::string>& values, DaemonConfig* c, std::string* why) {
    if (!one_value(values, why)) return false;
    if (check && !check(values[0], why)) return false;
    field(*c) = values[0];
    return true;
  };
  spec.text = [field](const DaemonConfig& c) { return field(c); };
  show_text(&spec, std::move(when_empty));
  return spec;
}

// A list of texts, repeatable.
template <class Field>
SettingSpec texts(std::string name, Field field, Reload reload, std::string help, std::string when_empty) {
  SettingSpec spec = declare(std::move(name), field, reload, std::move(help));
  spec.repeatable = true;
  spec.parse = [field](const std::vector<std::string>& values, DaemonConfig* c, std::string*) {
    field(*c) = values;
    return true;
  };
  // Each item with its length, so that SIGHUP tells ["a,b"] from ["a", "b"].
  spec.text = [field](const DaemonConfig& c) {
    std::string text;
    for (const std::string& item : field(c)) text += std::to_string(item.size()) + ":" + item;
    return text;
  };
  spec.show = [field, when_empty = std::move(when_empty)](const DaemonConfig& c) {
    const std::string shown = join(field(c));
    return shown.empty() ? when_empty : shown;
  };
  return spec;
}

// A list of users, each a uid or a user name, repeatable.
template <class Field>
SettingSpec users(std::string name, Field field, Reload reload, std::string help, std::string when_empty) {
  SettingSpec spec = declare(std::move(name), field, reload, std::move(help));
  spec.repeatable = true;
  spec.parse = [field](const std::vector<std::string>& values, DaemonConfig* c, std::string* why) {
    std::vector<uid_t> uids;
    for (const std::string& user : values) {
      const std::optional<uid_t> uid = uid_of(user);
      if (!uid) {
        *why = "must be a uid or a user name, and '" + safe_text(user, 64) +
               "' is neither a uid nor a user on this machine (give a number, or a user name that `id -u NAME` knows)";
        return false;
      }
      uids.push_back(*uid);
    }
    field(*c) = std::move(uids);
    return true;
  };
  spec.text = [field](const DaemonConfig& c) {
    std::vector<std::string> items;
    for (uid_t uid : field(c)) items.push_back(std::to_string(uid));
    return join(items);
  };
  show_text(&spec, std::move(when_empty));
  return spec;
}

// A byte limit where 0 means "derived from the machine's physical memory"; `config get` shows
// the limit in effect.
template <class Field>
SettingSpec byte_limit(std::string name, Field field, std::string help) {
  SettingSpec spec = integer(name, field, 0, std::numeric_limits<uint64_t>::max(), "", Reload::kRestart, std::move(help));
  spec.show = [field](const DaemonConfig& c) {
    LocalLimits limits = c.limits;
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    resolve_byte_limits(pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0,
                        &limits);
    DaemonConfig resolved = c;
    resolved.limits = limits;
    return describe_bytes(field(resolved)) + (field(c) == 0 ? ", from physical memory" : "");
  };
  return spec;
}

bool host_port(const std::string& value, std::string* why) {
  HostPort parsed;
  std::string reason;
  if (parse_host_port(value, &parsed, &reason)) return true;
  *why = "must be HOST:PORT, not '" + safe_text(value, 64) + "': " + safe_text(reason, 128);
  return false;
}

SettingSpec log_level_setting() {
  SettingSpec spec = declare("log-level", GS_FIELD(log_level), Reload::kLive, "debug, info, warning or error");
  spec.parse = [](const std::vector<std::string>& values, DaemonConfig* c, std::string* why) {
    if (!one_value(values, why)) return false;
    if (parse_log_level(values[0], &c->log_level)) return true;
    *why = "must be debug, info, warning or error, not '" + safe_text(values[0], 64) + "'";
    return false;
  };
  spec.text = [](const DaemonConfig& c) { return std::string(log_level_name(c.log_level)); };
  show_text(&spec, "");
  return spec;
}

// --admin: unix:PATH or none (the Unix socket), and HOST:PORT (TCP, with mutual TLS), each at
// most once.
SettingSpec admin_setting() {
  SettingSpec spec;
  spec.name = "admin";
  spec.repeatable = true;
  spec.help =
      "admin service (gradsyncctl): unix:PATH, none, or HOST:PORT for TCP with mutual TLS as well (repeatable; "
      "default: beside the control socket, /run/gradsync/admin.sock for the default socket, SOCKET.admin for "
      "another)";
  spec.parse = [](const std::vector<std::string>& values, DaemonConfig* c, std::string* why) {
    c->admin_address.clear();
    c->admin_tcp.clear();
    for (const std::string& a : values) {
      if (a == "none" || a.rfind("unix:", 0) == 0) {
        if (!c->admin_address.empty() && c->admin_address != a) {
          *why = "names two Unix sockets (or one and none): '" + safe_text(c->admin_address, 256) + "' and '" +
                 safe_text(a, 256) + "'";
          return false;
        }
        c->admin_address = a;
        continue;
      }
      // HOST:PORT, [IPv6]:PORT: no other gRPC address scheme (unix-abstract:, vsock:, ipv4:),
      // which would skip the socket checks or TLS.
      HostPort tcp;
      std::string reason;
      if (!parse_host_port(a, &tcp, &reason)) {
        *why = "must be unix:PATH, none or HOST:PORT, not '" + safe_text(a, 64) + "': " + safe_text(reason, 128);
        return false;
      }
      if (!c->admin_tcp.empty()) {
        *why = "names two TCP addresses: '" + safe_text(c->admin_tcp, 256) + "' and '" + safe_text(a, 256) + "'";
        return false;
      }
      c->admin_tcp = a;
    }
    return true;
  };
  spec.text = [](const DaemonConfig& c) {
    return c.admin_tcp.empty() ? c.admin_address : c.admin_address + "," + c.admin_tcp;
  };
  spec.show = [](const DaemonConfig& c) {
    return c.admin_address + (c.admin_tcp.empty() ? "" : ", " + c.admin_tcp + " (mutual TLS)");
  };
  spec.copy = [](const DaemonConfig& from, DaemonConfig* to) {
    to->admin_address = from.admin_address;
    to->admin_tcp = from.admin_tcp;
  };
  return spec;
}

}  // namespace

std::vector<SettingSpec> daemon_settings() {
  constexpr uint64_t kDayMs = 86'400'000;
  constexpr uint64_t kMaxCount = std::numeric_limits<uint32_t>::max();
  const Reload live = Reload::kLive, restart = Reload::kRestart;
  std::vector<SettingSpec> s;
  s.push_back(text("socket", GS_FIELD(socket_path), restart, "Unix control socket that trainers connect to", "",
                   [](const std::string& v, std::string* why) {
                     if (!v.empty()) return true;
                     *why = "must not be empty";
                     return false;
                   }));
  s.push_back(admin_setting());
  s.push_back(text("admin-tls-cert", GS_FIELD(admin_tls_cert), restart, "TCP admin: this daemon's certificate (PEM)",
                   "(none)"));
  s.push_back(text("admin-tls-key", GS_FIELD(admin_tls_key), restart, "TCP admin: its private key (PEM)", "(none)"));
  s.push_back(text("admin-tls-ca", GS_FIELD(admin_tls_ca), restart,
                   "TCP admin: the CA certificate (PEM) that callers' certificates must be signed by; every caller "
                   "must present one",
                   "(none)"));
  s.push_back(texts("admin-tls-admin-cn", GS_FIELD(admin_tls_admin_cns), restart,
                    "TCP admin: a certificate common name that may make mutating calls and see every job "
                    "(repeatable); other callers are the local user their common name names",
                    "(none)"));
  s.push_back(text("admin-group", GS_FIELD(admin_group), live,
                   "group whose members may change settings (gradsyncctl config set) and drain the daemon, and "
                   "see every user's jobs; root and the daemon's own user always may (default: no group)",
                   "(none: root and the daemon's user)"));
  s.push_back(text("metrics", GS_FIELD(metrics_address), restart,
                   "serve Prometheus metrics at http://HOST:PORT/metrics (default: off); every job's series are "
                   "visible to whoever reaches it",
                   "(off)", [](const std::string& v, std::string* why) {
                     if (v.empty() || host_port(v, why)) return true;
                     *why += " (for example 127.0.0.1:9464, or 0.0.0.0:9464 for every interface)";
                     return false;
                   }));
  // Bounds are at most a day: larger values would overflow the deadlines computed from them.
  s.push_back(integer("timeout-ms", GS_FIELD(default_timeout), 1, kDayMs, " (a day)", live,
                      "default bound on every wait of a job, in milliseconds (a job may ask for its own)"));
  s.push_back(integer("max-timeout-ms", GS_FIELD(max_timeout), 1, kDayMs, " (a day)", live,
                      "largest timeout a job may ask for, in milliseconds"));
  s.push_back(integer("execution-timeout-ms", GS_FIELD(execution_timeout), 1, kDayMs, " (a day)", live,
                      "bound on executing one bucket (a hang, not a slow rank or peer), in milliseconds"));
  s.push_back(integer("drain-timeout-ms", GS_FIELD(drain_timeout), 0, 600'000, "", live,
                      "at SIGTERM, how long operations already submitted may take to finish before the jobs are "
                      "failed and gradsyncd exits (within this and 2 s more), in milliseconds (joins are refused "
                      "meanwhile)"));
  s.push_back(integer("connection-timeout-ms", GS_FIELD(connection_timeout), 100, kDayMs, " (a day)", restart,
                      "close a control connection whose request frame stays incomplete this long, or that has not "
                      "joined a job this long after its last request, in milliseconds (joined trainers are never "
                      "timed out)"));
  s.push_back(integer("max-connections-per-user", GS_FIELD(limits.connections_per_user), 1, 65536, "", restart,
                      "control connections one user may hold open (each is a descriptor of the daemon's)"));
  s.push_back(integer("max-jobs-per-user", GS_FIELD(limits.jobs_per_user), 1, kMaxCount, "", restart,
                      "jobs one user may run in this daemon at once"));
  s.push_back(integer("max-jobs", GS_FIELD(limits.jobs), 1, 4096, " (each job has a thread)", restart,
                      "jobs this daemon runs at once, of all users (each has a worker thread, two across nodes)"));
  s.push_back(integer("max-pending-registrations-per-user", GS_FIELD(limits.pending_registrations_per_user), 1,
                      kMaxCount, "", restart,
                      "tensor-set registrations one user may have waiting for their barrier at once"));
  s.push_back(integer("max-segments-per-client", GS_FIELD(limits.segments_per_client), 1, kMaxCount, "", restart,
                      "memory segments one client may announce (each is a mapping in the daemon; see "
                      "vm.max_map_count)"));
  s.push_back(integer("max-segments-per-user", GS_FIELD(limits.segments_per_user), 1, kMaxCount, "", restart,
                      "memory segments all of one user's clients may hold (keep users x this below "
                      "vm.max_map_count)"));
  s.push_back(integer("max-tensors-per-client", GS_FIELD(limits.tensors_per_client), 1,
                      std::numeric_limits<uint64_t>::max(), "", restart,
                      "tensors one client may register, over all its sets"));
  s.push_back(byte_limit("max-segment-bytes", GS_FIELD(limits.segment_bytes),
                         "largest memory segment a client may announce, in bytes; 0: the machine's physical memory"));
  s.push_back(byte_limit("max-bytes-per-user", GS_FIELD(limits.bytes_per_user),
                         "bytes one user's segments may map into the daemon, with its registrations being checked "
                         "(64 bytes a tensor); 0: the machine's physical memory"));
  s.push_back(byte_limit("max-bytes", GS_FIELD(limits.bytes_total),
                         "the same, all users together; 0: twice the physical memory, at most 64 TiB (half the "
                         "address space)"));
  s.push_back(integer("max-local-world-size", GS_FIELD(limits.local_world_size), 1, 1024, "", restart,
                      "largest local world size (ranks on this node) a job may declare, at most 1024"));
  s.push_back(integer("reduce-threads", GS_FIELD(reduce_threads), 0, 256, "", restart,
                      "threads that reduce buckets, shared by all jobs; 0 means one per CPU"));
  s.push_back(users("allow-uid", GS_FIELD(allowed_uids), live,
                    "user allowed to connect, by uid or user name (repeatable); default: the daemon's own user and "
                    "root",
                    "(own user and root)"));
  s.push_back(users("legacy-ipc-uid", GS_FIELD(legacy_ipc_uids), restart,
                    "user id whose trainers may register GPU memory from other allocators (PyTorch's caching "
                    "allocator) as legacy CUDA IPC handles (repeatable); default: nobody. A handle is not proof "
                    "of ownership: trust only users who trust each other",
                    "(nobody)"));
  s.push_back(integer("nccl-keep-idle-s", GS_FIELD(nccl_keep_idle), 0, 86'400, " (a day)", restart,
                      "seconds to keep a job's idle NCCL communicators after the job ends, so that restarted "
                      "trainers re-joining it with the same layout reuse them instead of creating new ones; 0: "
                      "never"));
  s.push_back(log_level_setting());
  s.push_back(text("peer-listen", GS_FIELD(peer_listen), restart,
                   "HOST:PORT of the peer service other daemons rendezvous through (port 0: any free port; "
                   "default 0.0.0.0:29590 with a token or TLS, else 127.0.0.1:29590: unauthenticated, it may "
                   "listen on loopback only)",
                   "", [](const std::string& v, std::string* why) { return v.empty() || host_port(v, why); }));
  s.push_back(text("peer-token-file", GS_FIELD(peer_token_file), restart,
                   "file holding the cluster token (the same on every node, mode 0600; make one with "
                   "openssl rand -hex 32): it never travels; every peer call carries a proof made with it (an "
                   "HMAC of the call, its time and a nonce, bound to the daemon called)",
                   "(none)"));
  s.push_back(integer("peer-key-ttl-s", GS_FIELD(peer_key_ttl), 1, 30 * 86'400, " (30 days)", restart,
                      "seconds the peer store keeps the keys of a job nobody touches (a job's keys are deleted "
                      "when every node ended it; this covers a node that never did)"));
  s.push_back(text("peer-tls-cert", GS_FIELD(peer_tls_cert), restart, "peer service: this daemon's certificate (PEM)",
                   "(none)"));
  s.push_back(text("peer-tls-key", GS_FIELD(peer_tls_key), restart, "peer service: its private key (PEM)", "(none)"));
  s.push_back(text("peer-tls-ca", GS_FIELD(peer_tls_ca), restart,
                   "peer service: the cluster's CA certificate (PEM); peers must present certificates it signed",
                   "(none)"));
  // Other nodes read it from this node's formation record (node_record.h): one printable word.
  s.push_back(text("peer-advertise", GS_FIELD(peer_advertise_host), restart,
                   "host other daemons reach this one at (default: the listen host, or the hostname)",
                   "(the listen host)", [](const std::string& v, std::string* why) {
                     if (v.size() <= 255 && std::none_of(v.begin(), v.end(), [](char ch) { return ch <= ' ' || ch >= 0x7f; })) {
                       return true;
                     }
                     *why = "must be a host name or address (printable ASCII, no spaces, at most 255 bytes), not '" +
                            safe_text(v, 64) + "'";
                     return false;
                   }));
  s.push_back(texts("etcd-endpoints", GS_FIELD(etcd.endpoints), restart,
                    "etcd members HOST:PORT (comma-separated or repeated) that jobs whose rendezvous is etcd:// may "
                    "use, and the only ones the daemon sends --etcd-* credentials to; a job's bare etcd:// means "
                    "these (default: any member a job names, and no credentials)",
                    "(any member a job names)"));
  s.push_back(text("etcd-tls-ca", GS_FIELD(etcd.tls_ca), restart,
                   "etcd: the CA certificate (PEM) the members' certificates are signed by; gives TLS to etcd",
                   "(no TLS)"));
  s.push_back(text("etcd-tls-cert", GS_FIELD(etcd.tls_cert), restart,
                   "etcd: this daemon's client certificate (PEM), for members that require one (--client-cert-auth)",
                   "(none)"));
  s.push_back(text("etcd-tls-key", GS_FIELD(etcd.tls_key), restart, "etcd: its private key (PEM, mode 0600)", "(none)"));
  s.push_back(text("etcd-user", GS_FIELD(etcd.user), restart, "etcd: the user to authenticate as", "(none)"));
  s.push_back(text("etcd-password-file", GS_FIELD(etcd.password_file), restart,
                   "etcd: file holding that user's password (mode 0600; trailing whitespace and newlines are "
                   "dropped)",
                   "(none)"));
  s.push_back(integer("etcd-lease-ttl-s", GS_FIELD(etcd.lease_ttl), 2, 3600, " (an hour)", restart,
                      "etcd: the TTL of the lease a node's keys live on, renewed while its job runs: they go this "
                      "long after its daemon dies"));
  s.push_back(text("etcd-prefix", GS_FIELD(etcd.prefix), restart,
                   "etcd: where gradsync's keys live in etcd's key space (starts and ends with '/')", ""));
  s.push_back(text("gloo-transport", GS_FIELD(gloo_transport), restart, "engine transport across nodes: tcp or ibverbs",
                   "", [](const std::string& v, std::string* why) {
                     if (v == "tcp" || v == "ibverbs") return true;
                     *why = "must be tcp or ibverbs, not '" + safe_text(v, 64) + "'";
                     return false;
                   }));
  s.push_back(text("gloo-iface", GS_FIELD(gloo_iface), restart,
                   "tcp: network interface for Gloo (default: the advertised host)", "(the advertised host)"));
  s.push_back(text("gloo-ib-device", GS_FIELD(gloo_ib_device), restart, "ibverbs: device name, e.g. mlx5_0", "(none)"));
  s.push_back(integer("gloo-ib-port", GS_FIELD(gloo_ib_port), 1, 255, "", restart, "ibverbs: port"));
  s.push_back(integer("gloo-ib-index", GS_FIELD(gloo_ib_index), 0, 65535, "", restart, "ibverbs: GID index"));
  s.push_back(integer("gloo-slice-bytes", GS_FIELD(gloo_slice_bytes), kMinSliceBytes, kMaxSliceBytes, " (2^40)",
                      restart,
                      "an allreduce larger than this crosses nodes as Gloo calls of this size, each overlapped with "
                      "the local reduction of the next; smaller overlaps more, but each call has a fixed cost (4096 "
                      "to 2^40)"));
  s.push_back(integer("integrity-check-every", GS_FIELD(integrity_check_every), 0, 1ull << 32, " (2^32)", restart,
                      "every Nth operation, the nodes of each cross-node allreduce or reduce-scatter bucket compare a "
                      "hash of a sample of their reduced copy, and a node that disagrees (silent data corruption) "
                      "fails the job, named; 0 turns it off (0 to 2^32)"));
  return s;
}

#undef GS_FIELD

const SettingSpec* find_setting(const std::vector<SettingSpec>& settings, std::string_view name) {
  for (const SettingSpec& spec : settings) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

}  // namespace gradsync
