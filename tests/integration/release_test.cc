// Releasing a registered set (ReleaseRequest, Client::release, gs_set_release), and freeing memory
// (FreeSegmentRequest, Client::free_memory, gs_free), with the real
// daemon and real client processes: a set every local rank released leaves the job, its
// operations are refused by name, the others go on, and the client's tensors count no more
// against its limit. (Bad releases by hand on the protocol: limits_test.cc, which has RawClient.)
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <thread>

#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

std::vector<SharedTensor> filled(Client& client, size_t count, float value) {
  std::vector<TensorSpec> specs(count, TensorSpec{DType::kFloat32, 16, "dp"});
  std::vector<SharedTensor> tensors = client.allocate_flat(specs);
  for (SharedTensor& t : tensors) {
    for (float& x : t.as<float>()) x = value;
  }
  return tensors;
}

// An allreduce (sum) of `set` whose every element must come back as `want`.
int sums_to(Client& client, const TensorSet& set, float want, const char* what) {
  if (!client.allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(30))) {
    return fail(std::string(what) + ": timed out");
  }
  for (const SharedTensor& t : set.tensors()) {
    for (float x : t.as<float>()) {
      if (x != want) return fail(std::string(what) + ": got " + std::to_string(x) + ", want " + std::to_string(want));
    }
  }
  return kOk;
}

// `call` must throw an Error whose message holds `text`.
template <class Call>
int refused(Call call, const std::string& text, const char* what) {
  try {
    call();
  } catch (const Error& e) {
    if (std::string(e.what()).find(text) != std::string::npos) return kOk;
    return fail(std::string(what) + ": refused with \"" + e.what() + "\", not naming \"" + text + "\"");
  }
  return fail(std::string(what) + ": was not refused");
}

}  // namespace

TEST_CASE("release: a set every local rank released leaves the job, operations on it are refused, the others go "
          "on, and its tensors count no more",
          "[integration][release]") {
  // 12 tensors per client: without releases, the 20 sets of 5 below would need 102.
  TestDaemon daemon({"--max-tensors-per-client", "12"});
  const std::string job = unique_job("release");
  ClientGroup ranks(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet a = client->register_tensors(filled(*client, 1, float(rank + 1)), {});  // set 0
    const TensorSet b = client->register_tensors(filled(*client, 1, float(rank + 1)), {});  // set 1
    if (int r = sums_to(*client, a, 3, "set 0 before its release"); r != kOk) return r;
    client->release(a);
    if (int r = refused([&] { client->allreduce(a, ReduceOptions{}); }, "set 0 was released", "an allreduce");
        r != kOk) {
      return r;
    }
    if (int r = refused([&] { client->release(a); }, "was released", "a second release"); r != kOk) return r;
    if (int r = sums_to(*client, b, 3, "set 1 after set 0's release"); r != kOk) return r;
    for (int i = 0; i < 20; ++i) {
      const TensorSet s = client->register_tensors(filled(*client, 5, 1.0f), {});
      if (int r = sums_to(*client, s, 2, "a set made after releases"); r != kOk) return r;
      client->release(s);
    }
    // Both ranks' releases before either leaves (a rank that leaves ends the job): the last
    // release is logged as every local rank's.
    return sums_to(*client, b, 6, "set 1 at the end");
  });
  for (int status : ranks.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
  CHECK_THAT(daemon.log(), Catch::Contains("set 0 released by every local rank") &&
                               Catch::Contains("set 21 released by every local rank"));
  check_still_serving(daemon);
}

TEST_CASE("release: a set released right after an operation was submitted on it lets that operation finish",
          "[integration][release]") {
  // Was: the daemon read the clients' Releases before the submissions still in their rings,
  // retired the set and failed the job on them ("was released by every local rank").
  TestDaemon daemon;
  const std::string job = unique_job("release-race");
  ClientGroup ranks(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    // A large set keeps the worker busy while the small one's submission waits in the ring.
    const std::vector<TensorSpec> big_spec = {TensorSpec{DType::kFloat32, 1 << 22, "dp"}};
    const TensorSet big = client->register_tensors(client->allocate_flat(big_spec), {});
    for (int i = 0; i < 30; ++i) {
      const TensorSet small = client->register_tensors(filled(*client, 1, float(rank + 1)), {});
      Work busy = client->allreduce(big, ReduceOptions{});
      Work work = client->allreduce(small, ReduceOptions{ReduceOp::kSum});
      client->release(small);
      if (!busy.wait(std::chrono::seconds(30)) || !work.wait(std::chrono::seconds(30))) return fail("timed out");
      for (float x : small.tensor(0).as<float>()) {
        if (x != 3) return fail("released set's last allreduce gave " + std::to_string(x));
      }
    }
    return kOk;
  });
  for (int status : ranks.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
  check_still_serving(daemon);
}

