#include "daemon/rendezvous/etcd_store.h"

#include <algorithm>
#include <limits>
#include <map>
#include <thread>

#include "daemon/peer/peer_auth.h"
#include "daemon/util/safe_text.h"

namespace gradsync {
namespace {

// Ranges per read transaction: etcd refuses a transaction of more than --max-txn-ops (128 by
// default).
constexpr size_t kRangesPerTxn = 64;
// A read that answers at once (a get of timeout 0, a peek) still needs a bound for the call.
constexpr auto kReadBound = std::chrono::seconds(2);
// The pause before reading again after a watch found its revision compacted.
constexpr auto kCompactionPause = std::chrono::milliseconds(100);

// The first key after every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string common_prefix(const std::vector<std::string>& paths) {
  std::string prefix = paths.empty() ? std::string() : paths.front();
  for (const std::string& p : paths) {
    size_t n = 0;
    while (n < prefix.size() && n < p.size() && prefix[n] == p[n]) ++n;
    prefix.resize(n);
  }
  return prefix;
}

// Whether a call failed for an answer above the daemon's bound for one reply (gRPC's words name
// the bound).
bool above_reply_bound(const Status& status) {
  return status.message().find("larger than max") != std::string::npos &&
         status.message().find(std::to_string(EtcdAccess::kMaxReply)) != std::string::npos;
}

// etcd refuses a request above its --max-request-bytes (1.5 MiB by default), and its gRPC server
// one above 2 MiB: say so. A reply above the daemon's own bound is said as such.
Status explain_size(Status status) {
  if (status.ok() || (status.message().find("request is too large") == std::string::npos &&
                      status.message().find("larger than max") == std::string::npos)) {
    return status;
  }
  if (above_reply_bound(status)) {
    return Status(status.code(), status.message() + " (an answer above the " +
                                     std::to_string(EtcdAccess::kMaxReply >> 20) +
                                     " MiB the daemon takes from an etcd member in one reply: one key's value "
                                     "alone, or a watch's fragment, was larger)");
  }
  return Status(status.code(), status.message() +
                                   " (a value above etcd's --max-request-bytes, 1.5 MiB by default: a tensor set's "
                                   "layout record takes about 15 bytes a tensor; raise the limit on the members)");
}

// A watch etcd cancelled (not for compaction), as a call's status. etcd 3.4 refuses a watch
// whose token it cannot check (expired, or from before the member restarted) as "permission
// denied", not as a bad token: with a user, that is made a refused token, so the call logs in
// again once before it takes the refusal for what it says.
grpc::Status cancelled_watch(const std::string& reason, bool with_user) {
  if (reason.find("permission denied") != std::string::npos) {
    return grpc::Status(with_user ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::PERMISSION_DENIED,
                        "the watch was refused: " + reason);
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, "the watch was cancelled: " + reason);
}

// A counter's version as etcd answered it, checked: at least `least` (a count made is at least
// 1, a read may find none) and short of int64's end (a count adds one to it).
Status checked_version(const std::string& store, const std::string& key, int64_t version, int64_t least,
                       int64_t* out) {
  if (version < least || version == std::numeric_limits<int64_t>::max()) {
    return Status::protocol(store + ": counter " + safe_text(key, 200) + " found version " + std::to_string(version) +
                            ": not etcd's");
  }
  *out = version;
  return Status();
}

// 16 random bytes in hex: a counting put's own value.
std::string nonce_hex() {
  const std::string secret = PeerAuth::make_secret();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (size_t i = 0; i < 16 && i < secret.size(); ++i) {
    hex += kHex[static_cast<unsigned char>(secret[i]) >> 4];
    hex += kHex[static_cast<unsigned char>(secret[i]) & 15];
  }
  return hex;
}

}  // namespace

std::string EtcdStore::path(const std::string& job, const std::string& key) const {
  return session_->access().prefix() + job + "/" + key;
}

