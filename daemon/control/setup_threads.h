// Work that must not run on the io thread, which serves every client's control connection:
// creating and mapping a joining client's channel, importing a segment (an mmap, or a CUDA IPC
// import that can take milliseconds), decoding and checking a large registration, returning
// freed memory to the system. It runs on a few threads of its own, and its result comes back to
// the io thread, where the client's state lives.
#pragma once

#include <malloc.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <utility>

namespace gradsync {

class SetupThreads {
 public:
  SetupThreads(boost::asio::io_context& io, size_t threads) : io_(&io), pool_(threads) {}
  ~SetupThreads() { join(); }
  // Waits for the work already queued; its results reach the io thread only if it runs again.
  void join() { pool_.join(); }
  SetupThreads(const SetupThreads&) = delete;
  SetupThreads& operator=(const SetupThreads&) = delete;

  // Calls work() on a setup thread, then then(result) on the io thread. Neither may throw.
  template <class Work, class Then>
  void run(Work work, Then then) {
    boost::asio::post(pool_, [io = io_, work = std::move(work), then = std::move(then)]() mutable {
      auto result = std::make_shared<decltype(work())>(work());
      boost::asio::post(*io, [then = std::move(then), result]() mutable { then(std::move(*result)); });
    });
  }

  // Hands the heap's free pages back to the system (glibc keeps freed memory in its arenas: a
  // 16 MiB registration would otherwise leave the daemon that much larger for good).
  void trim() {
    boost::asio::post(pool_, [] { ::malloc_trim(0); });
  }

 private:
  boost::asio::io_context* io_;
  boost::asio::thread_pool pool_;
};

}  // namespace gradsync
