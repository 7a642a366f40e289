// A stand-in for one etcd member on loopback, in process, for the answers a real etcd never
// gives and the refusals it gives only in states a test cannot easily reach: the test says
// what each call answers. It speaks etcd's own gRPC API (proto/etcd), so the daemon's etcd
// store (daemon/rendezvous/etcd_store.h) talks to it as to a member.
//
// Every unary call's and watch's token (the "token" metadata) is handed to its handler;
// renewals and Authenticate get none. Handlers run on gRPC's threads. Authenticate answers
// "token-1", "token-2", ... for any user and password. A call with no handler answers what
// etcd would for the simplest case: a lease grant grants the ID asked for with its TTL, a
// renewal renews for 10 s; the others are refused as UNIMPLEMENTED.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "proto/etcd/rpc.grpc.pb.h"
#include "shared/mutex.h"

namespace gradsync::test {

class FakeEtcd {
 public:
  using WatchStream = grpc::ServerReaderWriter<etcdserverpb::WatchResponse, etcdserverpb::WatchRequest>;
  using WatchHandler =
      std::function<grpc::Status(const std::string& token, const etcdserverpb::WatchCreateRequest&, WatchStream*)>;
  template <typename Request, typename Response>
  using Unary = std::function<grpc::Status(const std::string& token, const Request&, Response*)>;
  struct Handlers {
    Unary<etcdserverpb::TxnRequest, etcdserverpb::TxnResponse> txn;
    Unary<etcdserverpb::PutRequest, etcdserverpb::PutResponse> put;
    Unary<etcdserverpb::RangeRequest, etcdserverpb::RangeResponse> range;
    Unary<etcdserverpb::LeaseGrantRequest, etcdserverpb::LeaseGrantResponse> grant;
    // One renewal of the keep-alive stream.
    std::function<void(const etcdserverpb::LeaseKeepAliveRequest&, etcdserverpb::LeaseKeepAliveResponse*)> renew;
    // A watch, given its create request; the stream stays open while this runs.
    WatchHandler watch;
  };

  explicit FakeEtcd(Handlers handlers);
  ~FakeEtcd();  // ends every call in flight
  FakeEtcd(const FakeEtcd&) = delete;
  FakeEtcd& operator=(const FakeEtcd&) = delete;

  // "127.0.0.1:PORT"
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // How many calls of `rpc` ("Txn", "Watch", "Authenticate", ...) arrived.
  int calls(const std::string& rpc) const;

  // Reads the rest of a watch's stream until the client ends it: what a watch that has said
  // all it will does while the client decides.
  static void hold(WatchStream* stream);

 private:
  class Services;
  // Counts a call of `rpc`; returns how many there were, this one included.
  int count(const std::string& rpc);

  const Handlers handlers_;
  mutable Mutex mutex_;
  std::map<std::string, int> calls_ GS_GUARDED_BY(mutex_);
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace gradsync::test
