// The CUDA backend's gather and scatter functors, run on the host exactly as the kernels run
// them on the device (one item per block, lanes striding over its elements), against the host
// reduction (reduce(), and the staged accumulate()). Every dtype and valid argument set, 1 to 3
// same-GPU clients, tensor sizes off every vector width and item boundary, and tensors both
// 16-byte aligned (vector path) and misaligned (element path).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "daemon/backend/cuda/functors.h"
#include "daemon/backend/cuda/work_items.h"
#include "daemon/reduce/staged.h"
#include "tests/unit/reduce_cases.h"

namespace gradsync::cuda {
namespace {

using reduce::KernelArgs;
using reduce::cases::Bytes;

// Sizes that cross the vector width (16 bytes), the work item (kItemElements) and neither. The
// first three keep the bucket offsets 16-byte aligned, so with aligned tensors their items take
// the vector path; the rest shift every later offset off alignment (the element path).
constexpr uint64_t kSizes[] = {64, kItemElements, 2 * kItemElements + 3, 1, 7, 33, kItemElements + 5};

// Runs every item of the table the way a kernel of `lanes` threads per block does.
template <typename Functor>
void run_like_a_kernel(const Functor& functor, const BucketTable& table, uint32_t lanes) {
  for (uint64_t item = 0; item < table.item_count; ++item) {
    for (uint32_t lane = 0; lane < lanes; ++lane) functor(table, item, lane, lanes);
  }
}

// One client's tensors in one buffer, each starting `skew` bytes past a 64-byte boundary.
struct ClientMemory {
  Bytes bytes;
  std::vector<size_t> offset;  // per tensor, bytes
};

ClientMemory place(DType dtype, size_t skew) {
  ClientMemory memory;
  size_t at = 0;
  for (uint64_t size : kSizes) {
    at = (at + 63) / 64 * 64 + skew;
    memory.offset.push_back(at);
    at += size * dtype_size(dtype);
  }
  memory.bytes.resize(at + 64);
  return memory;
}

struct Outcome {
  std::string gathered;   // "" when acc equals staged accumulate()
  std::string scattered;  // "" when every client's tensors equal reduce()
};

Outcome check(const KernelArgs& args, uint32_t clients, size_t skew, uint32_t lanes, std::mt19937_64& rng) {
  const DType dtype = args.dtype;
  const size_t element = dtype_size(dtype);
  const size_t acc_element = dtype_size(reduce::accumulation_dtype(dtype));
  std::vector<ClientMemory> memory;
  for (uint32_t c = 0; c < clients; ++c) {
    memory.push_back(place(dtype, skew));
    reduce::cases::fill_random(dtype, memory.back().bytes, memory.back().bytes.size() / element,
                               reduce::cases::Nans::kExcluded, rng);
  }
  const std::vector<ClientMemory> original = memory;

  std::vector<Segment> segments;
  uint64_t total = 0;
  for (size_t t = 0; t < std::size(kSizes); ++t) {
    Segment s;
    s.bucket_offset = total;
    s.count = kSizes[t];
    for (uint32_t c = 0; c < clients; ++c) s.address[c] = memory[c].bytes.data() + memory[c].offset[t];
    segments.push_back(s);
    total += kSizes[t];
  }
  const std::vector<WorkItem> items = cut_into_items(segments);
  alignas(64) static std::byte acc_storage[(3 * kItemElements + 64) * 8 * std::size(kSizes)];
  BucketTable table{segments.data(), items.data(), items.size(), clients, acc_storage};

  Outcome outcome;
  dispatch(args, [&]<typename Codec, reduce::Combine kCombine, reduce::Scale kScale, bool kRound>() {
    using Acc = typename Codec::Acc;
    const Acc divisor = kScale == reduce::Scale::kNone ? Acc{1} : static_cast<Acc>(args.divisor);
    run_like_a_kernel(GatherItem<Codec, kCombine, kScale, kRound>{divisor}, table, lanes);
    // The gathered bucket against the staged accumulate() of the same tensors.
    for (size_t t = 0; t < std::size(kSizes) && outcome.gathered.empty(); ++t) {
      std::vector<const void*> inputs;
      for (uint32_t c = 0; c < clients; ++c) inputs.push_back(original[c].bytes.data() + original[c].offset[t]);
      Bytes want(kSizes[t] * acc_element);
      reduce::accumulate(args, inputs, want.data(), kSizes[t]);
      Bytes got(acc_storage + segments[t].bucket_offset * acc_element,
                acc_storage + (segments[t].bucket_offset + kSizes[t]) * acc_element);
      outcome.gathered = reduce::cases::first_difference(got, want, acc_element);
      if (!outcome.gathered.empty()) outcome.gathered = "tensor " + std::to_string(t) + ": " + outcome.gathered;
    }
    if constexpr (kCombine == reduce::Combine::kSum) {
      run_like_a_kernel(ScatterItem<Codec, kScale, kRound>{divisor}, table, lanes);
    } else {
      run_like_a_kernel(ScatterItem<Codec, reduce::Scale::kNone, false>{Acc{1}}, table, lanes);
    }
  });
  // Every client's tensors against reduce() over the original values.
  for (size_t t = 0; t < std::size(kSizes) && outcome.scattered.empty(); ++t) {
    std::vector<const void*> inputs;
    for (uint32_t c = 0; c < clients; ++c) inputs.push_back(original[c].bytes.data() + original[c].offset[t]);
    Bytes want(kSizes[t] * element);
    void* const out = want.data();
    reduce::reduce(args, inputs, std::span<void* const>(&out, 1), kSizes[t]);
    for (uint32_t c = 0; c < clients && outcome.scattered.empty(); ++c) {
      const std::byte* at = memory[c].bytes.data() + memory[c].offset[t];
      outcome.scattered = reduce::cases::first_difference(Bytes(at, at + kSizes[t] * element), want, element);
      if (!outcome.scattered.empty()) {
        outcome.scattered = "client " + std::to_string(c) + " tensor " + std::to_string(t) + ": " + outcome.scattered;
      }
    }
  }
  return outcome;
}

}  // namespace

TEST_CASE("cuda functors: gather equals accumulate() and gather+scatter equals reduce(), bit for bit",
          "[cuda][functors]") {
  std::mt19937_64 rng(20261201);
  for (DType dtype : reduce::cases::kAllDTypes) {
    for (const KernelArgs& args : reduce::cases::valid_args(dtype)) {
      for (uint32_t clients = 1; clients <= 3; ++clients) {
        // skew 0: every address 16-byte aligned (vector path); one element: the element path.
        for (size_t skew : {size_t{0}, dtype_size(dtype)}) {
          for (uint32_t lanes : {1u, 7u}) {
            INFO(reduce::cases::describe(args) << ", " << clients << " clients, skew " << skew << " bytes, "
                                               << lanes << " lanes");
            const Outcome outcome = check(args, clients, skew, lanes, rng);
            CHECK(outcome.gathered == "");
            CHECK(outcome.scattered == "");
          }
        }
      }
    }
  }
}

TEST_CASE("cuda functors: work items cover every element once, none longer than an item", "[cuda][functors]") {
  std::vector<Segment> segments(3);
  segments[0].count = 1;
  segments[1].count = kItemElements;
  segments[2].count = 2 * kItemElements + 1;
  const std::vector<WorkItem> items = cut_into_items(segments);
  REQUIRE(items.size() == 1 + 1 + 3);
  std::vector<uint64_t> covered(segments.size(), 0);
  for (const WorkItem& w : items) {
    CHECK(w.count >= 1);
    CHECK(w.count <= kItemElements);
    CHECK(w.first == covered[w.segment]);  // in order, no gap, no overlap
    covered[w.segment] += w.count;
  }
  for (size_t s = 0; s < segments.size(); ++s) CHECK(covered[s] == segments[s].count);
}

}  // namespace gradsync::cuda

