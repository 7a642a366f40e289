// The daemon's etcd authentication tokens, one per member, shared by every job's session: a
// token from one Authenticate serves every job the daemon runs (etcd 3.4 checks the password
// with bcrypt in a Raft round, so a thousand jobs authenticating each would cost the members a
// thousand checks). One authentication per member runs at a time; the callers that waited take
// its token.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "shared/mutex.h"

namespace gradsync {

class EtcdTokens {
 public:
  // The member's token; empty when there is none yet.
  std::string get(const std::string& member) const {
    MutexLock lock(mutex_);
    auto it = tokens_.find(member);
    return it == tokens_.end() ? std::string() : it->second;
  }
  void set(const std::string& member, const std::string& token) {
    MutexLock lock(mutex_);
    tokens_[member] = token;
  }
  // Forgets `token` (refused by the member), unless another has replaced it meanwhile.
  void refused(const std::string& member, const std::string& token) {
    MutexLock lock(mutex_);
    auto it = tokens_.find(member);
    if (it != tokens_.end() && it->second == token) tokens_.erase(it);
  }
  // Held while authenticating at `member`.
  std::timed_mutex& authenticating(const std::string& member) {
    MutexLock lock(mutex_);
    auto& slot = locks_[member];
    if (!slot) slot = std::make_unique<std::timed_mutex>();
    return *slot;
  }

 private:
  mutable Mutex mutex_;
  std::map<std::string, std::string> tokens_ GS_GUARDED_BY(mutex_);
  std::map<std::string, std::unique_ptr<std::timed_mutex>> locks_ GS_GUARDED_BY(mutex_);
};

}  // namespace gradsync
