// CollectiveEngine's default allreduce_inputs(), which engines that cannot combine local inputs
// themselves inherit: the inputs are combined into `out` in input order, and then `out` is
// handed to the engine's own in-place allreduce.
#include "daemon/engine/engine.h"

#include <catch2/catch.hpp>

#include <vector>

namespace gradsync {
namespace {

// Records what its in-place allreduce was given, and answers at once.
class RecordingEngine final : public CollectiveEngine {
 public:
  int node() const override { return 0; }
  int nodes() const override { return 2; }
  void allreduce(void* data, size_t count, const ReduceSpec&, EngineDone done) override {
    given = static_cast<float*>(data);
    seen.assign(given, given + count);
    done(Status());
  }
  void broadcast(void*, size_t, int, EngineDone done) override { done(Status::internal("not used")); }
  void allgather(const void*, size_t, void*, EngineDone done) override { done(Status::internal("not used")); }
  void reduce(void*, size_t, const ReduceSpec&, int, EngineDone done) override { done(Status::internal("not used")); }
  void abort(const Status&) override {}

  float* given = nullptr;
  std::vector<float> seen;
};

TEST_CASE("the default allreduce_inputs combines the inputs into out, then allreduces out", "[engine]") {
  std::vector<float> a = {1, 5, -2}, b = {10, 3, -7}, c = {100, 4, 0.5f};
  const std::vector<float> b_before = b, c_before = c;
  RecordingEngine engine;
  SECTION("sum, out is the first input") {
    const Status status = run_engine_call([&](EngineDone done) {
      engine.allreduce_inputs({a.data(), b.data(), c.data()}, a.data(), a.size(), ReduceSpec{}, std::move(done));
    });
    CHECK(status.ok());
    CHECK(engine.given == a.data());
    CHECK(engine.seen == std::vector<float>{111, 12, -8.5f});
  }
  SECTION("min, out apart from the inputs") {
    std::vector<float> out(3, 99);
    const Status status = run_engine_call([&](EngineDone done) {
      engine.allreduce_inputs({a.data(), b.data(), c.data()}, out.data(), out.size(),
                              ReduceSpec{reduce::Combine::kMin}, std::move(done));
    });
    CHECK(status.ok());
    CHECK(engine.given == out.data());
    CHECK(engine.seen == std::vector<float>{1, 3, -7});
  }
  CHECK(b == b_before);
  CHECK(c == c_before);
}

}  // namespace
}  // namespace gradsync
