#include "daemon/rendezvous/etcd_access.h"

#include <algorithm>

#include "daemon/util/safe_text.h"
#include "daemon/util/secret_file.h"
#include "shared/host_port.h"

namespace gradsync {
namespace {

// A member as the daemon compares and dials it: HOST:PORT, written back by HostPort so that
// two spellings of one member compare equal where they can.
Status normalize(const std::string& text, const std::string& what, std::string* out) {
  HostPort member;
  std::string why;
  if (!parse_host_port(text, &member, &why) || member.port == 0 || member.wildcard()) {
    if (why.empty()) why = member.port == 0 ? "port 0 names no member" : "a wildcard address names no member";
    return Status::invalid_argument(what + ": '" + safe_text(text, 128) + "' is not an etcd member's HOST:PORT: " + why);
  }
  *out = member.text();
  return Status();
}

// The comma-separated members of `list`, each normalized.
Status parse_members(const std::string& list, const std::string& what, std::vector<std::string>* out) {
  out->clear();
  size_t begin = 0;
  while (begin <= list.size()) {
    if (out->size() >= EtcdAccess::kMaxMembers) {
      return Status::invalid_argument(what + ": more than " + std::to_string(EtcdAccess::kMaxMembers) +
                                      " etcd members");
    }
    const size_t comma = std::min(list.find(',', begin), list.size());
    std::string member;
    if (Status s = normalize(list.substr(begin, comma - begin), what, &member); !s.ok()) return s;
    if (std::find(out->begin(), out->end(), member) == out->end()) out->push_back(member);
    begin = comma + 1;
  }
  return Status();
}

// The channel arguments of etcd's members: the peer channels' reconnect backoff, HTTP/2 pings
// while a call is open (a member that stops answering, frozen or cut off, ends the watches and
// renewals on it within 13 s, and they move to the next member; etcd refuses pings more often
// than every 5 s, --grpc-keepalive-min-time), and a bound on a reply's size well above what
// etcd sends (kMaxReply): a member a trainer named may be anyone's server, and an answer of
// gigabytes would otherwise be taken whole, for every job of the daemon to pay for.
grpc::ChannelArguments member_arguments() {
  grpc::ChannelArguments args = PeerChannels::arguments();
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(static_cast<int>(EtcdAccess::kMaxReply));
  return args;
}

// A PEM file's text, refused (naming the flag) when it holds no PEM block: an empty file would
// otherwise turn TLS off without a word.
Status read_pem(const std::string& path, const std::string& flag, std::string* out) {
  if (Status s = read_config_file(path, flag, out); !s.ok()) return s;
  if (out->find("-----BEGIN ") == std::string::npos) {
    return Status::invalid_argument(flag + ": '" + path + "' holds no PEM block (-----BEGIN ...)");
  }
  return Status();
}

}  // namespace

bool is_etcd_rendezvous(const std::string& rendezvous) { return rendezvous.rfind(kEtcdScheme, 0) == 0; }

Status EtcdAccess::check(const EtcdSettings& settings, std::vector<std::string>* endpoints) {
  std::vector<std::string> all;
  for (const std::string& listed : settings.endpoints) {
    std::vector<std::string> members;
    if (Status s = parse_members(listed, "--etcd-endpoints", &members); !s.ok()) return s;
    for (std::string& m : members) {
      if (std::find(all.begin(), all.end(), m) == all.end()) all.push_back(std::move(m));
    }
  }
  if (all.size() > kMaxMembers) {
    return Status::invalid_argument("--etcd-endpoints: more than " + std::to_string(kMaxMembers) + " etcd members");
  }
  const bool client_cert = !settings.tls_cert.empty() || !settings.tls_key.empty();
  if (client_cert && (settings.tls_cert.empty() || settings.tls_key.empty() || settings.tls_ca.empty())) {
    return Status::invalid_argument("--etcd-tls-cert and --etcd-tls-key go together, and with --etcd-tls-ca");
  }
  if (!settings.user.empty() != !settings.password_file.empty()) {
    return Status::invalid_argument("--etcd-user and --etcd-password-file go together");
  }
  if ((client_cert || !settings.user.empty()) && all.empty()) {
    return Status::invalid_argument(
        "etcd credentials (--etcd-user, --etcd-tls-cert) need --etcd-endpoints: the daemon sends them only to the "
        "members listed there, never to members a trainer names");
  }
  if (settings.lease_ttl.count() < 2) {
    return Status::invalid_argument("--etcd-lease-ttl-s must be at least 2 (etcd's shortest lease)");
  }
  if (settings.prefix.empty() || settings.prefix.front() != '/' || settings.prefix.back() != '/') {
    return Status::invalid_argument("--etcd-prefix must start and end with '/', not '" +
                                    safe_text(settings.prefix, 128) + "'");
  }
  if (endpoints) *endpoints = std::move(all);
  return Status();
}

Status EtcdAccess::load(const EtcdSettings& settings, std::chrono::seconds counter_ttl,
                        std::shared_ptr<const EtcdAccess>* out) {
  auto access = std::make_shared<EtcdAccess>();
  if (Status s = check(settings, &access->endpoints_); !s.ok()) return s;
  const bool client_cert = !settings.tls_cert.empty();
  access->tls_ = !settings.tls_ca.empty();
  if (access->tls_) {
    if (Status s = read_pem(settings.tls_ca, "--etcd-tls-ca", &access->tls_ca_); !s.ok()) return s;
  }
  if (client_cert) {
    if (Status s = read_pem(settings.tls_cert, "--etcd-tls-cert", &access->tls_cert_); !s.ok()) return s;
    if (Status s = read_secret_file(settings.tls_key, "--etcd-tls-key", 1 << 20, &access->tls_key_); !s.ok()) return s;
    if (access->tls_key_.find("-----BEGIN ") == std::string::npos) {
      return Status::invalid_argument("--etcd-tls-key: '" + settings.tls_key + "' holds no PEM block (-----BEGIN ...)");
    }
  }
  if (!settings.user.empty()) {
    access->user_ = settings.user;
    if (Status s = read_secret_file(settings.password_file, "--etcd-password-file", 4096, &access->password_); !s.ok()) {
      return s;
    }
    if (access->password_.empty()) {
      return Status::invalid_argument("--etcd-password-file: '" + settings.password_file + "' is empty");
    }
  }
  access->lease_ttl_ = settings.lease_ttl;
  access->counter_ttl_ = counter_ttl;
  access->prefix_ = settings.prefix;
  if (access->tls()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = access->tls_ca_;
    ssl.pem_cert_chain = access->tls_cert_;
    ssl.pem_private_key = access->tls_key_;
    access->credentials_ = grpc::SslCredentials(ssl);
  } else {
    access->credentials_ = grpc::InsecureChannelCredentials();
  }
  access->channels_ = std::make_shared<PeerChannels>(64, member_arguments());
  access->tokens_ = std::make_shared<EtcdTokens>();
  *out = std::move(access);
  return Status();
}

Status EtcdAccess::members(const std::string& rendezvous, std::vector<std::string>* out) const {
  if (!is_etcd_rendezvous(rendezvous)) {
    return Status::invalid_argument("'" + safe_text(rendezvous, 256) + "' is not an etcd rendezvous (" + kEtcdScheme +
                                    "HOST:PORT[,HOST:PORT...])");
  }
  const std::string list = rendezvous.substr(std::string(kEtcdScheme).size());
  if (list.empty()) {
    if (endpoints_.empty()) {
      return Status::invalid_argument(std::string("rendezvous '") + kEtcdScheme +
                                      "' names no etcd member, and this gradsyncd has no --etcd-endpoints to use "
                                      "instead: name them, " + kEtcdScheme + "HOST:PORT[,HOST:PORT...]");
    }
    *out = endpoints_;
    return Status();
  }
  if (Status s = parse_members(list, "rendezvous", out); !s.ok()) return s;
  if (!endpoints_.empty()) {
    for (const std::string& member : *out) {
      if (std::find(endpoints_.begin(), endpoints_.end(), member) == endpoints_.end()) {
        std::string allowed;
        for (const std::string& e : endpoints_) allowed += (allowed.empty() ? "" : ",") + e;
        return Status::permission_denied("rendezvous names etcd member " + member +
                                         ", which is not one of this gradsyncd's --etcd-endpoints (" + allowed +
                                         "): it talks to those only");
      }
    }
  }
  return Status();
}

std::shared_ptr<grpc::Channel> EtcdAccess::channel(const std::string& member) const {
  return channels_->get(member, credentials_);
}

}  // namespace gradsync
