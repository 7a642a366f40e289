// The daemon's own checks of an operation against its set (daemon/model/op_desc.h), which a
// client that skips the library's checks meets: what a wire dtype and the fused health cannot
// serve is refused, naming why.
#include <catch2/catch.hpp>
#include <memory>

#include "daemon/model/op_desc.h"

namespace gradsync {
namespace {

TensorSet set_of(std::vector<DType> dtypes, MemoryKind kind = MemoryKind::kHostMemfd, bool masked = false) {
  TensorSet set;
  set.id = 5;
  for (DType dtype : dtypes) set.layout.push_back(plan::TensorLayout{dtype, 64, "dp"});
  set.memory_kind = kind;
  if (masked) set.mask = std::make_shared<const std::vector<uint64_t>>(std::vector<uint64_t>{1, 3});
  return set;
}

OpDesc allreduce(DType wire = DType::kFloat32, bool health = false) {
  OpDesc desc;
  desc.kind = OpKind::kAllreduce;
  desc.wire = wire;
  desc.health = health;
  return desc;
}

}  // namespace

TEST_CASE("op desc: a wire dtype is taken by float32 and by half tensors of its own type only",
          "[unit][op_desc][wire]") {
  const Topology topology;
  CHECK(check_op(allreduce(DType::kBFloat16), set_of({DType::kFloat32, DType::kBFloat16}), topology).ok());
  CHECK(check_op(allreduce(DType::kFloat16), set_of({DType::kFloat16, DType::kFloat32}), topology).ok());
  const Status float64 = check_op(allreduce(DType::kBFloat16), set_of({DType::kFloat32, DType::kFloat64}), topology);
  CHECK(float64.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(float64.message(), Catch::Contains("applies to float32, float16 and bfloat16, and the set has float64"));
  const Status float16 = check_op(allreduce(DType::kBFloat16), set_of({DType::kFloat16}), topology);
  CHECK(float16.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(float16.message(), Catch::Contains("set 5: its float16 tensors cannot cross nodes as bfloat16"));
  const Status bfloat16 = check_op(allreduce(DType::kFloat16), set_of({DType::kFloat32, DType::kBFloat16}), topology);
  CHECK(bfloat16.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(bfloat16.message(), Catch::Contains("its bfloat16 tensors cannot cross nodes as float16"));
}

TEST_CASE("op desc: a wire dtype on half tensors needs float32 accumulation", "[unit][op_desc][wire]") {
  const Topology topology;
  OpDesc narrow = allreduce(DType::kFloat16);
  narrow.narrow_accumulate = true;
  // Without half tensors the flag changes nothing, and is taken as before.
  CHECK(check_op(narrow, set_of({DType::kFloat32}), topology).ok());
  const Status status = check_op(narrow, set_of({DType::kFloat32, DType::kFloat16}), topology);
  CHECK(status.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("its float16 tensors need fp32_accumulate = true"));
}

TEST_CASE("op desc: health on a masked set is taken in host and in device memory", "[unit][op_desc][health]") {
  const Topology topology;
  for (MemoryKind kind : {MemoryKind::kHostMemfd, MemoryKind::kCudaVmm}) {
    CHECK(check_op(allreduce(DType::kFloat32, true), set_of({DType::kFloat32}, kind, true), topology).ok());
    CHECK(check_op(allreduce(DType::kFloat32, true), set_of({DType::kFloat32}, kind), topology).ok());
  }
}

}  // namespace gradsync
