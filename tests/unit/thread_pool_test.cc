// The reduction pool: a task that throws (memory running out in its buffers) must not end the
// daemon on a pool thread; parallel_for() rethrows it on the caller's, after every task is done.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <new>
#include <thread>

#include "daemon/util/thread_pool.h"

namespace gradsync {

TEST_CASE("thread pool: a task that throws on a pool thread is rethrown to the caller once every task is done",
          "[thread_pool]") {
  ThreadPool pool(3);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> helper_threw{false};
  std::atomic<int> finished{0};
  constexpr size_t kTasks = 16;
  auto task = [&](size_t) {
    if (std::this_thread::get_id() != caller && !helper_threw.exchange(true)) throw std::bad_alloc();
    // The caller's tasks wait (bounded) until a pool thread threw, so one surely does.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!helper_threw.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    finished.fetch_add(1);
  };
  CHECK_THROWS_AS(pool.parallel_for(kTasks, task), std::bad_alloc);
  CHECK(helper_threw.load());
  CHECK(finished.load() == static_cast<int>(kTasks) - 1);  // every other task ran to its end
  // The pool serves on.
  std::atomic<int> ran{0};
  pool.parallel_for(kTasks, [&](size_t) { ran.fetch_add(1); });
  CHECK(ran.load() == static_cast<int>(kTasks));
}

TEST_CASE("thread pool: a task that throws inline (one task, or no pool threads) reaches the caller",
          "[thread_pool]") {
  ThreadPool alone(1);
  CHECK_THROWS_AS(alone.parallel_for(4, [](size_t i) {
    if (i == 2) throw std::bad_alloc();
  }), std::bad_alloc);
  ThreadPool pool(2);
  CHECK_THROWS_AS(pool.parallel_for(1, [](size_t) { throw std::bad_alloc(); }), std::bad_alloc);
}

}  // namespace gradsync
