#include "daemon/peer/peer_client.h"

#include "daemon/peer/peer_server.h"

namespace gradsync {
namespace {

// Slack beyond a blocking get's own timeout, so the server answers "timeout" before the
// client's deadline turns it into "unreachable".
constexpr auto kSlack = std::chrono::seconds(2);

void bound(grpc::ClientContext* context, std::chrono::milliseconds timeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

}  // namespace

PeerClient::PeerClient(std::string address)
    : address_(std::move(address)),
      channel_(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials())),
      stub_(peer::Peer::NewStub(channel_)) {}

Status PeerClient::set(const std::string& job, const std::string& key, const std::string& value,
                       std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  bound(&context, timeout);
  peer::SetRequest request;
  request.set_job(job);
  request.set_key(key);
  request.set_value(value);
  peer::SetReply reply;
  return from_grpc(stub_->Set(&context, request, &reply), "peer daemon at " + address_);
}

Status PeerClient::get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                       std::vector<std::string>* values) {
  grpc::ClientContext context;
  bound(&context, timeout + kSlack);
  peer::GetRequest request;
  request.set_job(job);
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
  peer::GetReply reply;
  const Status status = from_grpc(stub_->Get(&context, request, &reply), "peer daemon at " + address_);
  if (status.ok()) values->assign(reply.values().begin(), reply.values().end());
  return status;
}

Status PeerClient::add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds timeout,
                       int64_t* value) {
  grpc::ClientContext context;
  bound(&context, timeout);
  peer::AddRequest request;
  request.set_job(job);
  request.set_key(key);
  request.set_delta(delta);
  peer::AddReply reply;
  const Status status = from_grpc(stub_->Add(&context, request, &reply), "peer daemon at " + address_);
  *value = reply.value();
  return status;
}

Status PeerClient::delete_job(const std::string& job, std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  bound(&context, timeout);
  peer::DeleteJobRequest request;
  request.set_job(job);
  peer::DeleteJobReply reply;
  return from_grpc(stub_->DeleteJob(&context, request, &reply), "peer daemon at " + address_);
}

Status PeerClient::ping(std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  bound(&context, timeout);
  peer::PingRequest request;
  peer::PingReply reply;
  return from_grpc(stub_->Ping(&context, request, &reply), "peer daemon at " + address_);
}

}  // namespace gradsync
