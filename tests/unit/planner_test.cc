#include "daemon/plan/planner.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "client/tools/model_layouts.h"

namespace gradsync::plan {
namespace {

using Indices = std::vector<uint32_t>;

TensorLayout f32(uint64_t numel, std::string group = "dp") {
  return TensorLayout{DType::kFloat32, numel, std::move(group)};
}

TensorLayout of(DType dtype, uint64_t numel, std::string group = "dp") {
  return TensorLayout{dtype, numel, std::move(group)};
}

PlanOptions cap(uint64_t cap_bytes) { return PlanOptions{cap_bytes}; }

// The invariants every plan must satisfy, whatever the layout: each tensor in exactly one
// bucket, bucket_of_tensor agreeing with the buckets, one key and a correct byte sum per bucket.
void check_consistent(const std::vector<TensorLayout>& tensors, const Plan& plan) {
  REQUIRE(plan.bucket_of_tensor.size() == tensors.size());
  std::vector<int> seen(tensors.size(), 0);
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const Bucket& bucket = plan.buckets[b];
    REQUIRE_FALSE(bucket.tensors.empty());
    uint64_t bytes = 0;
    for (uint32_t t : bucket.tensors) {
      REQUIRE(t < tensors.size());
      ++seen[t];
      CHECK(plan.bucket_of_tensor[t] == b);
      CHECK(tensors[t].group == bucket.group);
      CHECK(tensors[t].dtype == bucket.dtype);
      bytes += tensors[t].numel * dtype_size(tensors[t].dtype);
    }
    CHECK(bucket.bytes == bytes);
  }
  for (int count : seen) CHECK(count == 1);
}

// torchvision's resnet50, exactly as the demo and the benchmark register it (one copy of the
// layout, in client/tools/model_layouts.cc).
std::vector<TensorLayout> resnet50_layout() {
  std::vector<TensorLayout> tensors;
  for (const TensorSpec& spec : gradsync::resnet50_layout()) tensors.push_back(of(spec.dtype, spec.numel, spec.group));
  return tensors;
}

TEST_CASE("planner: an empty layout gives an empty plan", "[planner]") {
  const Plan plan = plan_buckets({}, PlanOptions{});
  CHECK(plan.buckets.empty());
  CHECK(plan.bucket_of_tensor.empty());
}

TEST_CASE("planner: tensors of different dtypes go to different buckets", "[planner]") {
  const std::vector<TensorLayout> tensors = {of(DType::kFloat32, 4), of(DType::kFloat16, 4),
                                             of(DType::kFloat32, 4), of(DType::kBFloat16, 4)};
  const Plan plan = plan_buckets(tensors, cap(0));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 3);
  CHECK(plan.buckets[0].dtype == DType::kBFloat16);
  CHECK(plan.buckets[0].tensors == Indices{3});
  CHECK(plan.buckets[1].dtype == DType::kFloat32);
  CHECK(plan.buckets[1].tensors == Indices{2, 0});
  CHECK(plan.buckets[2].dtype == DType::kFloat16);
  CHECK(plan.buckets[2].tensors == Indices{1});
}

TEST_CASE("planner: tensors of different groups go to different buckets", "[planner]") {
  const std::vector<TensorLayout> tensors = {f32(4, "dp"), f32(4, "tp"), f32(4, "dp"),
                                             f32(4, "tp")};
  const Plan plan = plan_buckets(tensors, cap(0));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 2);
  CHECK(plan.buckets[0].group == "tp");
  CHECK(plan.buckets[0].tensors == Indices{3, 1});
  CHECK(plan.buckets[1].group == "dp");
  CHECK(plan.buckets[1].tensors == Indices{2, 0});
}

