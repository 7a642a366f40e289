// Faults: a client killed or stuck mid-step, the daemon going away. The other clients get an
// error naming the rank within the job's timeout, the daemon keeps serving other jobs, and the
// dead client's memory and descriptors are released.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

const std::vector<TensorSpec> kSpecs(4, TensorSpec{DType::kFloat32, 1 << 16, "dp"});

// Ranks other than `victim` run steps until one fails, and check that the failure names the
// victim with the expected code, quickly.
int survivor(Client& client, const TensorSet& set, const Latch& ready, ErrorCode code, const std::string& names) {
  ready.open();
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int step = 0; step < 1000; ++step) {
      if (!client.allreduce(set, ReduceOptions{}).wait(std::chrono::seconds(20))) return fail("wait timed out");
    }
    return fail("no step failed");
  } catch (const Error& e) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (e.code() != code) return fail(std::string("unexpected error: ") + e.what());
    if (std::string(e.what()).find(names) == std::string::npos) return fail(std::string("error does not name ") + names + ": " + e.what());
    if (seconds > 15) return fail("the error took " + std::to_string(seconds) + " s");
  }
  // Later operations fail at once with the same sticky error.
  try {
    client.allreduce(set, ReduceOptions{}).wait(std::chrono::seconds(5));
    return fail("an operation after the failure succeeded");
  } catch (const Error& e) {
    if (e.code() != code) return fail(std::string("later error differs: ") + e.what());
  }
  return kOk;
}

}  // namespace

TEST_CASE("faults: a client killed mid-step fails the others' pending operations, naming it", "[integration][faults]") {
  TestDaemon daemon({"--timeout-ms", "10000"});
  const std::string job = unique_job("killed");
  const size_t baseline_fds = open_fd_count(daemon.pid());
  Latch victim_ready, survivors_ready;
  ClientGroup group(3, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 3);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), {});
    if (rank == 2) {
      // Take part in one step, then hang in the middle of the next one until killed.
      client->allreduce(set, ReduceOptions{}).wait(std::chrono::seconds(20));
      victim_ready.open();
      ::pause();
      return kOk;
    }
    return survivor(*client, set, survivors_ready, ErrorCode::kPeerLost, "rank 2");
  });
  REQUIRE(victim_ready.wait(std::chrono::seconds(20)));
  REQUIRE(survivors_ready.wait(std::chrono::seconds(20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // While the job runs the daemon maps every client's tensors and rings, and nothing has a name.
  CHECK(mapped_memfds(daemon.pid(), "tensor") == 3);
  CHECK(mapped_memfds(daemon.pid(), "client-rings") == 3);
  CHECK(shm_entries_containing("gradsync").empty());
  group.signal(2, SIGKILL);
  const auto statuses = group.wait_all(std::chrono::seconds(60));
  CHECK(exit_code(statuses[0]) == kOk);
  CHECK(exit_code(statuses[1]) == kOk);
  CHECK_THAT(daemon.log(), Catch::Contains("rank 2"));

  // The daemon is up and serves a new job.
  CHECK(daemon.running());
  {
    auto client = join(daemon.socket(), unique_job("next"), 0, 1);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), {});
    CHECK(client->allreduce(set, ReduceOptions{}).wait(std::chrono::seconds(10)));
  }
  // Nothing of the dead job is left once its clients are gone: no mappings of tensors or rings,
  // no memfd descriptors (the job's doorbell goes with the job). The reaper releases the
  // worker's mappings off the io thread, so give it a moment.
  for (int i = 0; i < 100 && mapped_memfds(daemon.pid()) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(mapped_memfds(daemon.pid()) == 0);
  CHECK(open_memfds(daemon.pid()) == 0);
  // gRPC may close internal descriptors of its own, so for the rest "no leak" means "not more
  // than before".
  CHECK(open_fd_count(daemon.pid()) <= baseline_fds);
}

TEST_CASE("faults: a client that stops submitting times the others out, naming it", "[integration][faults]") {
  TestDaemon daemon({"--timeout-ms", "1000"});
  const std::string job = unique_job("stuck");
  Latch ready;
  ClientGroup group(3, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 3);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), {});
    if (rank == 1) {
      ::sleep(8);  // alive, connected, silent
      return kOk;
    }
    return survivor(*client, set, ready, ErrorCode::kTimeout, "rank 1");
  });
  const auto statuses = group.wait_all(std::chrono::seconds(60));
  CHECK(exit_code(statuses[0]) == kOk);
  CHECK(exit_code(statuses[2]) == kOk);
}