Status EtcdStore::read(const std::vector<std::string>& paths, Clock::time_point deadline,
                       std::vector<std::optional<std::string>>* found, int64_t* revision) {
  found->assign(paths.size(), std::nullopt);
  *revision = 0;
  // Keys per transaction: kRangesPerTxn, halved (down to one) while an answer is above the
  // daemon's bound for one reply, which 64 values of a raised --max-request-bytes can be.
  size_t batch = kRangesPerTxn;
  for (size_t first = 0; first < paths.size();) {
    const size_t last = std::min(paths.size(), first + batch);
    etcdserverpb::TxnRequest request;
    for (size_t i = first; i < last; ++i) request.add_success()->mutable_request_range()->set_key(paths[i]);
    etcdserverpb::TxnResponse response;
    const Status status = session_->run(calls_, deadline, EtcdSession::Retry::kIdempotent, "reading keys",
                                        [&](EtcdMember& m, grpc::ClientContext* c) {
                                          return m.kv.Txn(c, request, &response);
                                        });
    if (!status.ok() && last - first > 1 && above_reply_bound(status)) {
      batch = (last - first) / 2;
      continue;
    }
    if (!status.ok()) return explain_size(status);
    if (response.responses_size() != static_cast<int>(last - first)) {
      return Status::protocol(describe() + ": a read of " + std::to_string(last - first) + " keys answered " +
                              std::to_string(response.responses_size()));
    }
    for (size_t i = first; i < last; ++i) {
      const auto& range = response.responses(static_cast<int>(i - first)).response_range();
      if (range.kvs_size() > 0) (*found)[i] = range.kvs(0).value();
    }
    const int64_t at = response.header().revision();
    if (at < 0 || at == std::numeric_limits<int64_t>::max()) {
      return Status::protocol(describe() + ": a read answered at revision " + std::to_string(at) + ": not etcd's");
    }
    *revision = *revision == 0 ? at : std::min(*revision, at);
    first = last;
  }
  return Status();
}

Status EtcdStore::watch(const std::vector<std::string>& paths, int64_t revision, Clock::time_point deadline,
                        std::vector<std::optional<std::string>>* found, bool* compacted) {
  *compacted = false;
  std::map<std::string, std::vector<size_t>> wanted;  // a key may be asked for twice
  std::vector<std::string> missing;
  for (size_t i = 0; i < paths.size(); ++i) {
    if ((*found)[i]) continue;
    wanted[paths[i]].push_back(i);
    missing.push_back(paths[i]);
  }
  if (wanted.empty()) return Status();
  // One watcher over the range the missing keys share; events of other keys in it are skipped.
  // Fragmented: a watcher that catches up gets many events, in replies of bounded size.
  const std::string from = common_prefix(missing);
  etcdserverpb::WatchRequest request;
  auto* create = request.mutable_create_request();
  create->set_key(from);
  create->set_range_end(prefix_end(from));
  create->set_start_revision(revision + 1);
  create->set_fragment(true);
  create->add_filters(etcdserverpb::WatchCreateRequest::NODELETE);
  return session_->run(
      calls_, deadline, EtcdSession::Retry::kIdempotent, "waiting for keys",
      [&](EtcdMember& m, grpc::ClientContext* c) -> grpc::Status {
        auto stream = m.watch.Watch(c);
        if (!stream->Write(request)) return stream->Finish();
        etcdserverpb::WatchResponse response;
        while (stream->Read(&response)) {
          if (response.compact_revision() > 0 || response.canceled()) {
            *compacted = response.compact_revision() > 0;
            const std::string reason = response.cancel_reason();
            c->TryCancel();
            stream->Finish();
            if (*compacted) return grpc::Status::OK;
            return cancelled_watch(reason, !session_->access().user().empty());
          }
          // Every event of the reply, so that a key put twice in it gives its latest value.
          for (const auto& event : response.events()) {
            auto it = wanted.find(event.kv().key());
            if (it == wanted.end()) continue;
            for (size_t i : it->second) (*found)[i] = event.kv().value();
          }
          for (auto it = wanted.begin(); it != wanted.end();) {
            it = (*found)[it->second.front()] ? wanted.erase(it) : std::next(it);
          }
          if (wanted.empty()) {
            c->TryCancel();  // every key is here: end the stream
            stream->Finish();
            return grpc::Status::OK;
          }
        }
        const grpc::Status finished = stream->Finish();
        // etcd never ends a watch by itself: one that ends well without the keys is not etcd.
        return finished.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "the watch ended without the keys") : finished;
      },
      EtcdSession::Clock::duration::zero());
}

