// Work that must not run on the io thread, which serves every client's control connection:
// creating and mapping a joining client's channel, importing a segment (an mmap, or a CUDA IPC
// import that can take milliseconds), decoding and checking a large registration, returning
// freed memory to the system. It runs on a few threads of its own, and its result comes back to
// the io thread, where the client's state lives.
#pragma once

#include <malloc.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "shared/mutex.h"
#include "shared/status.h"

namespace gradsync {

class SetupThreads {
 public:
  SetupThreads(boost::asio::io_context& io, size_t threads) : io_(&io), pool_(threads) {}
  ~SetupThreads() { join(); }
  // Waits for the work already queued; its results reach the io thread only if it runs again.
  void join() { pool_.join(); }
  SetupThreads(const SetupThreads&) = delete;
  SetupThreads& operator=(const SetupThreads&) = delete;

  // Calls work() on a setup thread, then then(result) on the io thread. work() returns a
  // default-constructible result with a `status` member: an exception it throws (out of
  // memory, say) becomes that status, since an exception escaping a pool thread would end the
  // daemon. then() must not throw.
  template <class Work, class Then>
  void run(Work work, Then then) {
    boost::asio::post(pool_, [io = io_, work = std::move(work), then = std::move(then)]() mutable {
      auto result = std::make_shared<decltype(work())>(guarded(work));
      boost::asio::post(*io, [then = std::move(then), result]() mutable { then(std::move(*result)); });
    });
  }

  // The same for a coroutine on the io thread: awaiting what offload(work) returns runs work()
  // on a setup thread and resumes the coroutine on its own executor with the result, so that a
  // request reads top to bottom.
  //
  // While the coroutine waits, *abandon (when given) resumes it at once with an aborted
  // status instead: a connection that closes does not wait for a setup thread stuck in a
  // driver call, and neither does a shutdown that lets the io_context run dry. The work's own
  // result is then dropped when it comes. Call *abandon on the io thread; it does nothing once
  // the result is delivered.
  //
  // Its callers name the work and the awaitable before they await it (`auto pending =
  // offload(std::move(work)); co_await std::move(pending);`): GCC 12 mis-handles a temporary
  // with a non-trivial destructor (a lambda with captures, a string) made inside a co_await
  // expression, freeing a moved object's inline buffer as if it were heap.
  template <class Work>
  boost::asio::awaitable<std::invoke_result_t<Work&>> offload(Work work, std::function<void()>* abandon = nullptr) {
    using Result = std::invoke_result_t<Work&>;
    auto start = [pool = &pool_, abandon](auto handler, Work work) {
      // The handler goes to whichever comes first, the result or the abandonment.
      using Handler = decltype(handler);
      struct Slot {
        Mutex mutex;
        std::optional<Handler> waiting GS_GUARDED_BY(mutex);
      };
      auto slot = std::make_shared<Slot>();
      {
        MutexLock lock(slot->mutex);
        slot->waiting.emplace(std::move(handler));
      }
      auto deliver = [slot](Result result) {
        std::optional<Handler> taken;
        {
          MutexLock lock(slot->mutex);
          if (slot->waiting) {
            taken.emplace(std::move(*slot->waiting));
            slot->waiting.reset();
          }
        }
        if (!taken) return;  // delivered already
        auto back = boost::asio::get_associated_executor(*taken);
        boost::asio::post(back, [handler = std::move(*taken), result = std::move(result)]() mutable {
          std::move(handler)(std::move(result));
        });
      };
      if (abandon) {
        *abandon = [deliver] { deliver(failed<Result>(Status::aborted("the connection closed while it waited"))); };
      }
      boost::asio::post(*pool, [deliver, work = std::move(work)]() mutable { deliver(guarded(work)); });
    };
    return boost::asio::async_initiate<const boost::asio::use_awaitable_t<>&, void(Result)>(
        std::move(start), boost::asio::use_awaitable, std::move(work));
  }

  template <class Work>
  static auto guarded(Work& work) -> decltype(work()) {
    try {
      return work();
    } catch (const Error& e) {
      return failed<decltype(work())>(e.status());
    } catch (const std::exception& e) {
      return failed<decltype(work())>(Status::internal(std::string("setup failed: ") + e.what()));
    }
  }

  // Frees `what` on a setup thread, then (when `trim_after`) queues a trim(), so that the trim
  // cannot run before the free: a decoded request of a million tensors is ~100 MB of small
  // blocks and tens of ms to free, which the io thread must not spend.
  template <class T>
  void dispose(std::shared_ptr<T> what, bool trim_after) {
    boost::asio::post(pool_, [this, what = std::move(what), trim_after]() mutable {
      what.reset();
      if (trim_after) trim();
    });
  }

  // Hands the heap's free pages back to the system (glibc keeps freed memory in its arenas: a
  // 16 MiB registration would otherwise leave the daemon that much larger for good). At most
  // one trim is queued at a time: it walks every arena under its lock.
  void trim() {
    if (trim_queued_.exchange(true)) return;
    boost::asio::post(pool_, [this] {
      trim_queued_ = false;
      ::malloc_trim(0);
    });
  }

 private:
  template <class Result>
  static Result failed(Status status) {
    if constexpr (std::is_same_v<Result, Status>) {
      return status;
    } else {
      Result result{};
      result.status = std::move(status);
      return result;
    }
  }

  boost::asio::io_context* io_;
  std::atomic<bool> trim_queued_{false};
  boost::asio::thread_pool pool_;
};

}  // namespace gradsync
