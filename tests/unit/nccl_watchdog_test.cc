// The NCCL engine's watchdog through fakes of the communicators and of the collectives' done
// events: collectives that finish, an asynchronous NCCL error, a collective that hangs until
// aborted, and one that times out.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <utility>

#include "daemon/engine/nccl/watchdog.h"

namespace gradsync::nccl {
namespace {

using namespace std::chrono_literals;

class FakeComms final : public WatchedComms {
 public:
  Status async_error() override {
    std::lock_guard lock(mutex);
    return error;
  }
  void abort_all() override { aborts.fetch_add(1); }

  std::mutex mutex;
  Status error;  // guarded by mutex
  std::atomic<int> aborts{0};
};

// A collective whose done event the test completes, and whose answer the test awaits.
struct Collective {
  std::shared_ptr<std::atomic<bool>> finished = std::make_shared<std::atomic<bool>>(false);
  // What querying its done event returns; ok unless the test makes CUDA fail.
  std::shared_ptr<std::pair<std::mutex, Status>> query_error = std::make_shared<std::pair<std::mutex, Status>>();
  std::shared_ptr<std::promise<Status>> answered = std::make_shared<std::promise<Status>>();
  std::future<Status> answer = answered->get_future();

  InFlight in_flight(const std::string& what, std::chrono::milliseconds timeout = 30'000ms) {
    return InFlight{what,
                    [f = finished, e = query_error](bool* done) {
                      *done = f->load();
                      std::lock_guard lock(e->first);
                      return e->second;
                    },
                    [a = answered](const Status& status) { a->set_value(status); }, timeout};
  }
};

}  // namespace

TEST_CASE("watchdog: collectives that finish are answered ok, in order", "[nccl][watchdog]") {
  FakeComms comms;
  Watchdog watchdog(&comms, 10ms);
  Collective a, b;
  watchdog.watch(a.in_flight("allreduce a"));
  watchdog.watch(b.in_flight("allreduce b"));
  b.finished->store(true);  // b's event is through, but a's is not: nothing is answered yet
  CHECK(a.answer.wait_for(100ms) == std::future_status::timeout);
  CHECK(b.answer.wait_for(0ms) == std::future_status::timeout);
  a.finished->store(true);
  REQUIRE(a.answer.wait_for(2s) == std::future_status::ready);
  REQUIRE(b.answer.wait_for(2s) == std::future_status::ready);
  CHECK(a.answer.get().ok());
  CHECK(b.answer.get().ok());
  CHECK(comms.aborts == 0);
}

TEST_CASE("watchdog: an asynchronous NCCL error aborts the communicators and fails everything, naming it",
          "[nccl][watchdog]") {
  FakeComms comms;
  Watchdog watchdog(&comms, 10ms);
  Collective a;
  watchdog.watch(a.in_flight("allreduce of bucket 0"));
  {
    std::lock_guard lock(comms.mutex);
    comms.error = Status::peer_lost("communicator of group 'dp': remote process exited or there was a network error");
  }
  REQUIRE(a.answer.wait_for(2s) == std::future_status::ready);
  const Status status = a.answer.get();
  CHECK(status.code() == ErrorCode::kPeerLost);
  CHECK(status.message() == "NCCL reported an error: communicator of group 'dp': remote process exited or there was a "
                            "network error");
  CHECK(comms.aborts == 1);
  // Later collectives fail at once with the same error, and nothing is aborted twice.
  Collective later;
  watchdog.watch(later.in_flight("allreduce of bucket 1"));
  REQUIRE(later.answer.wait_for(0ms) == std::future_status::ready);
  CHECK(later.answer.get().message() == status.message());
  CHECK(comms.aborts == 1);
}

TEST_CASE("watchdog: a collective that hangs returns within 1 s of abort()", "[nccl][watchdog]") {
  FakeComms comms;
  Watchdog watchdog(&comms);  // the real poll interval, 100 ms
  Collective hung;
  watchdog.watch(hung.in_flight("allreduce of bucket 0"));
  CHECK(hung.answer.wait_for(300ms) == std::future_status::timeout);
  const auto start = std::chrono::steady_clock::now();
  watchdog.abort(Status::aborted("job j: rank 3 (client pid 42) disconnected"));
  REQUIRE(hung.answer.wait_for(5s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  const Status status = hung.answer.get();
  CHECK(status.code() == ErrorCode::kAborted);
  CHECK(status.message() == "job j: rank 3 (client pid 42) disconnected");
  CHECK(comms.aborts == 1);
}

TEST_CASE("watchdog: a collective past its timeout aborts the communicators, naming it and the bound",
          "[nccl][watchdog]") {
  FakeComms comms;
  Watchdog watchdog(&comms, 10ms);
  Collective slow, behind;
  const auto start = std::chrono::steady_clock::now();
  watchdog.watch(slow.in_flight("allreduce of 104857600 bytes (group 'dp')", 200ms));
  watchdog.watch(behind.in_flight("broadcast of 4096 bytes", 30'000ms));
  REQUIRE(slow.answer.wait_for(5s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - start >= 200ms);
  const Status status = slow.answer.get();
  CHECK(status.code() == ErrorCode::kTimeout);
  CHECK(status.message() == "NCCL allreduce of 104857600 bytes (group 'dp') did not finish within 200 ms; the job's "
                            "communicators were aborted");
  // The one behind it fails with it: the aborted communicators will never run it.
  REQUIRE(behind.answer.wait_for(1s) == std::future_status::ready);
  CHECK(behind.answer.get().code() == ErrorCode::kTimeout);
  CHECK(comms.aborts == 1);
}

TEST_CASE("watchdog: a failing event query fails the engine at once instead of waiting for the timeout",
          "[nccl][watchdog]") {
  FakeComms comms;
  Watchdog watchdog(&comms, 10ms);
  Collective broken;
  const auto start = std::chrono::steady_clock::now();
  watchdog.watch(broken.in_flight("allreduce of bucket 2", 30'000ms));
  {
    std::lock_guard lock(broken.query_error->first);
    broken.query_error->second = Status::internal("cudaEventQuery: an illegal memory access was encountered");
  }
  REQUIRE(broken.answer.wait_for(5s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(broken.answer.get().message() ==
        "NCCL allreduce of bucket 2: cudaEventQuery: an illegal memory access was encountered");
  CHECK(comms.aborts == 1);
}

TEST_CASE("watchdog: closing it with a collective in flight aborts and answers it", "[nccl][watchdog]") {
  FakeComms comms;
  Collective hung;
  {
    Watchdog watchdog(&comms);
    watchdog.watch(hung.in_flight("allgather"));
  }
  REQUIRE(hung.answer.wait_for(0ms) == std::future_status::ready);
  CHECK(hung.answer.get().message() == "the NCCL engine was closed");
  CHECK(comms.aborts == 1);
}

}  // namespace gradsync::nccl

namespace gradsync::nccl {

// A collective watched while the watchdog is inside its abort (abort_all blocks here until the
// test releases it) must not be answered before the abort returned: its caller would free the
// buffers a live communicator may still touch.
TEST_CASE("watchdog: a collective watched during the abort is answered only after it", "[nccl][watchdog]") {
  class BlockingComms final : public WatchedComms {
   public:
    Status async_error() override { return Status(); }
    void abort_all() override {
      entered.set_value();
      released.wait();
      done.store(true);
    }
    std::promise<void> entered;
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::atomic<bool> done{false};
  };
  BlockingComms comms;
  auto entered = comms.entered.get_future();
  Watchdog watchdog(&comms, 5ms);
  watchdog.abort(Status::aborted("job j failed"));
  REQUIRE(entered.wait_for(2s) == std::future_status::ready);  // the watchdog is inside abort_all
  std::atomic<bool> aborted_when_answered{false};
  std::promise<Status> answered;
  watchdog.watch(InFlight{"allreduce late", [](bool* d) { return *d = false, Status(); },
                          [&](const Status& s) {
                            aborted_when_answered.store(comms.done.load());
                            answered.set_value(s);
                          },
                          30'000ms});
  auto answer = answered.get_future();
  CHECK(answer.wait_for(100ms) == std::future_status::timeout);  // not while the abort runs
  comms.release.set_value();
  REQUIRE(answer.wait_for(2s) == std::future_status::ready);
  CHECK(answer.get().message() == "job j failed");
  CHECK(aborted_when_answered.load());
}

}  // namespace gradsync::nccl