Status EtcdStore::get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                      std::vector<std::string>* values) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  std::vector<std::string> paths;
  for (const std::string& key : keys) paths.push_back(path(job, key));
  std::vector<std::optional<std::string>> found;
  Status status;
  while (true) {
    int64_t revision = 0;
    status = read(paths, std::max(deadline, start + std::chrono::duration_cast<Clock::duration>(kReadBound)), &found,
                  &revision);
    if (!status.ok()) return status;
    if (std::all_of(found.begin(), found.end(), [](const auto& v) { return v.has_value(); })) break;
    if (timeout.count() == 0 || Clock::now() >= deadline) {
      status = Status::timeout("not there yet");
      break;
    }
    bool compacted = false;
    status = watch(paths, revision, deadline, &found, &compacted);
    if (!status.ok() || !compacted) break;
    // etcd compacted past the read: read again, after a pause, so that a member answering
    // every watch so (no etcd would) cannot make a busy loop of it.
    std::this_thread::sleep_for(std::min<Clock::duration>(kCompactionPause, std::max<Clock::duration>(
                                                                                 Clock::duration::zero(),
                                                                                 deadline - Clock::now())));
  }
  if (status.ok() && !std::all_of(found.begin(), found.end(), [](const auto& v) { return v.has_value(); })) {
    status = Status::protocol(describe() + ": a watch ended without the keys it waited for");
  }
  if (status.code() == ErrorCode::kTimeout) {
    size_t late = 0;
    std::string first;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (found[i]) continue;
      if (late++ == 0) first = keys[i];
    }
    return Status::timeout(describe() + ": " + std::to_string(late) + " of " + std::to_string(keys.size()) +
                           " keys did not appear within " + std::to_string(timeout.count()) + " ms (the first: " +
                           safe_text(first, 200) + ")");
  }
  if (!status.ok()) return explain_size(status);
  values->clear();
  for (auto& value : found) values->push_back(std::move(*value));
  return Status();
}

Status EtcdStore::peek(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                       std::vector<std::optional<std::string>>* values) {
  std::vector<std::string> paths;
  for (const std::string& key : keys) paths.push_back(path(job, key));
  int64_t revision = 0;
  return read(paths, Clock::now() + timeout, values, &revision);
}

Status EtcdStore::write(Lease kind, Clock::time_point deadline, EtcdSession::Retry retry, const std::string& what,
                        const LeasedAttempt& attempt) {
  for (int round = 0;; ++round) {
    int64_t lease = 0;
    if (Status s = session_->lease(calls_, deadline, kind, &lease); !s.ok()) return s;
    const Status status = session_->run(calls_, deadline, retry, what, [&](EtcdMember& m, grpc::ClientContext* c) {
      return attempt(m, c, lease);
    });
    // The lease ran out (etcd unreachable for its TTL) or was revoked: a new one, once.
    if (round == 0 && status.message().find("requested lease not found") != std::string::npos) {
      session_->lease_lost(kind, lease);
      continue;
    }
    return explain_size(status);
  }
}

Status EtcdStore::put(Lease kind, const std::string& job, const std::string& key, const std::string& value,
                      std::chrono::milliseconds timeout) {
  etcdserverpb::PutRequest request;
  request.set_key(path(job, key));
  request.set_value(value);
  etcdserverpb::PutResponse response;
  return write(kind, Clock::now() + timeout, EtcdSession::Retry::kIdempotent, "writing " + safe_text(key, 200),
               [&](EtcdMember& m, grpc::ClientContext* c, int64_t lease) {
                 request.set_lease(lease);
                 return m.kv.Put(c, request, &response);
               });
}

Status EtcdStore::set(const std::string& job, const std::string& key, const std::string& value,
                      std::chrono::milliseconds timeout) {
  return put(Lease::kNode, job, key, value, timeout);
}

Status EtcdStore::publish(const std::string& job, const std::string& key, const std::string& value,
                          std::chrono::milliseconds timeout) {
  return put(Lease::kJob, job, key, value, timeout);
}

Status EtcdStore::set_if_absent(const std::string& job, const std::string& key, const std::string& value,
                                std::chrono::milliseconds timeout, bool* stored) {
  etcdserverpb::TxnRequest request;
  auto* absent = request.add_compare();
  absent->set_key(path(job, key));
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  auto* put = request.add_success()->mutable_request_put();
  put->set_key(path(job, key));
  put->set_value(value);
  etcdserverpb::TxnResponse response;
  const Status status = write(Lease::kNode, Clock::now() + timeout, EtcdSession::Retry::kNotSent,
                              "writing " + safe_text(key, 200) + " if absent",
                              [&](EtcdMember& m, grpc::ClientContext* c, int64_t lease) {
                                put->set_lease(lease);
                                return m.kv.Txn(c, request, &response);
                              });
  if (status.ok()) *stored = response.succeeded();
  return status;
}

Status EtcdStore::add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds timeout,
                      int64_t* value) {
  if (delta == 0) {
    etcdserverpb::RangeRequest request;
    request.set_key(path(job, key));
    etcdserverpb::RangeResponse response;
    const Status status = session_->run(calls_, Clock::now() + timeout, EtcdSession::Retry::kIdempotent,
                                        "reading counter " + safe_text(key, 200),
                                        [&](EtcdMember& m, grpc::ClientContext* c) {
                                          return m.kv.Range(c, request, &response);
                                        });
    if (!status.ok()) return status;
    return checked_version(describe(), key, response.kvs_size() > 0 ? response.kvs(0).version() : 0, 0, value);
  }
  if (delta != 1) {
    return Status::invalid_argument(describe() + ": a counter in etcd counts by 0 or 1, not " + std::to_string(delta));
  }
  return count_once(job, key, nonce_hex(), timeout, value);
}

