#include "daemon/rendezvous/etcd_session.h"

#include <algorithm>

#include "daemon/peer/peer_server.h"  // from_grpc
#include "daemon/util/safe_text.h"

namespace gradsync {
namespace {

// etcd's metadata key for the authentication token (its clientv3 sends the same).
constexpr char kTokenKey[] = "token";
// How long a keep-alive round or an authentication may take.
constexpr auto kRoundBound = std::chrono::seconds(2);

// Whether etcd refused the call's token (expired, or issued by another member).
bool token_refused(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         status.error_message().find("invalid auth token") != std::string::npos;
}

// Whether the member (or the way to it) failed, rather than the request: another member may
// serve it.
bool member_failed(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE;
}

// Whether the failed attempt never reached etcd: gRPC found no connection to the member. Any
// other failure (a connection lost mid-call, etcd's "no leader" or timed-out proposal) may have
// left the write applied.
bool never_sent(const grpc::Status& status) {
  return status.error_message().find("failed to connect") != std::string::npos;
}

}  // namespace

Status EtcdCalls::enter(grpc::ClientContext* context) {
  MutexLock lock(mutex_);
  if (!cancelled_.ok()) return cancelled_;
  in_flight_.insert(context);
  return Status();
}

void EtcdCalls::leave(grpc::ClientContext* context) {
  MutexLock lock(mutex_);
  in_flight_.erase(context);
}

void EtcdCalls::cancel(const Status& why) {
  MutexLock lock(mutex_);
  if (!cancelled_.ok()) return;
  cancelled_ = why.ok() ? Status::aborted("cancelled") : why;
  for (grpc::ClientContext* context : in_flight_) context->TryCancel();
}

Status EtcdCalls::cancelled() const {
  MutexLock lock(mutex_);
  return cancelled_;
}

EtcdSession::EtcdSession(std::shared_ptr<const EtcdAccess> access, std::vector<std::string> members, Logger log)
    : access_(std::move(access)), log_(std::move(log)) {
  for (const std::string& address : members) {
    auto channel = access_->channel(address);
    members_.push_back(Stubs{address, etcdserverpb::KV::NewStub(channel), etcdserverpb::Watch::NewStub(channel),
                             etcdserverpb::Lease::NewStub(channel), etcdserverpb::Auth::NewStub(channel)});
    describe_ += (describe_.empty() ? "etcd at " : ",") + address;
  }
}

EtcdSession::~EtcdSession() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  own_calls_.cancel(Status::aborted("the job's etcd session ended"));
  if (keeper_.joinable()) keeper_.join();
}

Status EtcdSession::run(EtcdCalls& calls, Clock::time_point deadline, Retry retry, const std::string& what,
                        const Attempt& attempt) {
  bool reauthenticated = false;
  size_t failed_members = 0;
  Status last;
  while (true) {
    size_t index = 0;
    std::string token;
    {
      MutexLock lock(mutex_);
      index = current_;
      token = token_;
    }
    Stubs& member = members_[index];
    if (!access_->user().empty() && token.empty()) {
      if (Status s = authenticate(member, deadline); !s.ok()) return s;
      MutexLock lock(mutex_);
      token = token_;
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::max(Clock::duration(0), deadline - Clock::now()));
    if (!token.empty()) context.AddMetadata(kTokenKey, token);
    if (Status s = calls.enter(&context); !s.ok()) return s;
    EtcdMember stubs{member.address, *member.kv, *member.watch, *member.lease};
    const grpc::Status status = attempt(stubs, &context);
    calls.leave(&context);
    if (status.ok()) return Status();
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      if (Status why = calls.cancelled(); !why.ok()) return why;
    }
    last = from_grpc(status, describe_ + ": " + what + " at member " + member.address);
    if (token_refused(status) && !access_->user().empty() && !reauthenticated) {
      reauthenticated = true;
      {
        MutexLock lock(mutex_);
        if (token_ == token) token_.clear();
      }
      continue;
    }
    const bool movable = member_failed(status) && (retry == Retry::kIdempotent || never_sent(status));
    if (!movable || ++failed_members >= members_.size() * 2 || Clock::now() >= deadline) return last;
    {
      MutexLock lock(mutex_);
      if (current_ == index) {
        current_ = (index + 1) % members_.size();
        token_.clear();  // a simple token is valid only at the member that issued it
      }
    }
    log_.info(describe_ + ": member " + member.address + " is unreachable (" + safe_text(status.error_message(), 200) +
              "); trying the next");
    // A member refused at once (connection refused) would otherwise be retried in a busy loop
    // once every member was tried.
    if (failed_members >= members_.size()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Status EtcdSession::authenticate(Stubs& member, Clock::time_point deadline) {
  etcdserverpb::AuthenticateRequest request;
  request.set_name(access_->user());
  request.set_password(access_->password());
  etcdserverpb::AuthenticateResponse response;
  grpc::ClientContext context;
  const auto bound = std::min(deadline, Clock::now() + kRoundBound);
  context.set_deadline(std::chrono::system_clock::now() + std::max(Clock::duration(0), bound - Clock::now()));
  const grpc::Status status = member.auth->Authenticate(&context, request, &response);
  if (!status.ok()) {
    return from_grpc(status, describe_ + ": authenticating as etcd user '" + safe_text(access_->user(), 64) +
                                 "' (--etcd-user) at member " + member.address);
  }
  MutexLock lock(mutex_);
  token_ = response.token();
  return Status();
}

Status EtcdSession::grant(EtcdCalls& calls, Clock::time_point deadline, std::chrono::seconds ttl, int64_t* id) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl.count());
  etcdserverpb::LeaseGrantResponse response;
  Status status = run(calls, deadline, Retry::kIdempotent, "granting a lease", [&](EtcdMember& m, grpc::ClientContext* c) {
    return m.lease.LeaseGrant(c, request, &response);
  });
  if (status.ok() && !response.error().empty()) {
    status = Status::internal(describe_ + ": granting a lease: " + safe_text(response.error(), 200));
  }
  if (status.ok()) *id = response.id();
  return status;
}

