#include "daemon/rendezvous/etcd_session.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "daemon/peer/peer_auth.h"    // make_secret
#include "daemon/peer/peer_server.h"  // from_grpc
#include "daemon/util/safe_text.h"

namespace gradsync {
namespace {

// etcd's metadata keys: the authentication token, and "refuse this call unless you have a
// leader" (clientv3's WithRequireLeader), so that a member cut off from the others ends our
// watches and renewals instead of holding them.
constexpr char kTokenKey[] = "token";
constexpr char kLeaderKey[] = "hasleader";
// How long an authentication may take at one member.
constexpr auto kAuthBound = std::chrono::seconds(2);
// The pause after each round of the members that all failed: doubling, at most a second.
constexpr auto kFirstPause = std::chrono::milliseconds(50);
constexpr auto kMostPause = std::chrono::milliseconds(1000);

std::chrono::system_clock::time_point system_deadline(EtcdSession::Clock::time_point deadline) {
  return std::chrono::system_clock::now() +
         std::max(EtcdSession::Clock::duration(0), deadline - EtcdSession::Clock::now());
}

// Whether etcd refused the call's token: expired, issued by another member (simple tokens are
// per member), or older than a change of etcd's users and roles (clientv3 refreshes on the
// same three).
bool token_refused(const grpc::Status& status) {
  const std::string& m = status.error_message();
  return status.error_code() == grpc::StatusCode::UNAUTHENTICATED || m.find("invalid auth token") != std::string::npos ||
         m.find("revision of auth store is old") != std::string::npos;
}

// Whether the failed attempt never reached etcd: gRPC found no connection to the member. Any
// other failure (a connection lost mid-call, an attempt past its bound, etcd's "no leader") may
// have left a write applied.
bool never_sent(const grpc::Status& status) {
  return status.error_message().find("failed to connect") != std::string::npos;
}

// What to do about an etcd error whose words do not say it.
std::string hint(const grpc::Status& status) {
  if (status.error_message().find("user name is empty") != std::string::npos) {
    return " (etcd requires authentication: give gradsyncd --etcd-user and --etcd-password-file)";
  }
  return "";
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
                        const Attempt& attempt, Clock::duration attempt_bound) {
  std::string refused;  // the token the member refused, to be replaced
  bool reauthenticated = false;
  size_t failures = 0;
  auto pause = std::chrono::duration_cast<Clock::duration>(kFirstPause);
  while (true) {
    size_t index = 0;
    {
      MutexLock lock(mutex_);
      index = current_;
    }
    Stubs& member = members_[index];
    std::string token;
    Status failed;
    if (!access_->user().empty()) {
      failed = this->token(calls, member, deadline, refused, &token);
      refused.clear();
      // A wrong password or a cancellation ends the call; an unreachable member is left.
      if (!failed.ok() && failed.code() != ErrorCode::kPeerLost && failed.code() != ErrorCode::kTimeout) return failed;
    }
    if (failed.ok()) {
      grpc::ClientContext context;
      const auto until = attempt_bound > Clock::duration::zero() ? std::min(deadline, Clock::now() + attempt_bound)
                                                                 : deadline;
      context.set_deadline(system_deadline(until));
      if (!token.empty()) context.AddMetadata(kTokenKey, token);
      context.AddMetadata(kLeaderKey, "true");
      if (Status s = calls.enter(&context); !s.ok()) return s;
      EtcdMember stubs{member.address, *member.kv, *member.watch, *member.lease};
      const grpc::Status status = attempt(stubs, &context);
      calls.leave(&context);
      if (status.ok()) return Status();
      if (status.error_code() == grpc::StatusCode::CANCELLED) {
        if (Status why = calls.cancelled(); !why.ok()) return why;
      }
      failed = from_grpc(status, describe_ + ": " + what + " at member " + member.address);
      if (!hint(status).empty()) failed = Status(failed.code(), failed.message() + hint(status));
      if (token_refused(status) && !access_->user().empty() && !reauthenticated) {
        reauthenticated = true;
        refused = token;
        continue;
      }
      // The attempt's own bound passed, not the call's: the member is frozen or cut off.
      const bool stalled = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && Clock::now() < deadline;
      const bool member_failed = status.error_code() == grpc::StatusCode::UNAVAILABLE || stalled;
      if (!member_failed || (retry == Retry::kNotSent && !never_sent(status))) return failed;
    }
    if (Clock::now() >= deadline) return failed;
    {
      MutexLock lock(mutex_);
      if (current_ == index) current_ = (index + 1) % members_.size();
    }
    if (failures++ == 0) {
      log_.info(describe_ + ": member " + member.address + " failed (" + safe_text(failed.message(), 300) +
                "); trying the next");
    }
    if (failures % members_.size() == 0) {
      // Every member failed once more: pause (a member refusing at once would make a busy loop),
      // in slices, so that a cancellation is not kept waiting.
      const auto resume = std::min(deadline, Clock::now() + pause);
      while (Clock::now() < resume) {
        if (Status why = calls.cancelled(); !why.ok()) return why;
        std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), resume - Clock::now()));
      }
      pause = std::min<Clock::duration>(pause * 2, kMostPause);
    }
  }
}

