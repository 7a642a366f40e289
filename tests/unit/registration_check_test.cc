// A registration's tensors may not share bytes (daemon/control/registration_check.h), however
// they are ordered, and empty tensors own none; an allgather output must hold world x packed
// bytes inside its segment, a reduce-scatter output the largest shard of a set of one dtype
// and group.
#include <catch2/catch.hpp>

#include "daemon/control/registration_check.h"

#include <cstring>
#include <optional>
#include "shared/shard.h"

namespace gradsync {

TEST_CASE("registration check: an overlap is found past an empty or short tensor between", "[registration]") {
  std::byte memory[4096];
  const auto f32 = [](uint64_t numel) { return plan::TensorLayout{DType::kFloat32, numel, "dp"}; };
  // A (bytes 0-255), B (empty, at 8), C (bytes 16-79): A and C overlap.
  CHECK_THAT(check_no_overlap({f32(64), f32(0), f32(16)}, {memory, memory + 8, memory + 16}).message(),
             Catch::Contains("tensor 2 overlaps tensor 0"));
  // A (0-255), B (16-19), C (32-95): B hides nothing; A overlaps both.
  CHECK_FALSE(check_no_overlap({f32(64), f32(1), f32(16)}, {memory, memory + 16, memory + 32}).ok());
  // Two tensors at one address.
  CHECK_FALSE(check_no_overlap({f32(4), f32(4)}, {memory, memory}).ok());
  // Back to back, and empty ones anywhere: fine.
  CHECK(check_no_overlap({f32(4), f32(0), f32(4), f32(0)}, {memory, memory + 8, memory + 16, memory}).ok());
}

namespace {

class HostRegion final : public MemoryRegion {
 public:
  explicit HostRegion(size_t size) : bytes_(size) {}
  MemoryKind kind() const override { return MemoryKind::kHostMemfd; }
  size_t size() const override { return bytes_.size(); }
  std::byte* base() const override { return const_cast<std::byte*>(bytes_.data()); }

 private:
  std::vector<std::byte> bytes_;
};

// A registration of two float32 tensors (packed: 64 bytes) in segment 1, with its allgather
// output at `offset` in segment 2 of `output_bytes`.
Status register_with_output(int world, uint64_t output_bytes, uint64_t offset, ResolvedSet* out) {
  Topology topology;
  REQUIRE(make_topology(world, world, 0, 0, {}, &topology).ok());
  SegmentMap segments;
  segments[1] = std::make_shared<HostRegion>(64);
  segments[2] = std::make_shared<HostRegion>(output_bytes);
  control::RegisterRequest request;
  for (uint64_t at : {0, 32}) {
    auto* t = request.add_tensors();
    t->set_dtype(control::FLOAT32);
    t->set_numel(8);
    t->set_segment_id(1);
    t->set_offset(at);
  }
  request.set_has_gather_output(true);
  request.set_gather_segment_id(2);
  request.set_gather_offset(offset);
  return check_registration(request, topology, world, segments, out);
}

}  // namespace

TEST_CASE("registration check: an allgather output must hold every rank's packed tensors", "[registration]") {
  // 4 ranks x 64 bytes: 256 bytes from the offset on. (A bound of one rank's 64 bytes would let
  // the daemon write up to 192 bytes past the client's segment.)
  ResolvedSet fits;
  REQUIRE(register_with_output(4, 256, 0, &fits).ok());  // exactly
  CHECK(fits.gather_output != nullptr);
  ResolvedSet at_end;
  CHECK(register_with_output(4, 320, 64, &at_end).ok());  // exactly, at an offset
  for (auto [bytes, offset] : {std::pair<uint64_t, uint64_t>{255, 0}, {256, 1}, {64, 0}, {320, 65}, {1000, ~0ull}}) {
    ResolvedSet refused;
    const Status status = register_with_output(4, bytes, offset, &refused);
    INFO(bytes << " bytes at offset " << offset);
    CHECK(status.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("allgather output: 4 x 64 bytes") && Catch::Contains("do not fit"));
  }
}

namespace {

// Two tensors of `dtypes` (8 elements each) in segment 1, with a reduce-scatter output at
// `offset` in segment `segment` (2 is one of `output_bytes`); the second tensor in `second_group`.
Status register_with_shard(int world, const std::vector<control::DType>& dtypes, const std::string& second_group,
                           uint64_t output_bytes, uint64_t offset, ResolvedSet* out, uint32_t segment = 2) {
  Topology topology;
  REQUIRE(make_topology(world, world, 0, 0, {{"pair", {0, 1}}}, &topology).ok());
  SegmentMap segments;
  segments[1] = std::make_shared<HostRegion>(256);
  segments[2] = std::make_shared<HostRegion>(output_bytes);
  control::RegisterRequest request;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    auto* t = request.add_tensors();
    t->set_dtype(dtypes[i]);
    t->set_numel(8);
    t->set_segment_id(1);
    t->set_offset(i * 64);
    if (i == 1) t->set_group(second_group);
  }
  request.set_has_shard_output(true);
  request.set_shard_segment_id(segment);
  request.set_shard_offset(offset);
  return check_registration(request, topology, world, segments, out);
}

}  // namespace