TEST_CASE("release: a released set's allgather and shard outputs serve the next sets that fit, results exact",
          "[integration][release]") {
  // The client's output pool (client/src/output_pool.h): the smallest released output that
  // holds a new set's is reused, so a program of ever-new layouts holds the most it needed at
  // once. Each set's allgather and reduce-scatter results are checked where they land.
  TestDaemon daemon;
  const std::string job = unique_job("release-outputs");
  ClientGroup ranks(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    RegisterOptions with_outputs;
    with_outputs.allgather = true;
    with_outputs.reduce_scatter = true;
    // One set of n floats, its outputs' addresses, and both of its results checked in full. Each
    // round's values are its own, so a reused output the daemon did not write shows the last
    // round's.
    int round_number = 0;
    const auto round = [&](size_t n, std::byte** gathered, std::byte** shard) -> int {
      const float base = float(10 * ++round_number);
      const TensorSet set = client->register_tensors(filled(*client, n / 16, base + float(rank + 1)), with_outputs);
      if (!client->allgather(set).wait(std::chrono::seconds(30))) return fail("allgather timed out");
      for (int r = 0; r < 2; ++r) {
        for (size_t i = 0; i < set.size(); ++i) {
          for (float x : set.gathered(r, i).as<float>()) {
            if (x != base + float(r + 1)) {
              return fail("round " + std::to_string(round_number) + ": rank " + std::to_string(r) + "'s tensor " +
                          std::to_string(i) + " gathered holds " + std::to_string(x));
            }
          }
        }
      }
      *gathered = set.gathered(0, 0).data();
      if (!client->reduce_scatter(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(30))) {
        return fail("reduce-scatter timed out");
      }
      for (float x : set.shard().as<float>()) {
        if (x != 2 * base + 3) return fail("round " + std::to_string(round_number) + ": the shard holds " + std::to_string(x));
      }
      *shard = set.shard().data();
      client->release(set);
      return kOk;
    };
    std::byte *gathered_big = nullptr, *shard_big = nullptr, *gathered = nullptr, *shard = nullptr;
    if (int r = round(4096, &gathered_big, &shard_big); r != kOk) return r;
    for (size_t n : {1024, 2048, 4096}) {  // each fits in the first set's outputs
      if (int r = round(n, &gathered, &shard); r != kOk) return r;
      // Either released output may serve either kind: the smallest that holds each.
      const bool reused = (gathered == gathered_big && shard == shard_big) || (gathered == shard_big && shard == gathered_big);
      if (!reused) return fail("a set of " + std::to_string(n) + " floats got new outputs, not the released set's");
    }
    // Its allgather output is larger than any released one: a new one. (Its shard output fits in
    // the released allgather output, and takes it.)
    if (int r = round(8192, &gathered, &shard); r != kOk) return r;
    if (gathered == gathered_big || gathered == shard_big) return fail("a larger set's gather output is a smaller set's");
    return kOk;
  });
  for (int status : ranks.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
  check_still_serving(daemon);
}