Status EtcdSession::node_lease(EtcdCalls& calls, Clock::time_point deadline, int64_t* id) {
  MutexLock grant_lock(lease_mutex_);
  {
    MutexLock lock(mutex_);
    if (node_lease_ != 0) {
      *id = node_lease_;
      return Status();
    }
  }
  int64_t granted = 0;
  if (Status s = grant(calls, deadline, access_->lease_ttl(), &granted); !s.ok()) return s;
  {
    MutexLock lock(mutex_);
    node_lease_ = granted;
  }
  keeper_ = std::thread([this] { keep_alive(); });
  *id = granted;
  return Status();
}

Status EtcdSession::counter_lease(EtcdCalls& calls, Clock::time_point deadline, int64_t* id) {
  MutexLock grant_lock(lease_mutex_);
  {
    MutexLock lock(mutex_);
    if (counter_lease_ != 0) {
      *id = counter_lease_;
      return Status();
    }
  }
  int64_t granted = 0;
  if (Status s = grant(calls, deadline, access_->counter_ttl(), &granted); !s.ok()) return s;
  MutexLock lock(mutex_);
  counter_lease_ = granted;
  *id = granted;
  return Status();
}

void EtcdSession::keep_alive() {
  // A third of the TTL between rounds: two rounds may fail (a member killed, the next one
  // found) before the lease runs out.
  const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(access_->lease_ttl()) / 3;
  int64_t id = 0;
  {
    MutexLock lock(mutex_);
    id = node_lease_;
  }
  bool warned = false;
  while (true) {
    {
      MutexLock lock(mutex_);
      const auto wake_at = Clock::now() + period;
      while (!stopping_ && Clock::now() < wake_at) wake_.wait_until(lock, wake_at);
      if (stopping_) return;
    }
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(id);
    etcdserverpb::LeaseKeepAliveResponse response;
    bool answered = false;
    const Status status =
        run(own_calls_, Clock::now() + std::min<Clock::duration>(period, kRoundBound), Retry::kIdempotent,
            "keeping this node's lease alive", [&](EtcdMember& m, grpc::ClientContext* c) {
              auto stream = m.lease.LeaseKeepAlive(c);
              answered = stream->Write(request) && stream->Read(&response);
              stream->WritesDone();
              if (answered) c->TryCancel();  // one round per stream: done
              const grpc::Status finished = stream->Finish();
              return answered ? grpc::Status::OK : finished;
            });
    if (status.ok() && response.ttl() <= 0) {
      // The lease ran out (etcd unreachable for longer than its TTL): this node's keys are gone,
      // and the job's waits will name it. Nothing brings them back.
      log_.error(describe_ + ": this node's lease ran out: its keys in etcd are gone");
      return;
    }
    if (!status.ok() && !warned && own_calls_.cancelled().ok()) {
      log_.warning(status.message() + "; its keys go " + std::to_string(access_->lease_ttl().count()) +
                   " s after the last renewal");
    }
    warned = !status.ok();
  }
}

}  // namespace gradsync
