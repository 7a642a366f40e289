// Masked reduction on device sets (TensorSet::kept): the CUDA executor's kernels gather only the
// kept elements into a compact bucket buffer, NCCL (here its host fake) reduces that many, and
// the scatter writes them back after zeroing the destinations' tensors: the seeds'
// temp_zero[mask] = reduced. Checked element by element against the host reduction, on one GPU
// and across two, for allreduce and a reduce to rank 1 (whose other ranks keep their values).
#include <memory>

#include "cuda_fixture.h"
#include "daemon/backend/cuda/kept_segments.h"

namespace gradsync::cuda {

using namespace testing;  // the fixture, the fake device and engines (cuda_fixture.h)

namespace {

// Every third element of the set, and one run of 1000 (which crosses into tensor 3's blocks).
std::shared_ptr<std::vector<uint64_t>> mask_of(const TensorSet& set) {
  auto mask = std::make_shared<std::vector<uint64_t>>();
  uint64_t total = 0;
  for (const auto& t : set.layout) total += t.numel;
  for (uint64_t i = 0; i < total; ++i) {
    if (i % 3 == 0 || (i >= 5000 && i < 6000)) mask->push_back(i);
  }
  return mask;
}

}  // namespace

TEST_CASE("cuda executor: a masked allreduce or reduce moves only the kept elements, and zeroes the rest",
          "[cuda][executor][masked]") {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt32}) {
    for (bool across : {false, true}) {
      for (OpKind kind : {OpKind::kAllreduce, OpKind::kReduce}) {
        INFO(dtype_name(dtype) << (across ? ", clients on two GPUs" : ", one GPU")
                               << (kind == OpKind::kReduce ? ", reduce to rank 1" : ", allreduce"));
        Fixture f(dtype, across ? std::vector<int>{0, 0, 1} : std::vector<int>{0, 0, 0});
        auto masked = std::make_shared<TensorSet>(*f.set);
        masked->mask = mask_of(*masked);
        complete_tensor_set(masked.get(), f.topology);
        f.set = masked;
        const reduce::KernelArgs args{.dtype = dtype};
        const int root = 1;
        HostDeviceEngines engines;
        {
          CudaExecutor executor(options_for(f, across ? &engines : nullptr));
          if (across) {
            LocalRendezvous local;
            REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
            REQUIRE(run_across(f, executor, engines, kind, args, root).ok());
            // NCCL got each bucket's kept count, not its size.
            REQUIRE(engines.made.front()->counts.size() == f.set->plan.buckets.size());
            for (size_t b = 0; b < f.set->plan.buckets.size(); ++b) {
              CHECK(engines.made.front()->counts[b] == f.set->kept[b].size());
              CHECK(f.set->kept[b].size() < f.set->bucket_elements[b]);
            }
          } else {
            REQUIRE(f.run(executor, kind, args, root).ok());
          }
        }
        const std::vector<uint64_t>& mask = *f.set->mask;
        const size_t element = dtype_size(dtype);
        for (size_t t = 0; t < f.set->layout.size(); ++t) {
          const Bytes reduced = f.reduced(args, t);
          const Bytes zero(element);
          for (int c = 0; c < kClients; ++c) {
            const Bytes got = f.tensor(c, t);
            const Bytes original = f.original_tensor(c, t);
            const bool destination = kind == OpKind::kAllreduce || c == root;
            size_t wrong = 0, first_wrong = 0;
            for (uint64_t e = 0; e < f.set->layout[t].numel; ++e) {
              const bool kept = std::binary_search(mask.begin(), mask.end(), f.set->flat_offset[t] + e);
              const std::byte* want = !destination ? original.data() + e * element
                                      : kept       ? reduced.data() + e * element
                                                   : zero.data();
              if (std::memcmp(got.data() + e * element, want, element) != 0 && wrong++ == 0) first_wrong = e;
            }
            INFO("client " << c << " tensor " << t << ": " << wrong << " wrong elements, the first " << first_wrong);
            CHECK(wrong == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda kept segments: one per run of kept positions within a tensor, at its kept index",
          "[cuda][masked]") {
  Fixture f(DType::kFloat32);
  auto masked = std::make_shared<TensorSet>(*f.set);
  // Tensors 37, 4096, 1, 9000, 515 elements; keep 0-2 and 10 of tensor 0, all of tensor 2, and
  // tensor 3's first two.
  masked->mask = std::make_shared<std::vector<uint64_t>>(std::vector<uint64_t>{0, 1, 2, 10, 4133, 4134, 4135});
  complete_tensor_set(masked.get(), f.topology);
  uint64_t runs = 0, kept = 0;
  for (size_t b = 0; b < masked->plan.buckets.size(); ++b) {
    const std::vector<Segment> segments = kept_segments(*masked, b, {0, 2});
    uint64_t next = 0;
    for (const Segment& s : segments) {
      CHECK(s.bucket_offset == next);  // compact, in kept order
      next += s.count;
      CHECK(s.address[1] != nullptr);
    }
    CHECK(next == masked->kept[b].size());
    runs += segments.size();
    kept += next;
  }
  CHECK(kept == 7);
  CHECK(runs == 4);  // 0-2, 10, tensor 2's one element, tensor 3's two
}

}  // namespace gradsync::cuda
