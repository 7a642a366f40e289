#include "daemon/peer/peer_server.h"

#include "daemon/peer/peer_requests.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include <atomic>

#include "daemon/util/safe_text.h"
#include "shared/version.h"
#include "shared/mutex.h"

namespace gradsync {
namespace {

// Nobody may park a get for longer than this, whatever it asks.
constexpr std::chrono::milliseconds kMaxWait = std::chrono::minutes(10);
// A peer connection with no call for this long is closed.
constexpr int kIdleConnectionMs = 10'000;

}  // namespace

grpc::Status to_grpc(const Status& status) {
  switch (status.code()) {
    case ErrorCode::kOk: return grpc::Status::OK;
    case ErrorCode::kNotFound: return {grpc::StatusCode::NOT_FOUND, status.message()};
    case ErrorCode::kTimeout: return {grpc::StatusCode::DEADLINE_EXCEEDED, status.message()};
    case ErrorCode::kInvalidArgument: return {grpc::StatusCode::INVALID_ARGUMENT, status.message()};
    case ErrorCode::kResourceExhausted: return {grpc::StatusCode::RESOURCE_EXHAUSTED, status.message()};
    case ErrorCode::kAborted: return {grpc::StatusCode::ABORTED, status.message()};
    case ErrorCode::kPermissionDenied: return {grpc::StatusCode::PERMISSION_DENIED, status.message()};
    default: return {grpc::StatusCode::INTERNAL, status.message()};
  }
}

Status from_grpc(const grpc::Status& status, const std::string& context) {
  const std::string message = context + ": " + status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::OK: return Status();
    case grpc::StatusCode::NOT_FOUND: return Status::not_found(message);
    case grpc::StatusCode::DEADLINE_EXCEEDED: return Status::timeout(message);
    case grpc::StatusCode::UNAVAILABLE: return Status::peer_lost(message);
    case grpc::StatusCode::INVALID_ARGUMENT: return Status::invalid_argument(message);
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return Status::resource_exhausted(message);
    case grpc::StatusCode::ABORTED: return Status::aborted(message);
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED: return Status::permission_denied(message);
    default: return Status::internal(message);
  }
}

namespace {

// The calling daemon's instance id (key_scope.h); empty when the call carries none.
std::string instance_of(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(PeerAuth::kInstanceKey);
  if (it == metadata.end() || it->second.size() > 64) return {};
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

grpc::ServerUnaryReactor* PeerService::Set(grpc::CallbackServerContext* context, const peer::SetRequest* request,
                                           peer::SetReply* reply) {
  PeerCaller caller;
  if (auto* refused = refuse(context, "Set", *request, &caller)) return refused;
  auto* reactor = context->DefaultReactor();
  reactor->Finish(to_grpc(serve_set(*store_, scope_, *request, caller, reply)));
  return reactor;
}

namespace {

// A parked get whose caller goes away (cancels, or its deadline passes on its side) is freed
// at once, not held to its own deadline.
class GetReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit GetReactor(KvStore* store) : store_(store) {}
  // Called once by Get() after parking (id) or answering at once (0). The answer, Finish() and
  // OnDone() may all come before that, on other threads: two references (gRPC's and Get()'s)
  // keep the reactor alive until both are done with it.
  void start(uint64_t id) {
    bool cancel_now = false;
    {
      MutexLock lock(mutex_);
      id_ = id;
      cancel_now = cancelled_;
    }
    if (cancel_now) store_->cancel(id, Status::aborted("the caller went away"));
    release();
  }
  void OnCancel() override {
    uint64_t id = 0;
    {
      MutexLock lock(mutex_);
      cancelled_ = true;
      id = id_;
    }
    store_->cancel(id, Status::aborted("the caller went away"));
  }
  void OnDone() override { release(); }

 private:
  void release() {
    if (references_.fetch_sub(1) == 1) delete this;
  }

  KvStore* store_;
  std::atomic<int> references_{2};
  Mutex mutex_;
  uint64_t id_ GS_GUARDED_BY(mutex_) = 0;  // 0 until parked (or answered at once)
  bool cancelled_ GS_GUARDED_BY(mutex_) = false;
};

// The peer's host, for the per-caller bound on parked gets ("ipv4:10.0.0.2:41234" -> "ipv4:10.0.0.2").
// Every loopback address is this machine: one caller, whichever 127.x it uses.
std::string caller_host(const std::string& grpc_peer) {
  std::string peer = grpc_peer;  // gRPC may write an IPv6 address's brackets percent-encoded
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"%5B", "["}, {"%5D", "]"}}) {
    for (size_t at = peer.find(from); at != std::string::npos; at = peer.find(from, at)) peer.replace(at, 3, to);
  }
  const auto colon = peer.rfind(':');
  const std::string host = colon == std::string::npos ? peer : peer.substr(0, colon);
  if (host.rfind("ipv4:127.", 0) == 0 || host == "ipv6:[::1]" || host.rfind("ipv6:[::ffff:127.", 0) == 0) {
    return "loopback";
  }
  // An IPv6 host is its /64, as for the connection bounds: a caller picks freely within it.
  if (host.rfind("ipv6:[", 0) == 0 && host.back() == ']') {
    in6_addr address{};
    if (::inet_pton(AF_INET6, host.substr(6, host.size() - 7).c_str(), &address) == 1) {
      std::memset(&address.s6_addr[8], 0, 8);
      char text[INET6_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET6, &address, text, sizeof text);
      return std::string("ipv6:[") + text + "]/64";
    }
  }
  return host;
}

}  // namespace