namespace gradsync::reduce::cases {

// The comparison the GPU kernel test uses: two NaNs are equal whatever their bits (the GPU's
// default NaN is 0x7fffffff, x86's 0xffc00000), anything else must match byte for byte.
TEST_CASE("first_difference_any_nan: NaNs of any payload match, other bits do not", "[cuda][functors]") {
  const Bytes gpu_nan{std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0x7f}};
  const Bytes x86_nan{std::byte{0x00}, std::byte{0x00}, std::byte{0xc0}, std::byte{0xff}};
  const Bytes infinity{std::byte{0x00}, std::byte{0x00}, std::byte{0x80}, std::byte{0x7f}};
  CHECK(first_difference_any_nan(gpu_nan, x86_nan, DType::kFloat32) == "");
  CHECK(first_difference(gpu_nan, x86_nan, 4) != "");
  CHECK(first_difference_any_nan(infinity, x86_nan, DType::kFloat32) ==
        "element 0 differs: bytes 0/0 0/0 80/c0 7f/ff (got/want)");
  // The same bytes as two bfloat16: 0xffff and 0x7fff are NaNs, 0x0000 is not.
  CHECK(first_difference_any_nan(gpu_nan, Bytes{std::byte{0xc0}, std::byte{0xff}, std::byte{0xc0}, std::byte{0x7f}},
                                 DType::kBFloat16) == "");
  CHECK(first_difference_any_nan(x86_nan, gpu_nan, DType::kBFloat16) == "element 0 differs: bytes 0/ff 0/ff (got/want)");
  CHECK(first_difference_any_nan(x86_nan, x86_nan, DType::kInt32) == "");
  CHECK(first_difference_any_nan(gpu_nan, x86_nan, DType::kInt32) != "");
}

}  // namespace gradsync::reduce::cases
