#include "daemon/peer/peer_client.h"

#include "daemon/peer/peer_server.h"
#include "daemon/peer/token_proof.h"
#include "daemon/util/safe_text.h"

namespace gradsync {
namespace {

// Slack beyond a blocking get's own timeout, so the server answers "timeout" before the
// client's deadline turns it into "unreachable".
constexpr auto kSlack = std::chrono::seconds(2);
// The longest a Ping that learns the callee's service id may take.
constexpr std::chrono::milliseconds kPingBound{5000};

void bound(grpc::ClientContext* context, std::chrono::milliseconds timeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

}  // namespace

std::shared_ptr<grpc::Channel> peer_channel(const std::string& address, const std::shared_ptr<const PeerAuth>& auth) {
  if (auth && auth->channels) return auth->channels->get(address, auth->channel_credentials());
  grpc::ChannelArguments args = PeerChannels::arguments();
  return grpc::CreateCustomChannel(address, auth ? auth->channel_credentials() : grpc::InsecureChannelCredentials(),
                                   args);
}

// Registers the call's context for cancel() for as long as the call runs, and gives the reason
// of a cancellation in place of gRPC's CANCELLED.
class PeerClient::Call {
 public:
  // `job`: the store job the call is about, whose instance id it carries; empty for calls
  // about no job's keys (ping, progress), which carry none.
  Call(PeerClient* client, std::chrono::milliseconds timeout, const std::string& job = {}) : client_(client) {
    bound(&context_, timeout);
    if (!job.empty()) {
      instance_ = client_->instance_auth_->instance_for(client_->address_, job);
      context_.AddMetadata(PeerAuth::kInstanceKey, instance_);
    }
    MutexLock lock(client_->mutex_);
    refused_ = client_->cancelled_;
    if (refused_.ok()) client_->in_flight_.insert(&context_);
  }
  ~Call() {
    MutexLock lock(client_->mutex_);
    client_->in_flight_.erase(&context_);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  grpc::ClientContext* context() { return &context_; }

  // Proves the call with the cluster token, for the callee `callee` (its service id; empty for
  // a Ping), without sending the token (token_proof.h). Call once the request is complete.
  void sign(std::string_view method, const google::protobuf::Message& request, const std::string& callee) {
    if (client_->auth_ && !client_->auth_->token.empty()) {
      const ProofScope scope{callee, client_->auth_->node, instance_};
      context_.AddMetadata(kProofKey, make_proof(client_->auth_->token, method, scope, request));
    }
  }
  // Not ok when the client was cancelled before the call started.
  const Status& refused() const { return refused_; }

  Status finish(const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      MutexLock lock(client_->mutex_);
      if (!client_->cancelled_.ok()) return client_->cancelled_;
    }
    return from_grpc(status, "peer daemon at " + client_->address_);
  }

