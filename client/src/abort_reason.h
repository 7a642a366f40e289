// Why a client was aborted (Client::abort): set once, from any thread, and read from any thread
// without a lock. Shared by the client's connection and its completions, so that works which
// outlive the client still report the abort as their cause.
#pragma once

#include <atomic>
#include <optional>
#include <thread>

#include "shared/status.h"

namespace gradsync {

class AbortReason {
 public:
  // Records `why`; true for the first call. A later call, on any thread, returns false once the
  // first one's reason is readable, so that "every call after abort() throws" holds for it too.
  bool set(Status why) {
    if (claimed_.exchange(true)) {
      while (!published_.load(std::memory_order_acquire)) std::this_thread::yield();
      return false;
    }
    why_ = std::move(why);
    published_.store(true, std::memory_order_release);
    return true;
  }

  // The reason; nullopt before set().
  std::optional<Status> get() const {
    if (!published_.load(std::memory_order_acquire)) return std::nullopt;
    return why_;
  }

 private:
  std::atomic<bool> claimed_{false};    // one writer of why_
  std::atomic<bool> published_{false};  // why_ is written
  Status why_;
};

}  // namespace gradsync