Status EtcdStore::count_once(const std::string& job, const std::string& key, const std::string& nonce,
                             std::chrono::milliseconds timeout, int64_t* value) {
  // One transaction: if this increment's marker does not exist yet, put the counter (raising
  // its version by one) and create the marker. Whichever copy of it commits first counts; any
  // other (an attempt whose answer was lost, resent to another member, or committing late
  // through a member that was frozen) finds the marker and changes nothing. So it is resent
  // freely, and nothing counts twice or not at all.
  const auto deadline = Clock::now() + timeout;
  const std::string counter = path(job, key);
  const std::string marker = counter + "/~once/" + nonce;
  etcdserverpb::TxnRequest request;
  auto* absent = request.add_compare();
  absent->set_key(marker);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  auto* bump = request.add_success()->mutable_request_put();
  bump->set_key(counter);
  bump->set_value(nonce);
  bump->set_prev_kv(true);
  auto* mark = request.add_success()->mutable_request_put();
  mark->set_key(marker);
  request.add_failure()->mutable_request_range()->set_key(marker);
  request.add_failure()->mutable_request_range()->set_key(counter);
  etcdserverpb::TxnResponse response;
  const Status status = write(Lease::kJob, deadline, EtcdSession::Retry::kIdempotent,
                              "counting " + safe_text(key, 200), [&](EtcdMember& m, grpc::ClientContext* c, int64_t lease) {
                                bump->set_lease(lease);
                                mark->set_lease(lease);
                                return m.kv.Txn(c, request, &response);
                              });
  if (!status.ok()) return status;
  // Both branches of the transaction hold two requests: an answer with other than two is not
  // etcd's, and is not read past its end.
  if (response.responses_size() != 2) {
    return Status::protocol(describe() + ": counting " + safe_text(key, 200) + " answered " +
                            std::to_string(response.responses_size()) + " responses to a transaction of 2");
  }
  if (response.succeeded()) {
    const auto& put = response.responses(0).response_put();
    int64_t before = 0;
    if (Status s = checked_version(describe(), key, put.has_prev_kv() ? put.prev_kv().version() : 0, 0, &before);
        !s.ok()) {
      return s;
    }
    *value = before + 1;
    return Status();
  }
  // An earlier copy counted: the count it made is the counter's version at its revision; the
  // counter as it is now, when nothing counted since (no history needed), else read at it.
  const auto& found = response.responses(0).response_range();
  if (found.kvs_size() == 0) {
    return Status::internal(describe() + ": counting " + safe_text(key, 200) + ": its marker vanished between the "
                            "compare and the read of one transaction");
  }
  const auto& now = response.responses(1).response_range();
  if (now.kvs_size() > 0 && now.kvs(0).mod_revision() == found.kvs(0).mod_revision()) {
    return checked_version(describe(), key, now.kvs(0).version(), 1, value);
  }
  etcdserverpb::RangeRequest then;
  then.set_key(counter);
  then.set_revision(found.kvs(0).mod_revision());
  etcdserverpb::RangeResponse at;
  if (Status s = session_->run(calls_, deadline, EtcdSession::Retry::kIdempotent,
                               "reading counter " + safe_text(key, 200) + " as this count left it",
                               [&](EtcdMember& m, grpc::ClientContext* c) { return m.kv.Range(c, then, &at); });
      !s.ok()) {
    return Status(s.code(), s.message() + " (this count was made by an attempt whose answer was lost; etcd no "
                                          "longer has the revision it made it at)");
  }
  if (at.kvs_size() == 0) {
    return Status::internal(describe() + ": counter " + safe_text(key, 200) + " is missing at the revision its "
                            "count was made at");
  }
  return checked_version(describe(), key, at.kvs(0).version(), 1, value);
}

Status EtcdStore::delete_job(const std::string& job, std::chrono::milliseconds timeout, const std::string& prefix) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(path(job, prefix));
  request.set_range_end(prefix_end(path(job, prefix)));
  etcdserverpb::DeleteRangeResponse response;
  return session_->run(calls_, Clock::now() + timeout, EtcdSession::Retry::kIdempotent, "deleting keys",
                       [&](EtcdMember& m, grpc::ClientContext* c) { return m.kv.DeleteRange(c, request, &response); });
}

}  // namespace gradsync
