// The Gloo engine between two engines in this process (a Gloo HashStore instead of the peer
// service): what an abort does to the call that lingers in Gloo, and to the calls after it.
#include "daemon/engine/gloo/engine.h"

#include "shared/half.h"

#include <gloo/rendezvous/hash_store.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <vector>

namespace gradsync::gloo_engine {
namespace {

using namespace std::chrono_literals;

EngineSpec spec_of(int node, std::chrono::milliseconds timeout, int nodes = 2) {
  EngineSpec spec;
  spec.job = "gloo-engine-test";
  spec.prefix = "g0";
  spec.node = node;
  spec.nodes = nodes;
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

// `nodes` engines over one HashStore, connected.
std::vector<std::unique_ptr<HostCollectiveEngine>> connect(int nodes, ::gloo::rendezvous::HashStore& store) {
  std::vector<std::unique_ptr<HostCollectiveEngine>> engines(static_cast<size_t>(nodes));
  std::vector<std::future<Status>> made;
  for (int n = 0; n < nodes; ++n) {
    made.push_back(std::async(std::launch::async, [&, n] {
      return make_engine(spec_of(n, 20s, nodes), GlooTransport{}, store, &engines[static_cast<size_t>(n)]);
    }));
  }
  for (auto& m : made) REQUIRE(m.get().ok());
  return engines;
}

// Every node's reduce_scatter of its own buffer, waited for.
void reduce_scatter_all(std::vector<std::unique_ptr<HostCollectiveEngine>>& engines,
                        std::vector<std::vector<uint8_t>>& data, const std::vector<uint64_t>& parts,
                        const ReduceSpec& spec) {
  std::vector<std::future<Status>> answers;
  for (size_t n = 0; n < engines.size(); ++n) {
    auto answer = std::make_shared<std::promise<Status>>();
    answers.push_back(answer->get_future());
    engines[n]->reduce_scatter(data[n].data(), parts, spec, [answer](const Status& s) { answer->set_value(s); });
  }
  for (auto& a : answers) {
    REQUIRE(a.wait_for(30s) == std::future_status::ready);
    REQUIRE(a.get().ok());
  }
}

TEST_CASE("gloo engine: reduce_scatter leaves each node its part combined in node order, the rest untouched",
          "[gloo]") {
  ::gloo::rendezvous::HashStore store;
  auto engines = connect(3, store);
  // Node 1's part is empty: a node whose ranks own no shard of a bucket.
  const std::vector<uint64_t> parts = {5, 0, 70'001};
  const uint64_t total = 70'006;

  SECTION("float32 sum and max, and float64 min") {
    for (const auto& [spec, dtype] : {std::pair{ReduceSpec{reduce::Combine::kSum, DType::kFloat32}, DType::kFloat32},
                                      std::pair{ReduceSpec{reduce::Combine::kMax, DType::kFloat32}, DType::kFloat32},
                                      std::pair{ReduceSpec{reduce::Combine::kMin, DType::kFloat64}, DType::kFloat64}}) {
      const size_t element = dtype_size(dtype);
      std::vector<std::vector<uint8_t>> data(3, std::vector<uint8_t>(total * element));
      auto value = [](size_t n, uint64_t i) { return static_cast<double>((n * 7 + 1) * 1000 + i % 977) - 1500.0; };
      for (size_t n = 0; n < 3; ++n) {
        for (uint64_t i = 0; i < total; ++i) {
          if (dtype == DType::kFloat32) reinterpret_cast<float*>(data[n].data())[i] = static_cast<float>(value(n, i));
          else reinterpret_cast<double*>(data[n].data())[i] = value(n, i);
        }
      }
      reduce_scatter_all(engines, data, parts, spec);
      for (size_t n = 0; n < 3; ++n) {
        uint64_t first = 0;
        for (size_t m = 0; m < n; ++m) first += parts[m];
        const uint64_t count = parts[n];
        for (uint64_t i = 0; i < total; ++i) {
          const double got = dtype == DType::kFloat32 ? reinterpret_cast<const float*>(data[n].data())[i]
                                                      : reinterpret_cast<const double*>(data[n].data())[i];
          double want = value(n, i);  // outside the node's part: as it was
          if (i >= first && i < first + count) {
            want = value(0, i);
            for (size_t m = 1; m < 3; ++m) {
              want = spec.op == reduce::Combine::kSum   ? want + value(m, i)
                     : spec.op == reduce::Combine::kMax ? std::max(want, value(m, i))
                                                        : std::min(want, value(m, i));
            }
          }
          INFO("node " << n << " element " << i << " op " << static_cast<int>(spec.op));
          REQUIRE(got == want);
        }
      }
    }
  }

  SECTION("a bfloat16 wire: every combine widens to float32 and rounds back, in node order") {
    std::vector<std::vector<uint8_t>> data(3, std::vector<uint8_t>(total * 2));
    // Values whose float32 sums round in bfloat16, so the order of the roundings shows.
    auto value = [](size_t n, uint64_t i) { return 1.0f + static_cast<float>(n + 1) * 0.0078125f * (1 + i % 5) / 3.0f; };
    for (size_t n = 0; n < 3; ++n) {
      for (uint64_t i = 0; i < total; ++i) {
        reinterpret_cast<uint16_t*>(data[n].data())[i] = float_to_bfloat16(value(n, i));
      }
    }
    ReduceSpec spec{reduce::Combine::kSum, DType::kFloat32};
    spec.wire = DType::kBFloat16;
    reduce_scatter_all(engines, data, parts, spec);
    const auto rounded = [](float x) { return bfloat16_to_float(float_to_bfloat16(x)); };
    for (uint64_t i = 5; i < total; ++i) {
      float want = rounded(value(0, i));
      for (size_t m = 1; m < 3; ++m) want = rounded(want + rounded(value(m, i)));
      INFO("element " << i);
      REQUIRE(bfloat16_to_float(reinterpret_cast<const uint16_t*>(data[2].data())[i]) == want);
    }
  }
}

}  // namespace
}  // namespace gradsync::gloo_engine
