// Client::abort (gs_client_abort, gradsync.Client.abort, the torch backend's ProcessGroup.abort)
// with the real daemon and real client processes: called from another thread, it gets a Work
// waited on and a blocking call out at once with Aborted naming the reason, the client refuses
// what follows, the other rank fails with PeerLost naming the aborted rank, and the daemon goes
// on serving.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

std::vector<SharedTensor> filled(Client& client, float value) {
  std::vector<TensorSpec> specs(1, TensorSpec{DType::kFloat32, 64, "dp"});
  std::vector<SharedTensor> tensors = client.allocate_flat(specs);
  for (float& x : tensors.front().as<float>()) x = value;
  return tensors;
}

// Runs `call`, which must throw an Error with `code` naming every one of `texts`, within
// `within` of `since`.
template <class Call>
int throws(Call call, ErrorCode code, std::initializer_list<const char*> texts, Clock::time_point since,
           milliseconds within, const std::string& what) {
  try {
    call();
  } catch (const Error& e) {
    const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - since);
    if (e.status().code() != code) return fail(what + ": threw code " + std::to_string(int(e.status().code())) + ": " + e.what());
    for (const char* text : texts) {
      if (std::string(e.what()).find(text) == std::string::npos) {
        return fail(what + ": \"" + e.what() + "\" does not name \"" + text + "\"");
      }
    }
    if (took > within) return fail(what + ": threw only after " + std::to_string(took.count()) + " ms");
    return kOk;
  }
  return fail(what + ": did not throw");
}

}  // namespace

TEST_CASE("abort: from another thread, a waited Work fails at once with Aborted naming the reason, later calls "
          "are refused, the other rank fails with PeerLost naming the rank, and the daemon serves on",
          "[integration][abort]") {
  TestDaemon daemon;
  const std::string job = unique_job("abort");
  Latch rank0_done;  // rank 0 aborted: rank 1 may submit its own
  ClientGroup ranks(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2, seconds(60));  // the timeout is not what ends it
    const TensorSet set = client->register_tensors(filled(*client, float(rank + 1)), {});
    if (rank == 0) {
      Work work = client->allreduce(set, ReduceOptions{ReduceOp::kSum});
      Clock::time_point aborted_at;
      std::thread watchdog([&] {
        std::this_thread::sleep_for(milliseconds(300));
        aborted_at = Clock::now();
        client->abort("watchdog: step 7 is stuck");
      });
      bool completed = false;
      int r = throws([&] { completed = work.wait(seconds(30)); }, ErrorCode::kAborted,
                     {"this client was aborted", "watchdog: step 7 is stuck"}, Clock::now(), milliseconds(3000),
                     "the waited allreduce");
      watchdog.join();
      if (r != kOk) return r;
      if (Clock::now() - aborted_at > milliseconds(1000)) return fail("the wait ended more than 1 s after the abort");
      r = throws([&] { client->allreduce(set, ReduceOptions{}); }, ErrorCode::kAborted, {"watchdog"}, Clock::now(),
                 seconds(5), "an allreduce after the abort");
      if (r != kOk) return r;
      r = throws([&] { client->register_tensors(filled(*client, 1), {}); }, ErrorCode::kAborted, {"watchdog"},
                 Clock::now(), seconds(5), "a registration after the abort");
      if (r != kOk) return r;
      rank0_done.open();
      return kOk;
    }
    if (!rank0_done.wait(seconds(30))) return fail("rank 0 never finished its abort");
    const auto since = Clock::now();
    return throws(
        [&] {
          Work work = client->allreduce(set, ReduceOptions{});
          work.wait(seconds(30));
        },
        ErrorCode::kPeerLost, {"rank 0"}, since, milliseconds(10000), "rank 1's allreduce after rank 0's abort");
  });
  for (int status : ranks.wait_all(seconds(120))) CHECK(exit_code(status) == kOk);
  check_still_serving(daemon);
}

TEST_CASE("abort: a rank already waiting in an allreduce fails with PeerLost naming the rank that aborted",
          "[integration][abort]") {
  TestDaemon daemon;
  const std::string job = unique_job("abort-waiting");
  Latch rank1_waiting;  // rank 1's allreduce is submitted; rank 0 never submits its own
  Latch rank1_done;     // rank 0 stays alive (its client too) until then: the abort, not an exit
  ClientGroup ranks(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2, seconds(60));
    const TensorSet set = client->register_tensors(filled(*client, float(rank + 1)), {});
    if (rank == 0) {
      if (!rank1_waiting.wait(seconds(30))) return fail("rank 1 never submitted");
      std::this_thread::sleep_for(milliseconds(200));  // rank 1 is in its wait
      client->abort("rank 0 gives up");
      if (!rank1_done.wait(seconds(30))) return fail("rank 1 never finished");
      return kOk;
    }
    Work work = client->allreduce(set, ReduceOptions{});
    rank1_waiting.open();
    const int r = throws([&] { work.wait(seconds(30)); }, ErrorCode::kPeerLost, {"rank 0"}, Clock::now(),
                         milliseconds(5000), "rank 1's waited allreduce");
    rank1_done.open();
    return r;
  });
  for (int status : ranks.wait_all(seconds(60))) CHECK(exit_code(status) == kOk);
  check_still_serving(daemon);
}

TEST_CASE("abort: a registration blocked waiting for a rank that never comes ends at once with Aborted",
          "[integration][abort]") {
  TestDaemon daemon;
  const std::string job = unique_job("abort-register");
  ClientGroup ranks(1, [&](int) {
    // Rank 1 of 2 never joins: the registration waits for it (up to the 60 s timeout).
    auto client = join(daemon.socket(), job, 0, 2, seconds(60));
    std::vector<SharedTensor> tensors = filled(*client, 1);
    std::thread watchdog([&] {
      std::this_thread::sleep_for(milliseconds(500));
      client->abort("shutting down");
    });
    const int r = throws([&] { client->register_tensors(tensors, {}); }, ErrorCode::kAborted, {"shutting down"},
                         Clock::now(), milliseconds(5000), "the blocked registration");
    watchdog.join();
    return r;
  });
  for (int status : ranks.wait_all(seconds(60))) CHECK(exit_code(status) == kOk);
  check_still_serving(daemon);
}

}  // namespace gradsync::test