TEST_CASE("planner: bucket 0 holds the last-registered tensor, tensors in reverse order",
          "[planner]") {
  const std::vector<TensorLayout> tensors = {f32(1), f32(2), f32(3), f32(4), f32(5)};
  // Cap 40 bytes: float32[5] and [4] make 36; adding [3] would make 48.
  const Plan plan = plan_buckets(tensors, cap(40));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 2);
  CHECK(plan.buckets[0].tensors == Indices{4, 3});
  CHECK(plan.buckets[0].bytes == 36);
  CHECK(plan.buckets[1].tensors == Indices{2, 1, 0});
  CHECK(plan.buckets[1].bytes == 24);
  CHECK(plan.bucket_of_tensor == Indices{1, 1, 1, 0, 0});
}

TEST_CASE("planner: no bucket exceeds the cap", "[planner]") {
  std::vector<TensorLayout> tensors;
  for (uint64_t i = 0; i < 200; ++i) tensors.push_back(f32(1 + (i * 37) % 101));
  const uint64_t cap_bytes = 1000;
  const Plan plan = plan_buckets(tensors, cap(cap_bytes));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() > 1);
  for (const Bucket& bucket : plan.buckets) CHECK(bucket.bytes <= cap_bytes);
  // Greedy: a bucket was closed only because its successor's first tensor did not fit.
  for (size_t b = 0; b + 1 < plan.buckets.size(); ++b) {
    const uint32_t next_first = plan.buckets[b + 1].tensors.front();
    CHECK(plan.buckets[b].bytes + tensors[next_first].numel * 4 > cap_bytes);
  }
}

TEST_CASE("planner: a bucket filled to exactly the cap stays one bucket", "[planner]") {
  const std::vector<TensorLayout> tensors = {f32(10), f32(6), f32(4)};
  const Plan plan = plan_buckets(tensors, cap(80));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 1);
  CHECK(plan.buckets[0].bytes == 80);
  CHECK(plan.buckets[0].tensors == Indices{2, 1, 0});
}

TEST_CASE("planner: one byte over the cap opens a new bucket", "[planner]") {
  const std::vector<TensorLayout> tensors = {of(DType::kUInt8, 1), of(DType::kUInt8, 6),
                                             of(DType::kUInt8, 4)};
  const Plan plan = plan_buckets(tensors, cap(10));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 2);
  CHECK(plan.buckets[0].tensors == Indices{2, 1});
  CHECK(plan.buckets[0].bytes == 10);
  CHECK(plan.buckets[1].tensors == Indices{0});
  CHECK(plan.buckets[1].bytes == 1);
}

TEST_CASE("planner: a tensor larger than the cap gets a bucket of its own", "[planner]") {
  const std::vector<TensorLayout> tensors = {f32(2), f32(100), f32(0), f32(3)};
  const Plan plan = plan_buckets(tensors, cap(40));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 3);
  CHECK(plan.buckets[0].tensors == Indices{3, 2});
  CHECK(plan.buckets[1].tensors == Indices{1});
  CHECK(plan.buckets[1].bytes == 400);
  CHECK(plan.buckets[2].tensors == Indices{0});
}

TEST_CASE("planner: an oversized bucket takes not even a zero-element tensor", "[planner]") {
  const std::vector<TensorLayout> tensors = {f32(0), f32(100)};
  const Plan plan = plan_buckets(tensors, cap(40));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 2);
  CHECK(plan.buckets[0].tensors == Indices{1});
  CHECK(plan.buckets[1].tensors == Indices{0});
  CHECK(plan.buckets[1].bytes == 0);
}

TEST_CASE("planner: zero-element tensors join their key's open bucket", "[planner]") {
  const std::vector<TensorLayout> tensors = {f32(0), f32(10), f32(0), f32(0, "tp")};
  const Plan plan = plan_buckets(tensors, cap(40));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 2);
  CHECK(plan.buckets[0].group == "tp");
  CHECK(plan.buckets[0].bytes == 0);
  CHECK(plan.buckets[1].tensors == Indices{2, 1, 0});
  CHECK(plan.buckets[1].bytes == 40);
}

