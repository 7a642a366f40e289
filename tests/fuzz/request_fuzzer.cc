// Request decoding and validation: any bytes as a control request, then what the daemon checks
// first (daemon/job/join_validation.h, daemon/control/registration_check.h) and how it echoes
// an error (daemon/util/safe_text.h). Nothing crashes; what is accepted is consistent: a
// registered tensor lies inside its segment and overlaps no other; an error reply is bounded,
// one line, valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "daemon/control/registration_check.h"
#include "daemon/job/join_validation.h"
#include "daemon/util/safe_text.h"
#include "proto/control.pb.h"
#include <google/protobuf/stubs/logging.h>
#include "shared/dtype.h"

namespace gradsync {
namespace {

class FakeRegion final : public MemoryRegion {
 public:
  FakeRegion(std::byte* base, size_t size) : base_(base), size_(size) {}
  MemoryKind kind() const override { return MemoryKind::kHostMemfd; }
  size_t size() const override { return size_; }
  std::byte* base() const override { return base_; }

 private:
  std::byte* base_;
  size_t size_;
};

struct Fixture {
  Fixture() {
    segments[1] = std::make_shared<FakeRegion>(memory.get(), 4096);
    segments[2] = std::make_shared<FakeRegion>(memory.get() + 4096, 1 << 20);
    std::map<std::string, std::vector<int>> groups{{"tp", {0, 1}}};
    if (!make_topology(4, 2, 0, 0, groups, &topology).ok()) std::abort();
  }
  std::unique_ptr<std::byte[]> memory = std::make_unique<std::byte[]>(4096 + (1 << 20));
  SegmentMap segments;
  Topology topology;
};

void check_echo(const Status& status) {
  const std::string text = safe_text(status.message(), 2048);
  if (text.size() > 2048 + 64) std::abort();
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) std::abort();  // one line, no escapes
  }
}

}  // namespace
}  // namespace gradsync

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in strings is expected here, not news
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  static Fixture fixture;
  control::Request request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (request.has_join()) {
    JobParams params;
    const Status status =
        validate_join(request.join(), std::chrono::seconds(30), std::chrono::seconds(600), &params);
    check_echo(status);
    if (status.ok()) {
      const Topology& t = params.topology;
      if (t.nodes < 1 || t.node < 0 || t.node >= t.nodes || params.world_size != t.nodes * params.local_world_size) {
        std::abort();
      }
    }
  }
  if (request.has_register_()) {
    ResolvedSet set;
    const Status status = check_registration(request.register_(), fixture.topology, 4, fixture.segments, &set);
    check_echo(status);
    if (status.ok()) {
      for (size_t i = 0; i < set.layout.size(); ++i) {
        const size_t bytes = set.layout[i].numel * dtype_size(set.layout[i].dtype);
        bool inside = false;
        for (const auto& [id, region] : fixture.segments) {
          inside |= set.address[i] >= region->base() && set.address[i] + bytes <= region->base() + region->size();
        }
        if (!inside) std::abort();
      }
      // No two accepted tensors share a byte (pairwise, for sets small enough).
      if (set.layout.size() <= 64) {
        for (size_t i = 0; i < set.layout.size(); ++i) {
          for (size_t j = i + 1; j < set.layout.size(); ++j) {
            const size_t bi = set.layout[i].numel * dtype_size(set.layout[i].dtype);
            const size_t bj = set.layout[j].numel * dtype_size(set.layout[j].dtype);
            if (bi > 0 && bj > 0 && set.address[i] < set.address[j] + bj && set.address[j] < set.address[i] + bi) {
              std::abort();
            }
          }
        }
      }
    }
  }
  return 0;
}
