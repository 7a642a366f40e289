// The store a multi-node job's nodes meet through: node 0's peer service (PeerClient, the
// default) or an etcd cluster (rendezvous/etcd_store.h, for large clusters). Keys are scoped by
// a store job ("<uid>.<job id>"); values are bytes; a get waits for its keys to appear.
//
// Every call is bounded by its timeout. cancel() ends the calls in flight and fails every
// later one, so a failing job never waits on the store; fresh() gives a handle that is not
// cancelled, for the notices a node sends after it gave up (its failure, its leave).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shared/status.h"

namespace gradsync {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Where the store is, for messages: "the rendezvous daemon at HOST:PORT", "etcd at ...".
  virtual std::string describe() const = 0;

  // A key of this node: with etcd it goes when the node's daemon dies (rendezvous/etcd_session.h).
  virtual Status set(const std::string& job, const std::string& key, const std::string& value,
                     std::chrono::milliseconds timeout) = 0;
  // A key others must read after this node gave up (its failure notice, node 0's table of the
  // nodes): kept until the generation's keys are deleted, or the store's job TTL.
  virtual Status publish(const std::string& job, const std::string& key, const std::string& value,
                         std::chrono::milliseconds timeout) {
    return set(job, key, value, timeout);
  }
  // Stores `value` only if the key has none yet; *stored says whether this call did.
  virtual Status set_if_absent(const std::string& job, const std::string& key, const std::string& value,
                               std::chrono::milliseconds timeout, bool* stored) = 0;
  // Waits up to `timeout` for every key; kTimeout when they do not all appear. A timeout of 0
  // answers at once with what is there.
  virtual Status get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                     std::vector<std::string>* values) = 0;
  // What is there of `keys` now, without waiting, in as few calls as the store allows: the
  // value of each key, or nullopt. `timeout` bounds the whole read.
  virtual Status peek(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                      std::vector<std::optional<std::string>>* values);
  // Adds `delta` to the counter `key` (0 when it has none) and gives its new value. Counters
  // are read and changed only through add (delta 0 reads); etcd's take deltas 0 and 1 only.
  virtual Status add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds timeout,
                     int64_t* value) = 0;
  // Removes the job's keys that start with `prefix` (every key when empty).
  virtual Status delete_job(const std::string& job, std::chrono::milliseconds timeout, const std::string& prefix) = 0;

  // Cancels the calls in flight and fails every later call with `why`. Any thread; idempotent.
  virtual void cancel(const Status& why) = 0;
  // Another handle on the same store that is not cancelled.
  virtual std::shared_ptr<RendezvousStore> fresh() const = 0;
};

}  // namespace gradsync