 private:
  PeerClient* client_;
  grpc::ClientContext context_;
  std::string instance_;  // empty for calls about no job
  Status refused_;
};

void PeerClient::cancel(const Status& why) {
  MutexLock lock(mutex_);
  if (!cancelled_.ok()) return;
  cancelled_ = why.ok() ? Status::aborted("cancelled") : why;
  for (grpc::ClientContext* context : in_flight_) context->TryCancel();
}

PeerClient::PeerClient(std::string address, std::shared_ptr<const PeerAuth> auth)
    : address_(std::move(address)),
      auth_(std::move(auth)),
      channel_(peer_channel(address_, auth_)),
      stub_(peer::Peer::NewStub(channel_)),
      instance_auth_(auth_ && !auth_->instance_secret.empty() ? auth_ : [] {
        auto own = std::make_shared<PeerAuth>();
        own->instance_secret = PeerAuth::make_secret();
        return std::shared_ptr<const PeerAuth>(std::move(own));
      }()) {}

template <class Request, class Reply, class Rpc>
Status PeerClient::unary(std::string_view method, const std::string& job, std::chrono::milliseconds timeout,
                         const Request& request, Reply* reply, Rpc rpc) {
  // One deadline for the whole call, the Pings that learn the callee's id included.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       deadline - std::chrono::steady_clock::now()));
  };
  const bool proven = auth_ && !auth_->token.empty();
  std::string id;
  if (proven) {
    if (Status status = callee(std::min(left(), kPingBound), false, &id); !status.ok()) return status;
  }
  for (int attempt = 0;; ++attempt) {
    Status status;
    {
      Call call(this, left(), job);
      if (!call.refused().ok()) return call.refused();
      call.sign(method, request, id);
      status = call.finish(rpc(call.context(), request, reply));
    }
    // Refused for its proof (not for what it asked): if the callee restarted since its id was
    // learned, the proof named the old one; made once more for the new one.
    if (!proven || attempt > 0 || status.code() != ErrorCode::kPermissionDenied ||
        status.message().find(kProofRefusal) == std::string::npos) {
      return status;
    }
    std::string fresh;
    if (!callee(std::min(left(), kPingBound), true, &fresh).ok() || fresh == id) return status;
    id = fresh;
  }
}

Status PeerClient::callee(std::chrono::milliseconds timeout, bool fresh, std::string* id) {
  {
    MutexLock lock(mutex_);
    if (!fresh && !callee_.empty()) {
      *id = callee_;
      return Status();
    }
  }
  peer::PingReply reply;
  if (Status status = ping(timeout, &reply); !status.ok()) return status;
  if (reply.service_id().empty()) {
    return Status::protocol("peer daemon at " + address_ + " (gradsyncd " + safe_text(reply.daemon_version(), 40) +
                            ") states no service id: every node must run a gradsyncd of the same cross-node "
                            "protocol");
  }
  MutexLock lock(mutex_);
  callee_ = reply.service_id();
  *id = callee_;
  return Status();
}

Status PeerClient::set(const std::string& job, const std::string& key, const std::string& value,
                       std::chrono::milliseconds timeout) {
  bool stored = false;
  return put(job, key, value, false, timeout, &stored);
}

Status PeerClient::set_if_absent(const std::string& job, const std::string& key, const std::string& value,
                                 std::chrono::milliseconds timeout, bool* stored) {
  return put(job, key, value, true, timeout, stored);
}

Status PeerClient::put(const std::string& job, const std::string& key, const std::string& value, bool if_absent,
                       std::chrono::milliseconds timeout, bool* stored) {
  peer::SetRequest request;
  request.set_job(job);
  request.set_key(key);
  request.set_value(value);
  request.set_if_absent(if_absent);
  peer::SetReply reply;
  const Status status = unary("Set", job, timeout, request, &reply, [this](auto* context, auto& r, auto* out) {
    return stub_->Set(context, r, out);
  });
  *stored = status.ok() && reply.stored();
  return status;
}

Status PeerClient::get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                       std::vector<std::string>* values) {
  peer::GetRequest request;
  request.set_job(job);
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
  peer::GetReply reply;
  const Status status = unary("Get", job, timeout + kSlack, request, &reply, [this](auto* context, auto& r, auto* out) {
    return stub_->Get(context, r, out);
  });
  if (!status.ok()) return status;
  // Every caller indexes the values by its keys: a reply of another length is not an answer.
  if (static_cast<size_t>(reply.values_size()) != keys.size()) {
    return Status::protocol("peer daemon at " + address_ + " answered a get of " + std::to_string(keys.size()) +
                            " keys with " + std::to_string(reply.values_size()) + " values");
  }
  values->assign(reply.values().begin(), reply.values().end());
  return status;
}

Status PeerClient::add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds timeout,
                       int64_t* value) {
  peer::AddRequest request;
  request.set_job(job);
  request.set_key(key);
  request.set_delta(delta);
  peer::AddReply reply;
  const Status status = unary("Add", job, timeout, request, &reply, [this](auto* context, auto& r, auto* out) {
    return stub_->Add(context, r, out);
  });
  *value = reply.value();
  return status;
}

Status PeerClient::delete_job(const std::string& job, std::chrono::milliseconds timeout, const std::string& prefix) {
  peer::DeleteJobRequest request;
  request.set_job(job);
  request.set_prefix(prefix);
  peer::DeleteJobReply reply;
  return unary("DeleteJob", job, timeout, request, &reply, [this](auto* context, auto& r, auto* out) {
    return stub_->DeleteJob(context, r, out);
  });
}

Status PeerClient::ping(std::chrono::milliseconds timeout) {
  peer::PingReply reply;
  return ping(timeout, &reply);
}

Status PeerClient::ping(std::chrono::milliseconds timeout, peer::PingReply* reply) {
  Call call(this, timeout);
  if (!call.refused().ok()) return call.refused();
  peer::PingRequest request;
  call.sign("Ping", request, {});
  return call.finish(stub_->Ping(call.context(), request, reply));
}

Status PeerClient::progress(const std::string& job, std::chrono::milliseconds timeout, peer::ProgressReply* reply) {
  peer::ProgressRequest request;
  request.set_job(job);
  // About no job's keys: no instance id.
  return unary("Progress", {}, timeout, request, reply, [this](auto* context, auto& r, auto* out) {
    return stub_->Progress(context, r, out);
  });
}

}  // namespace gradsync