Status EtcdSession::token(EtcdCalls& calls, Stubs& member, Clock::time_point deadline, const std::string& refused,
                          std::string* out) {
  EtcdTokens& tokens = access_->tokens();
  if (!refused.empty()) tokens.refused(member.address, refused);
  *out = tokens.get(member.address);
  if (!out->empty()) return Status();
  const auto bound = std::min(deadline, Clock::now() + kAuthBound);
  std::unique_lock<std::timed_mutex> held(tokens.authenticating(member.address), std::defer_lock);
  if (!held.try_lock_until(bound)) {
    return Status::timeout(describe_ + ": another authentication at member " + member.address + " took over " +
                           std::to_string(kAuthBound.count()) + " s");
  }
  *out = tokens.get(member.address);  // another job's, made while this one waited
  if (!out->empty()) return Status();
  etcdserverpb::AuthenticateRequest request;
  request.set_name(access_->user());
  request.set_password(access_->password());
  etcdserverpb::AuthenticateResponse response;
  grpc::ClientContext context;
  context.set_deadline(system_deadline(bound));
  if (Status s = calls.enter(&context); !s.ok()) return s;
  const grpc::Status status = member.auth->Authenticate(&context, request, &response);
  calls.leave(&context);
  if (status.error_code() == grpc::StatusCode::CANCELLED) {
    if (Status why = calls.cancelled(); !why.ok()) return why;
  }
  if (!status.ok()) {
    return from_grpc(status, describe_ + ": authenticating as etcd user '" + safe_text(access_->user(), 64) +
                                 "' (--etcd-user) at member " + member.address);
  }
  tokens.set(member.address, response.token());
  *out = response.token();
  return Status();
}

Status EtcdSession::grant(EtcdCalls& calls, Clock::time_point deadline, std::chrono::seconds ttl, int64_t* id) {
  // The lease's ID is ours, drawn at random: a grant whose answer was lost is made again, and
  // "already exists" then says the first one took (two grants never leave two leases).
  int64_t wanted = 0;
  const std::string random = PeerAuth::make_secret();
  std::memcpy(&wanted, random.data(), sizeof wanted);
  wanted = (wanted & std::numeric_limits<int64_t>::max()) | 1;
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl.count());
  request.set_id(wanted);
  etcdserverpb::LeaseGrantResponse response;
  const Status status = run(calls, deadline, Retry::kIdempotent, "granting a lease", [&](EtcdMember& m, grpc::ClientContext* c) {
    return m.lease.LeaseGrant(c, request, &response);
  });
  if (!status.ok() && status.message().find("lease already exists") != std::string::npos) {
    *id = wanted;
    return Status();
  }
  if (!status.ok()) return status;
  if (!response.error().empty()) return Status::internal(describe_ + ": granting a lease: " + safe_text(response.error(), 200));
  // etcd grants the ID asked for; a member that grants another (or none, 0) is not etcd.
  if (response.id() != wanted || response.ttl() <= 0) {
    return Status::protocol(describe_ + ": a lease grant answered lease " + std::to_string(response.id()) +
                            " with TTL " + std::to_string(response.ttl()) + ": not etcd's answer");
  }
  *id = wanted;
  return Status();
}

