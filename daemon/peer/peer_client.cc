#include "daemon/peer/peer_client.h"

#include "daemon/peer/peer_server.h"
#include "daemon/peer/token_proof.h"

namespace gradsync {
namespace {

// Slack beyond a blocking get's own timeout, so the server answers "timeout" before the
// client's deadline turns it into "unreachable".
constexpr auto kSlack = std::chrono::seconds(2);

void bound(grpc::ClientContext* context, std::chrono::milliseconds timeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

}  // namespace

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
    std::lock_guard lock(client_->mutex_);
    refused_ = client_->cancelled_;
    if (refused_.ok()) client_->in_flight_.insert(&context_);
  }
  ~Call() {
    std::lock_guard lock(client_->mutex_);
    client_->in_flight_.erase(&context_);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  grpc::ClientContext* context() { return &context_; }

  // Proves the call with the cluster token, without sending it (token_proof.h). Call once the
  // request is complete.
  void sign(std::string_view method, const google::protobuf::Message& request) {
    if (client_->auth_ && !client_->auth_->token.empty()) {
      context_.AddMetadata(kProofKey, make_proof(client_->auth_->token, method, instance_, request));
    }
  }
  // Not ok when the client was cancelled before the call started.
  const Status& refused() const { return refused_; }

  Status finish(const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      std::lock_guard lock(client_->mutex_);
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
  std::lock_guard lock(mutex_);
  if (!cancelled_.ok()) return;
  cancelled_ = why.ok() ? Status::aborted("cancelled") : why;
  for (grpc::ClientContext* context : in_flight_) context->TryCancel();
}

PeerClient::PeerClient(std::string address, std::shared_ptr<const PeerAuth> auth)
    : address_(std::move(address)),
      auth_(std::move(auth)),
      channel_(grpc::CreateChannel(address_, auth_ ? auth_->channel_credentials() : grpc::InsecureChannelCredentials())),
      stub_(peer::Peer::NewStub(channel_)),
      instance_auth_(auth_ && !auth_->instance_secret.empty() ? auth_ : [] {
        auto own = std::make_shared<PeerAuth>();
        own->instance_secret = PeerAuth::make_secret();
        return std::shared_ptr<const PeerAuth>(std::move(own));
      }()) {}

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
  Call call(this, timeout, job);
  if (!call.refused().ok()) return call.refused();
  peer::SetRequest request;
  request.set_job(job);
  request.set_key(key);
  request.set_value(value);
  request.set_if_absent(if_absent);
  peer::SetReply reply;
  call.sign("Set", request);
  const Status status = call.finish(stub_->Set(call.context(), request, &reply));
  *stored = status.ok() && reply.stored();
  return status;
}

Status PeerClient::get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                       std::vector<std::string>* values) {
  Call call(this, timeout + kSlack, job);
  if (!call.refused().ok()) return call.refused();
  peer::GetRequest request;
  request.set_job(job);
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
  peer::GetReply reply;
  call.sign("Get", request);
  const Status status = call.finish(stub_->Get(call.context(), request, &reply));
  if (status.ok()) values->assign(reply.values().begin(), reply.values().end());
  return status;
}

Status PeerClient::add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds timeout,
                       int64_t* value) {
  Call call(this, timeout, job);
  if (!call.refused().ok()) return call.refused();
  peer::AddRequest request;
  request.set_job(job);
  request.set_key(key);
  request.set_delta(delta);
  peer::AddReply reply;
  call.sign("Add", request);
  const Status status = call.finish(stub_->Add(call.context(), request, &reply));
  *value = reply.value();
  return status;
}

Status PeerClient::delete_job(const std::string& job, std::chrono::milliseconds timeout, const std::string& prefix) {
  Call call(this, timeout, job);
  if (!call.refused().ok()) return call.refused();
  peer::DeleteJobRequest request;
  request.set_job(job);
  request.set_prefix(prefix);
  peer::DeleteJobReply reply;
  call.sign("DeleteJob", request);
  return call.finish(stub_->DeleteJob(call.context(), request, &reply));
}

Status PeerClient::ping(std::chrono::milliseconds timeout) {
  Call call(this, timeout);
  if (!call.refused().ok()) return call.refused();
  peer::PingRequest request;
  peer::PingReply reply;
  call.sign("Ping", request);
  return call.finish(stub_->Ping(call.context(), request, &reply));
}

Status PeerClient::progress(const std::string& job, std::chrono::milliseconds timeout, peer::ProgressReply* reply) {
  Call call(this, timeout);
  if (!call.refused().ok()) return call.refused();
  peer::ProgressRequest request;
  request.set_job(job);
  call.sign("Progress", request);
  return call.finish(stub_->Progress(call.context(), request, reply));
}

}  // namespace gradsync
