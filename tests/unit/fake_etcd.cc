#include "tests/unit/fake_etcd.h"

#include <stdexcept>

namespace gradsync::test {
namespace {

std::string token_of(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("token");
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

grpc::Status unanswered(const char* rpc) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, std::string("the fake member has no ") + rpc);
}

}  // namespace

// etcd's four services of the fake, each call counted and handed to its handler.
class FakeEtcd::Services final : public etcdserverpb::KV::Service,
                                 public etcdserverpb::Watch::Service,
                                 public etcdserverpb::Lease::Service,
                                 public etcdserverpb::Auth::Service {
 public:
  explicit Services(FakeEtcd& fake) : fake_(fake) {}

  grpc::Status Txn(grpc::ServerContext* context, const etcdserverpb::TxnRequest* request,
                   etcdserverpb::TxnResponse* response) override {
    fake_.count("Txn");
    return fake_.handlers_.txn ? fake_.handlers_.txn(token_of(*context), *request, response) : unanswered("Txn");
  }
  grpc::Status Put(grpc::ServerContext* context, const etcdserverpb::PutRequest* request,
                   etcdserverpb::PutResponse* response) override {
    fake_.count("Put");
    return fake_.handlers_.put ? fake_.handlers_.put(token_of(*context), *request, response) : unanswered("Put");
  }
  grpc::Status Range(grpc::ServerContext* context, const etcdserverpb::RangeRequest* request,
                     etcdserverpb::RangeResponse* response) override {
    fake_.count("Range");
    return fake_.handlers_.range ? fake_.handlers_.range(token_of(*context), *request, response)
                                 : unanswered("Range");
  }
  grpc::Status LeaseGrant(grpc::ServerContext* context, const etcdserverpb::LeaseGrantRequest* request,
                          etcdserverpb::LeaseGrantResponse* response) override {
    fake_.count("LeaseGrant");
    if (fake_.handlers_.grant) return fake_.handlers_.grant(token_of(*context), *request, response);
    response->set_id(request->id());
    response->set_ttl(request->ttl());
    return grpc::Status::OK;
  }
  grpc::Status LeaseKeepAlive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<etcdserverpb::LeaseKeepAliveResponse, etcdserverpb::LeaseKeepAliveRequest>* stream)
      override {
    etcdserverpb::LeaseKeepAliveRequest request;
    while (stream->Read(&request)) {
      fake_.count("LeaseKeepAlive");
      etcdserverpb::LeaseKeepAliveResponse response;
      response.set_id(request.id());
      response.set_ttl(10);
      if (fake_.handlers_.renew) fake_.handlers_.renew(request, &response);
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }
  grpc::Status Watch(grpc::ServerContext* context, WatchStream* stream) override {
    fake_.count("Watch");
    etcdserverpb::WatchRequest request;
    if (!stream->Read(&request)) return grpc::Status::OK;
    if (!fake_.handlers_.watch) return unanswered("Watch");
    return fake_.handlers_.watch(token_of(*context), request.create_request(), stream);
  }
  grpc::Status Authenticate(grpc::ServerContext*, const etcdserverpb::AuthenticateRequest*,
                            etcdserverpb::AuthenticateResponse* response) override {
    response->set_token("token-" + std::to_string(fake_.count("Authenticate")));
    return grpc::Status::OK;
  }

 private:
  FakeEtcd& fake_;
};

FakeEtcd::FakeEtcd(Handlers handlers) : handlers_(std::move(handlers)), services_(std::make_unique<Services>(*this)) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(static_cast<etcdserverpb::KV::Service*>(services_.get()));
  builder.RegisterService(static_cast<etcdserverpb::Watch::Service*>(services_.get()));
  builder.RegisterService(static_cast<etcdserverpb::Lease::Service*>(services_.get()));
  builder.RegisterService(static_cast<etcdserverpb::Auth::Service*>(services_.get()));
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) throw std::runtime_error("the fake etcd member could not listen on loopback");
}

FakeEtcd::~FakeEtcd() {
  server_->Shutdown(std::chrono::system_clock::now());  // cancels what is still in flight
  server_->Wait();
}

int FakeEtcd::count(const std::string& rpc) {
  MutexLock lock(mutex_);
  return ++calls_[rpc];
}

int FakeEtcd::calls(const std::string& rpc) const {
  MutexLock lock(mutex_);
  auto it = calls_.find(rpc);
  return it == calls_.end() ? 0 : it->second;
}

void FakeEtcd::hold(WatchStream* stream) {
  etcdserverpb::WatchRequest ignored;
  while (stream->Read(&ignored)) {
  }
}

}  // namespace gradsync::test