Status EtcdSession::lease(EtcdCalls& calls, Clock::time_point deadline, Lease kind, int64_t* id) {
  const auto held_lease = [&] {
    MutexLock lock(mutex_);
    return kind == Lease::kNode ? node_lease_ : job_lease_;
  };
  if ((*id = held_lease()) != 0) return Status();
  std::unique_lock<std::timed_mutex> granting(grant_mutex_, std::defer_lock);
  if (!granting.try_lock_until(deadline)) return Status::timeout(describe_ + ": another call's lease grant took too long");
  if ((*id = held_lease()) != 0) return Status();  // granted while this one waited
  int64_t granted = 0;
  const std::chrono::seconds ttl = kind == Lease::kNode ? access_->lease_ttl() : access_->counter_ttl();
  if (Status s = grant(calls, deadline, ttl, &granted); !s.ok()) return s;
  {
    MutexLock lock(mutex_);
    (kind == Lease::kNode ? node_lease_ : job_lease_) = granted;
  }
  // keeper_ is started here only, under grant_mutex_; it renews whichever leases are current.
  if (!keeper_.joinable()) keeper_ = std::thread([this] { keep_alive(); });
  *id = granted;
  return Status();
}

void EtcdSession::lease_lost(Lease kind, int64_t id) {
  {
    MutexLock lock(mutex_);
    int64_t& held = kind == Lease::kNode ? node_lease_ : job_lease_;
    if (held != id) return;  // already replaced
    held = 0;
  }
  log_.error(describe_ + ": etcd no longer has " +
             (kind == Lease::kNode ? "this node's lease (it ran out while etcd could not be reached for " +
                                         std::to_string(access_->lease_ttl().count()) + " s, or was revoked)"
                                   : "the job's lease of its counters and notices (it ran out while etcd could not "
                                     "be reached for --peer-key-ttl-s, " + std::to_string(access_->counter_ttl().count()) +
                                         " s, or was revoked)") +
             ": the keys that lived on it are gone; the next write takes a new lease");
}

Status EtcdSession::renew(int64_t id, Clock::duration bound, const std::string& what, bool* lost) {
  *lost = false;
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse response;
  const Status status = run(
      own_calls_, Clock::now() + bound, Retry::kIdempotent, "renewing " + what,
      [&](EtcdMember& m, grpc::ClientContext* c) {
        auto stream = m.lease.LeaseKeepAlive(c);
        const bool answered = stream->Write(request) && stream->Read(&response);
        stream->WritesDone();
        if (answered) c->TryCancel();  // one renewal per stream: done
        const grpc::Status finished = stream->Finish();
        return answered ? grpc::Status::OK : finished;
      },
      bound / 2);
  *lost = (status.ok() && response.ttl() <= 0) ||
          (!status.ok() && status.message().find("requested lease not found") != std::string::npos);
  return status;
}

void EtcdSession::keep_alive() {
  // Each lease every third of its own TTL, the node's first: the node's (--etcd-lease-ttl-s)
  // so that a member that stalls is left for the next within the same renewal (half the period
  // for an attempt); the job's (--peer-key-ttl-s) so that what lives on it goes that long
  // after the job's last session on this node, as node 0's store keeps a job's keys that long
  // after their last use, not that long after the lease's grant. The thread wakes at the
  // shorter of the two periods.
  const auto node_period = std::chrono::duration_cast<Clock::duration>(access_->lease_ttl()) / 3;
  const auto job_period = std::chrono::duration_cast<Clock::duration>(access_->counter_ttl()) / 3;
  const auto tick = std::min(node_period, job_period);
  bool warned = false;
  auto node_tried = Clock::now();
  auto job_tried = Clock::now();
  while (true) {
    int64_t node = 0, job = 0;
    {
      MutexLock lock(mutex_);
      const auto wake_at = Clock::now() + tick;
      while (!stopping_ && Clock::now() < wake_at) wake_.wait_until(lock, wake_at);
      if (stopping_) return;
      node = node_lease_;
      job = job_lease_;
    }
    if (node != 0 && Clock::now() - node_tried >= node_period) {
      bool lost = false;
      const Status status = renew(node, node_period, "this node's lease", &lost);
      node_tried = Clock::now();
      if (lost) {
        lease_lost(Lease::kNode, node);
      } else {
        if (!status.ok() && !warned && own_calls_.cancelled().ok()) {
          log_.warning(status.message() + "; this node's keys go " + std::to_string(access_->lease_ttl().count()) +
                       " s after the last renewal");
        }
        warned = !status.ok();
      }
    }
    if (job != 0 && Clock::now() - job_tried >= job_period) {
      bool lost = false;
      const Status status = renew(job, std::min(node_period, job_period), "the job's lease", &lost);
      job_tried = Clock::now();
      if (lost) lease_lost(Lease::kJob, job);
    }
  }
}

}  // namespace gradsync