TEST_CASE("release: outputs made for a registration the daemon refuses serve the next registrations",
          "[integration][release]") {
  // Each refused registration made an allgather output and a shard output that no set held: 20
  // refusals left 40 segments, and with a cap of 8 the fifth refusal was for the cap, not for
  // the registration's own mistake.
  TestDaemon daemon({"--max-segments-per-client", "8"});
  ClientGroup ranks(1, [&](int) {
    auto client = join(daemon.socket(), unique_job("refused-outputs"), 0, 1);
    const SharedTensor real = client->allocate(TensorSpec{DType::kFloat32, 1024, "dp"});
    // Segment 999 is not the client's: only the daemon can tell, after the outputs are made.
    const std::vector<SharedTensor> foreign = {SharedTensor(DType::kFloat32, 1024, "dp", real.data(), 999, 0)};
    RegisterOptions with_outputs;
    with_outputs.allgather = true;
    with_outputs.reduce_scatter = true;
    for (int i = 0; i < 20; ++i) {
      try {
        client->register_tensors(foreign, with_outputs);
        return fail("a set in segment 999 was registered");
      } catch (const Error& e) {
        if (std::string(e.what()).find("unknown segment 999") == std::string::npos) {
          return fail("refusal " + std::to_string(i) + " is not for segment 999: " + e.what());
        }
      }
    }
    // And a good set still gets its outputs, within the cap, its results exact.
    const TensorSet set = client->register_tensors(std::vector<SharedTensor>{real}, with_outputs);
    for (float& x : real.as<float>()) x = 5;
    if (!client->allgather(set).wait(std::chrono::seconds(30))) return fail("allgather timed out");
    for (float x : set.gathered(0, 0).as<float>()) {
      if (x != 5) return fail("the gathered part holds " + std::to_string(x));
    }
    return kOk;
  });
  for (int status : ranks.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
  check_still_serving(daemon);
}

namespace {

// free_memory right after a release: refused by the daemon until every local rank released
// the set; retried here for up to 20 s.
int free_once_dropped(Client& client, const SharedTensor& tensor, const char* what) {
  for (int attempt = 0;; ++attempt) {
    try {
      client.free_memory(tensor);
      return kOk;
    } catch (const Error& e) {
      if (std::string(e.what()).find("still used by a set") == std::string::npos || attempt == 400) {
        return fail(std::string(what) + ": " + e.what());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TEST_CASE("free: free_memory gives memory back to the daemon, and a set's memory is refused by name until every local "
          "rank released it",
          "[integration][release][free]") {
  // 8 MiB for the user (both ranks): ten 2 MiB allocations a rank fit only if each free gives
  // its bytes back.
  TestDaemon daemon({"--max-bytes-per-user", std::to_string(8u << 20)});
  const std::string job = unique_job("free");
  ClientGroup ranks(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    RegisterOptions labeled;
    labeled.label = "the free test's set";
    const std::vector<SharedTensor> tensors = filled(*client, 4, float(rank + 1));
    const TensorSet set = client->register_tensors(tensors, labeled);
    if (int r = sums_to(*client, set, 3, "the set before its release"); r != kOk) return r;
    if (int r = refused([&] { client->free_memory(tensors[2]); }, "holds tensors of the free test's set (set 0), which is "
                        "registered: release it first", "freeing a registered set's memory");
        r != kOk) {
      return r;
    }
    if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(1));  // rank 0 frees before it released
    client->release(set);
    if (rank == 0) {
      if (int r = refused([&] { client->free_memory(tensors[0]); }, "is still used by a set of this client's",
                          "freeing a released set's memory before rank 1 released it");
          r != kOk) {
        return r;
      }
    }
    if (int r = free_once_dropped(*client, tensors[0], "freeing the released set's memory"); r != kOk) return r;
    if (int r = refused([&] { client->free_memory(tensors[1]); }, "(or it was freed already)", "freeing it twice");
        r != kOk) {
      return r;
    }
    for (int i = 0; i < 10; ++i) {
      const SharedTensor big = client->allocate(TensorSpec{DType::kFloat32, 512 * 1024, "dp"});  // 2 MiB
      client->free_memory(big);
    }
    // Fresh memory after the frees: a new set's results are right.
    const TensorSet again = client->register_tensors(filled(*client, 2, float(rank + 3)), {});
    return sums_to(*client, again, 7, "a set after the frees");
  });
  for (int status : ranks.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
  check_still_serving(daemon);
}

TEST_CASE("release: the outputs of released sets beyond a few go back to the daemon: ever-growing sets hold what "
          "they use, not the sum",
          "[integration][release][free]") {
  // 60 rounds of allgather sets of ever more floats (up to 3.75 MiB of output a rank), each
  // released, its tensors freed: 230 MiB of outputs a rank in all. 160 MiB for the user (both
  // ranks) is enough only if the client frees the old outputs (it keeps the newest 8).
  TestDaemon daemon({"--max-bytes-per-user", std::to_string(160u << 20)});
  const std::string job = unique_job("free-outputs");
  ClientGroup ranks(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    RegisterOptions with_outputs;
    with_outputs.allgather = true;
    for (int round = 1; round <= 60; ++round) {
      const size_t n = size_t(16 * 1024) * round;  // floats
      const SharedTensor t = client->allocate(TensorSpec{DType::kFloat32, n, "dp"});
      for (float& x : t.as<float>()) x = float(round * 10 + rank);
      const TensorSet set = client->register_tensors(std::vector<SharedTensor>{t}, with_outputs);
      if (!client->allgather(set).wait(std::chrono::seconds(30))) return fail("allgather timed out");
      for (int r = 0; r < 2; ++r) {
        const std::span<float> part = set.gathered(r, 0).as<float>();
        if (part.front() != float(round * 10 + r) || part.back() != float(round * 10 + r)) {
          return fail("round " + std::to_string(round) + ": rank " + std::to_string(r) + "'s part holds " +
                      std::to_string(part.front()));
        }
      }
      client->release(set);
      // Its outputs serve later sets or are freed: reading them now is refused by name.
      if (int r = refused([&] { (void)set.gathered(0, 0); }, "was released: its allgather and shard outputs",
                          "reading a released set's output");
          r != kOk) {
        return r;
      }
      if (int r = free_once_dropped(*client, t, "freeing a round's tensor"); r != kOk) return r;
    }
    return kOk;
  });
  for (int status : ranks.wait_all(std::chrono::seconds(180))) CHECK(exit_code(status) == kOk);
  check_still_serving(daemon);
}

}  // namespace gradsync::test