TEST_CASE("registration check: a reduce-scatter output holds the largest shard of one dtype and group",
          "[registration]") {
  // 16 float32 elements over 3 ranks: shards of ceil(16 / 3) = 6 elements, 24 bytes.
  ResolvedSet fits;
  REQUIRE(register_with_shard(3, {control::FLOAT32, control::FLOAT32}, "", 24, 0, &fits).ok());
  CHECK(fits.shard_output != nullptr);
  ResolvedSet at_end;
  CHECK(register_with_shard(3, {control::FLOAT32, control::FLOAT32}, "", 64, 40, &at_end).ok());
  for (auto [bytes, offset] : {std::pair<uint64_t, uint64_t>{23, 0}, {24, 1}, {64, 41}, {64, ~0ull}}) {
    ResolvedSet refused;
    const Status status = register_with_shard(3, {control::FLOAT32, control::FLOAT32}, "", bytes, offset, &refused);
    INFO(bytes << " bytes at offset " << offset);
    CHECK(status.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("reduce-scatter output: 24 bytes") && Catch::Contains("do not fit"));
  }
  ResolvedSet mixed;
  const Status status = register_with_shard(3, {control::FLOAT32, control::FLOAT64}, "", 64, 0, &mixed);
  CHECK(status.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("tensor 1 is float64[8] in group 'dp' but tensor 0 is float32[8]") &&
                                   Catch::Contains("one dtype and one process group"));
  ResolvedSet groups;
  CHECK_THAT(register_with_shard(3, {control::FLOAT32, control::FLOAT32}, "pair", 64, 0, &groups).message(),
             Catch::Contains("in group 'pair' but tensor 0 is float32[8] in group 'dp'"));
}

TEST_CASE("registration check: a reduce-scatter output is aligned and shares no byte with the set's tensors",
          "[registration]") {
  // The tensors are bytes [0, 32) and [64, 96) of segment 1 (256 bytes); the output 24 bytes.
  ResolvedSet apart;
  CHECK(register_with_shard(3, {control::FLOAT32, control::FLOAT32}, "", 0, 128, &apart, 1).ok());
  ResolvedSet between;
  CHECK(register_with_shard(3, {control::FLOAT32, control::FLOAT32}, "", 0, 32, &between, 1).ok());
  for (uint64_t offset : {16, 48, 80}) {
    ResolvedSet overlapping;
    const Status status = register_with_shard(3, {control::FLOAT32, control::FLOAT32}, "", 0, offset, &overlapping, 1);
    INFO("offset " << offset);
    CHECK_THAT(status.message(), Catch::Contains("reduce-scatter output overlaps tensor"));
  }
  ResolvedSet misaligned;
  CHECK_THAT(register_with_shard(3, {control::FLOAT32, control::FLOAT32}, "", 64, 2, &misaligned).message(),
             Catch::Contains("offset 2 is not a multiple of the 4-byte element size"));
}

TEST_CASE("registration check: a reduce-scatter output on a set of no tensors is refused", "[registration]") {
  // Found by the request fuzzer: the check read the first tensor of an empty set.
  Topology topology;
  REQUIRE(make_topology(2, 2, 0, 0, {}, &topology).ok());
  SegmentMap segments;
  segments[2] = std::make_shared<HostRegion>(64);
  control::RegisterRequest request;
  request.set_has_shard_output(true);
  request.set_shard_segment_id(2);
  ResolvedSet out;
  CHECK_THAT(check_registration(request, topology, 2, segments, &out).message(),
             Catch::Contains("reduce-scatter output: the set has no tensors"));
}

namespace {

// A registration of two float32 tensors of 8 elements (16 in the flat range) in segment 1, with
// `indices` as its mask at `offset` of segment 2 (`count` of them; default: all).
Status register_with_mask(const std::vector<uint64_t>& indices, uint64_t offset, ResolvedSet* out,
                          std::optional<uint64_t> count = std::nullopt) {
  Topology topology;
  REQUIRE(make_topology(2, 2, 0, 0, {}, &topology).ok());
  SegmentMap segments;
  segments[1] = std::make_shared<HostRegion>(64);
  auto mask = std::make_shared<HostRegion>(std::max<size_t>(64, offset + indices.size() * 8));
  std::memcpy(mask->base() + offset, indices.data(), indices.size() * 8);
  segments[2] = mask;
  control::RegisterRequest request;
  for (uint64_t at : {0, 32}) {
    auto* t = request.add_tensors();
    t->set_dtype(control::FLOAT32);
    t->set_numel(8);
    t->set_segment_id(1);
    t->set_offset(at);
  }
  request.set_has_mask(true);
  request.set_mask_segment_id(2);
  request.set_mask_offset(offset);
  request.set_mask_count(count.value_or(indices.size()));
  return check_registration(request, topology, 2, segments, out);
}

}  // namespace

