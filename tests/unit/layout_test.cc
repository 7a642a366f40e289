#include "daemon/plan/layout.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gradsync::plan {
namespace {

TensorLayout of(DType dtype, uint64_t numel, std::string group = "dp") {
  return TensorLayout{dtype, numel, std::move(group)};
}

std::vector<TensorLayout> sample_layout() {
  return {of(DType::kFloat32, 1024), of(DType::kFloat16, 64, "tp"), of(DType::kFloat32, 7),
          of(DType::kInt64, 1)};
}

TEST_CASE("layout: describe names dtype, element count and group", "[layout]") {
  CHECK(describe(of(DType::kFloat32, 1024)) == "float32[1024] in group 'dp'");
  CHECK(describe(of(DType::kBFloat16, 0, "tp")) == "bfloat16[0] in group 'tp'");
}

TEST_CASE("layout: equal layouts have no difference", "[layout]") {
  const auto a = sample_layout();
  const auto b = sample_layout();
  CHECK(first_difference(a, 0, b, 1) == std::nullopt);
  CHECK(first_difference({}, 0, {}, 1) == std::nullopt);
}

TEST_CASE("layout: a numel difference names the tensor and both ranks", "[layout]") {
  auto a = sample_layout();
  auto b = sample_layout();
  b[0].numel = 2048;
  CHECK(first_difference(a, 0, b, 2) ==
        "tensor 0 differs: rank 0 has float32[1024] in group 'dp', rank 2 has float32[2048] in "
        "group 'dp'");
}

TEST_CASE("layout: a dtype difference is reported", "[layout]") {
  auto a = sample_layout();
  auto b = sample_layout();
  b[1].dtype = DType::kBFloat16;
  CHECK(first_difference(a, 1, b, 3) ==
        "tensor 1 differs: rank 1 has float16[64] in group 'tp', rank 3 has bfloat16[64] in "
        "group 'tp'");
}

TEST_CASE("layout: a group difference is reported", "[layout]") {
  auto a = sample_layout();
  auto b = sample_layout();
  b[3].group = "ep";
  CHECK(first_difference(a, 0, b, 5) ==
        "tensor 3 differs: rank 0 has int64[1] in group 'dp', rank 5 has int64[1] in group 'ep'");
}

TEST_CASE("layout: only the first of several differences is reported", "[layout]") {
  auto a = sample_layout();
  auto b = sample_layout();
  b[2].numel = 8;
  b[3].numel = 2;
  CHECK(first_difference(a, 0, b, 1) ==
        "tensor 2 differs: rank 0 has float32[7] in group 'dp', rank 1 has float32[8] in group "
        "'dp'");
}

TEST_CASE("layout: a count difference with an equal common prefix is reported", "[layout]") {
  auto a = sample_layout();
  auto b = sample_layout();
  b.pop_back();
  CHECK(first_difference(a, 0, b, 3) == "rank 0 registered 4 tensors, rank 3 registered 3");
  CHECK(first_difference(b, 3, a, 0) == "rank 3 registered 3 tensors, rank 0 registered 4");
  CHECK(first_difference({}, 1, a, 0) == "rank 1 registered 0 tensors, rank 0 registered 4");
}

TEST_CASE("layout: a differing tensor in the common prefix wins over a count difference",
          "[layout]") {
  auto a = sample_layout();
  auto b = sample_layout();
  b.erase(b.begin() + 1);  // rank 1 skipped a parameter: everything after it shifts
  CHECK(first_difference(a, 0, b, 1) ==
        "tensor 1 differs: rank 0 has float16[64] in group 'tp', rank 1 has float32[7] in group "
        "'dp'");
}

TEST_CASE("layout: equal layouts have equal fingerprints", "[layout]") {
  CHECK(fingerprint(sample_layout()) == fingerprint(sample_layout()));
  CHECK(fingerprint({}) == fingerprint({}));
}

TEST_CASE("layout: the fingerprint is a fixed function of the layout", "[layout]") {
  // Pinned values, computed independently (Python, FNV-1a 64 over the little-endian encoding
  // documented in layout.cc), so that a change to the encoding, which would make daemons of
  // different versions disagree, is noticed. No tensors: eight zero bytes of count.
  CHECK(fingerprint({}) == 0xa8c7f832281a39c5ull);
  CHECK(fingerprint(sample_layout()) == 0xe7112ab696efb92eull);
}

TEST_CASE("layout: the fingerprint changes with any field", "[layout]") {
  const uint64_t base = fingerprint(sample_layout());
  auto changed = sample_layout();

  SECTION("dtype") { changed[2].dtype = DType::kFloat64; }
  SECTION("numel") { changed[2].numel = 6; }
  SECTION("group") { changed[2].group = "dq"; }
  SECTION("empty group") { changed[2].group.clear(); }
  SECTION("one more tensor") { changed.push_back(of(DType::kFloat32, 0)); }
  SECTION("one tensor fewer") { changed.pop_back(); }

  CHECK(fingerprint(changed) != base);
}

TEST_CASE("layout: the fingerprint changes with the order of tensors", "[layout]") {
  const auto layout = sample_layout();
  auto swapped = layout;
  std::swap(swapped[0], swapped[2]);
  CHECK(fingerprint(swapped) != fingerprint(layout));
}

TEST_CASE("layout: the fingerprint keeps group boundaries apart", "[layout]") {
  const std::vector<TensorLayout> a = {of(DType::kUInt8, 1, "ab"), of(DType::kUInt8, 1, "c")};
  const std::vector<TensorLayout> b = {of(DType::kUInt8, 1, "a"), of(DType::kUInt8, 1, "bc")};
  CHECK(fingerprint(a) != fingerprint(b));
}

}  // namespace
}  // namespace gradsync::plan