TEST_CASE("planner: cap 0 gives one bucket per key", "[planner]") {
  std::vector<TensorLayout> tensors;
  for (int i = 0; i < 50; ++i) {
    tensors.push_back(f32(1'000'000'000));
    tensors.push_back(of(DType::kFloat16, 1'000'000'000, "tp"));
  }
  const Plan plan = plan_buckets(tensors, cap(0));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 2);
  CHECK(plan.buckets[0].group == "tp");
  CHECK(plan.buckets[0].tensors.size() == 50);
  CHECK(plan.buckets[0].bytes == 100'000'000'000ull);
  CHECK(plan.buckets[1].group == "dp");
  CHECK(plan.buckets[1].tensors.size() == 50);
  CHECK(plan.buckets[1].bytes == 200'000'000'000ull);
}

TEST_CASE("planner: interleaved keys fill their own buckets independently", "[planner]") {
  // Registration order, with float16 in group "tp" interleaved among float32 "dp" tensors.
  const std::vector<TensorLayout> tensors = {
      f32(5),                          // 0
      of(DType::kFloat16, 8, "tp"),    // 1
      f32(5),                          // 2
      of(DType::kFloat16, 8, "tp"),    // 3
      f32(5),                          // 4
      of(DType::kFloat16, 8, "tp"),    // 5
      f32(5),                          // 6
  };
  // Cap 40: two float32[5] (20 bytes each) per bucket; two float16[8] (16 bytes each) per
  // bucket. Reverse visit: 6 opens b0(dp), 5 opens b1(tp), 4 -> b0, 3 -> b1, 2 opens b2(dp),
  // 1 opens b3(tp), 0 -> b2.
  const Plan plan = plan_buckets(tensors, cap(40));
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 4);
  CHECK(plan.buckets[0].tensors == Indices{6, 4});
  CHECK(plan.buckets[1].tensors == Indices{5, 3});
  CHECK(plan.buckets[2].tensors == Indices{2, 0});
  CHECK(plan.buckets[3].tensors == Indices{1});
  CHECK(plan.bucket_of_tensor == Indices{2, 3, 2, 1, 0, 1, 0});
}

TEST_CASE("planner: bucket_of_tensor agrees with the buckets", "[planner]") {
  std::vector<TensorLayout> tensors;
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kInt64};
  const char* groups[] = {"dp", "tp", "pp"};
  for (uint64_t i = 0; i < 300; ++i) {
    tensors.push_back(of(dtypes[i % 3], (i * 7919) % 257, groups[(i / 3) % 3]));
  }
  const Plan plan = plan_buckets(tensors, cap(512));
  check_consistent(tensors, plan);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const auto& members = plan.buckets[plan.bucket_of_tensor[t]].tensors;
    CHECK(std::count(members.begin(), members.end(), t) == 1);
  }
}

TEST_CASE("planner: ResNet-50 with the default 25 MiB cap plans 5 buckets", "[planner]") {
  const std::vector<TensorLayout> tensors = resnet50_layout();
  REQUIRE(tensors.size() == 161);
  uint64_t params = 0;
  for (const TensorLayout& tensor : tensors) params += tensor.numel;
  REQUIRE(params == 25'557'032);

  // Worked out by hand from the parameter sizes (cap 26,214,400 bytes), walking back from fc:
  //   b0  fc.bias .. layer4.1.bn3.weight                6,515,688 params; + layer4.1.conv3
  //       (1,048,576) would make 30,257,056 bytes
  //   b1  layer4.1.conv3 .. layer4.0.downsample.1.weight 4,462,592; + downsample.0 (2,097,152)
  //       would make 26,238,976 bytes, 24,576 over
  //   b2  layer4.0.downsample.0 .. layer3.5.bn2.weight  6,300,160; + layer3.5.conv2 (589,824)
  //       would make 27,559,936
  //   b3  layer3.5.conv2 .. layer3.0.bn2.weight         6,112,256; + layer3.0.conv2 (589,824)
  //       would make 26,808,320
  //   b4  layer3.0.conv2 .. conv1.weight                2,166,336
  const Plan plan = plan_buckets(tensors, PlanOptions{});
  check_consistent(tensors, plan);
  REQUIRE(plan.buckets.size() == 5);
  const uint64_t expected_bytes[] = {26'062'752, 17'850'368, 25'200'640, 24'449'024, 8'665'344};
  const size_t expected_counts[] = {13, 9, 15, 48, 76};
  const uint32_t expected_first[] = {160, 147, 138, 123, 75};
  for (size_t b = 0; b < 5; ++b) {
    CHECK(plan.buckets[b].bytes == expected_bytes[b]);
    CHECK(plan.buckets[b].bytes <= kDefaultBucketCapBytes);
    CHECK(plan.buckets[b].tensors.size() == expected_counts[b]);
    CHECK(plan.buckets[b].tensors.front() == expected_first[b]);
  }
  CHECK(plan.buckets[4].tensors.back() == 0);
}

// Scale, checked by structure (unit tests are not timed; see the benchmark for speed): 100k
// tensors of 4 KiB each, their keys cycling through 4 (group, dtype) pairs in registration order,
// so each key has 25,000 tensors and exactly 6,400 of them fill a default 25 MiB bucket.
TEST_CASE("planner: 100k tensors over 4 interleaved keys are each planned once, 6,400 to a full bucket",
          "[planner]") {
  constexpr uint32_t kTensors = 100'000;
  constexpr uint32_t kKeys = 4;
  constexpr uint32_t kPerFullBucket = kDefaultBucketCapBytes / 4096;  // 6,400
  constexpr uint32_t kPerKey = kTensors / kKeys;                      // 25,000
  constexpr uint32_t kBucketsPerKey = (kPerKey + kPerFullBucket - 1) / kPerFullBucket;  // 4
  constexpr uint32_t kPerLastBucket = kPerKey - (kBucketsPerKey - 1) * kPerFullBucket;  // 5,800
  const TensorLayout key_layouts[kKeys] = {of(DType::kFloat32, 1024, "dp"), of(DType::kBFloat16, 2048, "tp"),
                                           of(DType::kFloat32, 1024, "pp"), of(DType::kBFloat16, 2048, "ep")};
  std::vector<TensorLayout> tensors;
  tensors.reserve(kTensors);
  for (uint32_t i = 0; i < kTensors; ++i) tensors.push_back(key_layouts[i % kKeys]);

  const Plan plan = plan_buckets(tensors, PlanOptions{});
  check_consistent(tensors, plan);  // every tensor in exactly one bucket
  REQUIRE(plan.buckets.size() == kKeys * kBucketsPerKey);
  // The reverse visit opens one bucket per key in the order ep, pp, tp, dp (the keys of tensors
  // 99,999 down to 99,996), and the keys fill at the same pace, so that order repeats. Bucket b
  // holds, in descending order, every 4th tensor of one contiguous stretch of the layout.
  for (uint32_t b = 0; b < plan.buckets.size(); ++b) {
    INFO("bucket " << b);
    const Bucket& bucket = plan.buckets[b];
    const uint32_t key = kKeys - 1 - b % kKeys;
    const uint32_t fill = b / kKeys;  // how many buckets of this key were opened before
    const uint32_t count = fill + 1 < kBucketsPerKey ? kPerFullBucket : kPerLastBucket;
    CHECK(bucket.group == key_layouts[key].group);
    CHECK(bucket.dtype == key_layouts[key].dtype);
    REQUIRE(bucket.tensors.size() == count);
    CHECK(bucket.bytes == uint64_t{count} * 4096);
    const uint32_t first = kTensors - kKeys + key - fill * kPerFullBucket * kKeys;
    CHECK(bucket.tensors.front() == first);
    for (size_t j = 1; j < bucket.tensors.size(); ++j) {
      if (bucket.tensors[j] != bucket.tensors[j - 1] - kKeys) {
        FAIL("tensor " << bucket.tensors[j] << " follows " << bucket.tensors[j - 1]);
      }
    }
  }
}

}  // namespace
}  // namespace gradsync::plan