TEST_CASE("registration check: a mask is strictly increasing indices within the set, read from its segment",
          "[registration]") {
  ResolvedSet ok;
  REQUIRE(register_with_mask({0, 7, 8, 15}, 8, &ok).ok());
  REQUIRE(ok.mask != nullptr);
  CHECK(*ok.mask == std::vector<uint64_t>{0, 7, 8, 15});
  ResolvedSet refused;
  CHECK_THAT(register_with_mask({3, 3}, 0, &refused).message(),
             Catch::Contains("mask: index 1 (3) does not follow index 0 (3)"));
  CHECK_THAT(register_with_mask({5, 2}, 0, &refused).message(),
             Catch::Contains("mask: index 1 (2) does not follow index 0 (5)"));
  CHECK_THAT(register_with_mask({0, 16}, 0, &refused).message(),
             Catch::Contains("mask: index 1 is 16, past the set's 16 elements"));
  CHECK_THAT(register_with_mask({0, ~0ull}, 0, &refused).message(), Catch::Contains("past the set's 16 elements"));
  CHECK_THAT(register_with_mask({}, 0, &refused, 0).message(), Catch::Contains("mask: it keeps no element"));
  CHECK_THAT(register_with_mask({1}, 0, &refused, 17).message(), Catch::Contains("mask: 17 indices for a set of 16"));
  // More indices than the segment holds, a count whose bytes overflow, and a misaligned offset.
  CHECK_THAT(register_with_mask({1, 2}, 56, &refused, 9).message(), Catch::Contains("do not fit, 8-byte aligned"));
  CHECK_THAT(register_with_mask({1, 2}, 0, &refused, (1ull << 61) + 1).message(), Catch::Contains("indices for a set"));
  CHECK_THAT(register_with_mask({1, 2}, 4, &refused).message(), Catch::Contains("do not fit, 8-byte aligned"));
}

TEST_CASE("registration check: a masked set takes no reduce-scatter output", "[registration]") {
  Topology topology;
  REQUIRE(make_topology(2, 2, 0, 0, {}, &topology).ok());
  SegmentMap segments;
  segments[1] = std::make_shared<HostRegion>(64);
  segments[2] = std::make_shared<HostRegion>(64);
  segments[3] = std::make_shared<HostRegion>(64);
  control::RegisterRequest request;
  auto* t = request.add_tensors();
  t->set_dtype(control::FLOAT32);
  t->set_numel(16);
  t->set_segment_id(1);
  request.set_has_shard_output(true);
  request.set_shard_segment_id(2);
  request.set_has_mask(true);
  request.set_mask_segment_id(3);
  request.set_mask_count(1);
  ResolvedSet refused;
  CHECK_THAT(check_registration(request, topology, 2, segments, &refused).message(),
             Catch::Contains("a masked set cannot have a reduce-scatter output"));
}

TEST_CASE("shards: the flat range split evenly over the group, the last ones shorter", "[registration]") {
  CHECK(shard_capacity(10, 3) == 4);
  CHECK(shard_of(10, 3, 0).first == 0);
  CHECK(shard_of(10, 3, 0).count == 4);
  CHECK(shard_of(10, 3, 1).first == 4);
  CHECK(shard_of(10, 3, 2).first == 8);
  CHECK(shard_of(10, 3, 2).count == 2);
  // Fewer elements than ranks: the last shards are empty, at the end of the range.
  CHECK(shard_capacity(2, 4) == 1);
  CHECK(shard_of(2, 4, 1).count == 1);
  CHECK(shard_of(2, 4, 2).first == 2);
  CHECK(shard_of(2, 4, 2).count == 0);
  CHECK(shard_of(2, 4, 3).count == 0);
  // 10 over 4: 3, 3, 3, 1; and 9 over 4: 3, 3, 3, 0 (ceil, not an even spread).
  CHECK(shard_of(10, 4, 3).count == 1);
  CHECK(shard_of(9, 4, 3).count == 0);
  CHECK(shard_of(12, 1, 0).count == 12);
  CHECK(shard_of(0, 3, 0).count == 0);
  // Every element is in exactly one shard.
  for (uint64_t n : {0, 1, 5, 37, 10'007}) {
    for (uint64_t w : {1, 2, 3, 7}) {
      uint64_t next = 0;
      for (uint64_t g = 0; g < w; ++g) {
        const ShardRange s = shard_of(n, w, g);
        CHECK(s.first == next);
        next = s.first + s.count;
      }
      CHECK(next == n);
    }
  }
}

}  // namespace gradsync
