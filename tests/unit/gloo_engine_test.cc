// The Gloo engine between two engines in this process (a Gloo HashStore instead of the peer
// service): what an abort does to the call that lingers in Gloo, and to the calls after it.
#include "daemon/engine/gloo/engine.h"

#include <gloo/rendezvous/hash_store.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <vector>

namespace gradsync::gloo_engine {
namespace {

using namespace std::chrono_literals;

EngineSpec spec_of(int node, std::chrono::milliseconds timeout) {
  EngineSpec spec;
  spec.job = "gloo-engine-test";
  spec.prefix = "g0";
  spec.node = node;
  spec.nodes = 2;
  spec.timeout = timeout;
  return spec;
}

// An allreduce of `data` whose answer lands in the returned future; its Done holds `data`, as
// the engine's contract asks of callers.
std::future<Status> allreduce(HostCollectiveEngine& engine, const std::shared_ptr<std::vector<float>>& data) {
  auto answer = std::make_shared<std::promise<Status>>();
  std::future<Status> future = answer->get_future();
  engine.allreduce(data->data(), data->size(), ReduceSpec{}, [answer, data](const Status& s) { answer->set_value(s); });
  return future;
}

TEST_CASE("gloo engine: calls queued at an abort or made after it fail at once, not behind a call lingering in Gloo",
          "[gloo]") {
  // Gloo's own timeout is long, so a call that waited for the lingering one would be seen.
  constexpr auto kGlooTimeout = 20s;
  ::gloo::rendezvous::HashStore store;
  GlooTransport transport;
  std::unique_ptr<HostCollectiveEngine> engine0, engine1;
  auto connected1 = std::async(std::launch::async, [&] { return make_engine(spec_of(1, kGlooTimeout), transport, store, &engine1); });
  REQUIRE(make_engine(spec_of(0, kGlooTimeout), transport, store, &engine0).ok());
  REQUIRE(connected1.get().ok());

  // Node 1 never calls: node 0's allreduce blocks in Gloo, waiting for it.
  auto data = std::make_shared<std::vector<float>>(1 << 16, 1.0f);
  std::future<Status> first = allreduce(*engine0, data);
  // A second call queues behind it.
  std::future<Status> queued = allreduce(*engine0, data);
  CHECK(first.wait_for(200ms) == std::future_status::timeout);
  CHECK(queued.wait_for(0ms) == std::future_status::timeout);
  const auto aborted_at = std::chrono::steady_clock::now();
  engine0->abort(Status::aborted("job failed: test"));
  REQUIRE(first.wait_for(5s) == std::future_status::ready);
  CHECK(first.get().code() == ErrorCode::kAborted);
  // It was answered only after the engine's 500 ms wait for it to leave Gloo: it lingers there.
  CHECK(std::chrono::steady_clock::now() - aborted_at >= 400ms);
  // The queued call never entered Gloo: it is answered with the abort, not after the call
  // that lingers there.
  REQUIRE(queued.wait_for(5s) == std::future_status::ready);
  CHECK(queued.get().code() == ErrorCode::kAborted);
  CHECK(std::chrono::steady_clock::now() - aborted_at < 2s);

  // The blocked Gloo call is still in Gloo (until its 20 s timeout); the next call is answered
  // at once with the abort's reason.
  const auto started = std::chrono::steady_clock::now();
  std::future<Status> second = allreduce(*engine0, data);
  REQUIRE(second.wait_for(5s) == std::future_status::ready);
  const Status answer = second.get();
  CHECK(answer.code() == ErrorCode::kAborted);
  CHECK_THAT(answer.message(), Catch::Contains("job failed: test"));
  INFO("answered after " << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count() << " ms");
  CHECK(std::chrono::steady_clock::now() - started < 2s);
  engine1->abort(Status::aborted("test over"));
}

}  // namespace
}  // namespace gradsync::gloo_engine