TEST_CASE("faults: a rank that marks only some tensors ready times the others out", "[integration][faults]") {
  TestDaemon daemon({"--timeout-ms", "1000"});
  const std::string job = unique_job("partial");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), RegisterOptions{1 << 18});
    Work work = client->allreduce_deferred(set, ReduceOptions{});
    // One tensor per bucket; rank 0 never marks tensor 0, which is in the last bucket.
    for (uint32_t t = 3; t >= 1; --t) client->mark_ready(set, t);
    if (rank == 1) client->mark_ready(set, 0);
    try {
      work.wait(std::chrono::seconds(20));
      return fail("the step should have timed out");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) return fail(std::string("unexpected: ") + e.what());
      // The error names the bound, the rank at fault and the bucket it held back.
      const std::string what = e.what();
      if (what.find("over the job timeout of 1000 ms, for rank 0 (local rank 0) to make bucket 3 ready") ==
          std::string::npos) {
        return fail("unnamed: " + what);
      }
    }
    return kOk;
  });
  for (int status : group.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
}

TEST_CASE("faults: a killed daemon fails waiting clients instead of hanging", "[integration][faults]") {
  TestDaemon daemon;
  const std::string job = unique_job("daemon-dies");
  Latch ready;
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), {});
    if (rank == 1) {
      ready.open();
      ::pause();
    }
    Work work = client->allreduce(set, ReduceOptions{});
    ready.open();
    try {
      work.wait(std::chrono::seconds(30));
      return fail("the wait should have failed");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kPeerLost) return fail(std::string("unexpected: ") + e.what());
    }
    return kOk;
  });
  REQUIRE(ready.wait(std::chrono::seconds(20)));
  REQUIRE(ready.wait(std::chrono::seconds(20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  daemon.process().signal(SIGKILL);
  CHECK(exit_code(group.wait(0, std::chrono::seconds(20))) == kOk);
}

TEST_CASE("faults: a job re-forms after a failure when its clients join again", "[integration][faults]") {
  TestDaemon daemon({"--timeout-ms", "5000"});
  const std::string job = unique_job("reform");
  {
    Latch ready;
    ClientGroup first(2, [&](int rank) {
      auto client = join(daemon.socket(), job, rank, 2);
      client->register_tensors(client->allocate_flat(kSpecs), {});
      ready.open();
      ::pause();
      return kOk;
    });
    REQUIRE(ready.wait(std::chrono::seconds(20)));
    REQUIRE(ready.wait(std::chrono::seconds(20)));
    first.signal(1, SIGKILL);
    first.wait(1);
  }
  ClientGroup second(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const std::vector<SharedTensor> tensors = client->allocate_flat(kSpecs);
    const TensorSet set = client->register_tensors(tensors, {});
    tensors[0].as<float>()[0] = static_cast<float>(rank);
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(20))) return fail("timed out");
    if (tensors[0].as<float>()[0] != 1.0f) return fail("wrong sum after re-forming");
    return kOk;
  });
  for (int status : second.wait_all()) CHECK(exit_code(status) == kOk);
}

TEST_CASE("faults: a disconnecting job does not disturb another job", "[integration][faults]") {
  TestDaemon daemon({"--timeout-ms", "5000"});
  const std::string healthy = unique_job("healthy");
  const std::string doomed = unique_job("doomed");
  Latch doomed_ready;
  ClientGroup victims(2, [&](int rank) {
    auto client = join(daemon.socket(), doomed, rank, 2);
    client->register_tensors(client->allocate_flat(kSpecs), {});
    doomed_ready.open();
    ::pause();
    return kOk;
  });
  ClientGroup others(2, [&](int rank) {
    auto client = join(daemon.socket(), healthy, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), {});
    for (int step = 0; step < 200; ++step) {
      if (!client->allreduce(set, ReduceOptions{}).wait(std::chrono::seconds(20))) return fail("healthy job timed out");
    }
    return kOk;
  });
  REQUIRE(doomed_ready.wait(std::chrono::seconds(20)));
  victims.signal(0, SIGKILL);
  for (int status : others.wait_all()) CHECK(exit_code(status) == kOk);
}

}  // namespace gradsync::test