std::string PeerService::service_id() {
  const std::string secret = PeerAuth::make_secret();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (size_t i = 0; i < 16; ++i) {
    id += kHex[static_cast<unsigned char>(secret[i]) >> 4];
    id += kHex[static_cast<unsigned char>(secret[i]) & 15];
  }
  return id;
}

StoreMember PeerService::member_of(const grpc::CallbackServerContext& context, const std::string& node) const {
  // The group is what the caller cannot choose: its certificate, else its host.
  std::string group = "host " + caller_host(context.peer());
  bool certified = false;
  if (auth_->tls()) {
    const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth && auth->IsPeerAuthenticated()) {
      for (const auto& identity : auth->GetPeerIdentity()) {
        group = "certificate " + safe_text(std::string(identity.data(), identity.size()), 256);
        certified = true;
        break;
      }
    }
  }
  // The identity a node's place is bound to: what the caller proved (its certificate, or the
  // node its token proofs declare), never the address it happened to arrive from.
  const std::string identity = certified ? group : "node " + node;
  return StoreMember(node.empty() ? group : group + " node " + node, group, identity);
}

grpc::ServerUnaryReactor* PeerService::Get(grpc::CallbackServerContext* context, const peer::GetRequest* request,
                                           peer::GetReply* reply) {
  PeerCaller caller;
  if (auto* refused = refuse(context, "Get", *request, &caller)) return refused;
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  if (Status scoped = check_get(scope_, *request, caller); !scoped.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(to_grpc(scoped));
    return reactor;
  }
  auto* reactor = new GetReactor(store_);
  const auto timeout = std::min(kMaxWait, std::chrono::milliseconds(request->timeout_ms()));
  const uint64_t id = store_->get(
      request->job(), std::move(keys), timeout,
      [reactor, reply, calls = &calls_](const Status& status, std::vector<std::string> values) {
        for (auto& value : values) {
          calls->add_get_bytes(value.size());
          reply->add_values(std::move(value));
        }
        reactor->Finish(to_grpc(status));
      },
      caller.member);
  reactor->start(id);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::Add(grpc::CallbackServerContext* context, const peer::AddRequest* request,
                                           peer::AddReply* reply) {
  PeerCaller caller;
  if (auto* refused = refuse(context, "Add", *request, &caller)) return refused;
  auto* reactor = context->DefaultReactor();
  reactor->Finish(to_grpc(serve_add(*store_, scope_, *request, caller, reply)));
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::DeleteJob(grpc::CallbackServerContext* context,
                                                 const peer::DeleteJobRequest* request, peer::DeleteJobReply* reply) {
  PeerCaller caller;
  if (auto* refused = refuse(context, "DeleteJob", *request, &caller)) return refused;
  auto* reactor = context->DefaultReactor();
  reactor->Finish(to_grpc(serve_delete(*store_, scope_, *request, caller, reply)));
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::Ping(grpc::CallbackServerContext* context, const peer::PingRequest* request,
                                            peer::PingReply* reply) {
  PeerCaller caller;
  if (auto* refused = refuse(context, "Ping", *request, &caller)) return refused;
  auto* reactor = context->DefaultReactor();
  reply->set_daemon_version(kGradsyncVersion);
  reply->set_service_id(proofs_.service_id());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::Progress(grpc::CallbackServerContext* context,
                                                const peer::ProgressRequest* request, peer::ProgressReply* reply) {
  PeerCaller caller;
  if (auto* refused = refuse(context, "Progress", *request, &caller)) return refused;
  auto* reactor = context->DefaultReactor();
  reply->set_found(progress_ && progress_(request->job(), reply));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::refuse(grpc::CallbackServerContext* context, std::string_view method,
                                              const google::protobuf::Message& request, PeerCaller* caller) {
  calls_.add(method);
  caller->instance = instance_of(*context);
  std::string node;
  grpc::Status status = proofs_.check(*context, method, caller->instance, request, &node);
  // With neither a token nor TLS, nobody is known to be a member: only Ping is answered.
  if (status.ok() && !auth_->configured() && method != "Ping") {
    status = grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          std::string(kProofRefusal) + ": this gradsyncd has no cluster token or TLS "
                          "(--peer-token-file, --peer-tls-*), so its peer service answers only Ping; multi-node "
                          "jobs need one on every node");
  }
  if (status.ok()) {
    caller->member = member_of(*context, node);
    // Without a token or TLS nothing is proven: such a connection never stays past the window.
    if (proven_ && auth_->configured()) proven_(context->peer());
    return nullptr;
  }
  auto* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

PeerServer::PeerServer(PeerServerOptions options)
    : options_(std::move(options)),
      store_(options_.limits),
      service_(&store_, options_.progress, options_.auth, options_.jobs,
               [this](const std::string& peer) { listener_->proven(peer); }),
      listener_(std::make_unique<TcpListener>(options_.listen, options_.connections, options_.log)) {
  port_ = listener_->port();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, which would let a second daemon bind the same port and
  // silently take half of the rendezvous traffic. A port in use must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A connection that makes no call for this long is closed (a daemon's channel reconnects by
  // itself when it calls again): silent connections do not hold descriptors.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kIdleConnectionMs);
  listener_->attach(&builder, options_.auth->server_credentials());
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  if (server_) listener_->start();
  if (!server_ || port_ == 0) {
    throw Error(Status::internal("cannot serve the peer service on " + options_.listen +
                                 " (address in use or invalid? see --peer-listen)"));
  }
  options_.log.info("peer service listening on " + options_.listen + " (port " + std::to_string(port_) + ", " +
                    (options_.auth->tls() ? (options_.auth->token.empty() ? "mutual TLS" : "mutual TLS and cluster token")
                                          : (options_.auth->token.empty() ? "unauthenticated: loopback only"
                                                                          : "cluster token")) +
                    ")");
}

PeerServer::~PeerServer() {
  // No more connections handed to a server that goes; the listener itself stays until the
  // members go (after the server), since calls still in flight look up their peers in it.
  listener_->stop();
  store_.shutdown(Status::aborted("gradsyncd is shutting down"));
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace gradsync
