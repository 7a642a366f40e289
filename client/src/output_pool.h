// The allgather and shard outputs of released sets, kept for the outputs of later sets: a
// program that keeps registering and releasing sets of new sizes (torch's backend staging ever
// new tensors) reuses them where they fit, and the client frees the oldest beyond a few
// (ClientImpl::trim_outputs), so ever-growing sizes do not hold the sum of every size made. One pool for
// host segments (device -1) and one for device allocations, which the same code serves: the
// device one is otherwise reachable only on a GPU.
#pragma once

#include <cstddef>
#include <vector>

namespace gradsync {

template <class SegmentT>
class OutputPool {
 public:
  // A released set's output: `bytes` usable on `device` (-1: host memory).
  void give(SegmentT* segment, int device, size_t bytes) {
    if (segment) kept_.push_back(Kept{segment, device, bytes});
  }

  // The smallest kept output on `device` that holds `bytes`, out of the pool; nullptr when
  // none does (the caller makes a new one).
  SegmentT* take(int device, size_t bytes) {
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->device == device && it->bytes >= bytes && (best == kept_.end() || it->bytes < best->bytes)) best = it;
    }
    if (best == kept_.end()) return nullptr;
    SegmentT* taken = best->segment;
    kept_.erase(best);
    return taken;
  }

  // The kept output given longest ago, out of the pool, while it holds more than `most`;
  // nullptr otherwise. keep_oldest() puts it back where it was.
  SegmentT* take_oldest_beyond(size_t most, int* device, size_t* bytes) {
    if (kept_.size() <= most) return nullptr;
    const Kept oldest = kept_.front();
    kept_.erase(kept_.begin());
    *device = oldest.device;
    *bytes = oldest.bytes;
    return oldest.segment;
  }
  void keep_oldest(SegmentT* segment, int device, size_t bytes) {
    kept_.insert(kept_.begin(), Kept{segment, device, bytes});
  }

  size_t size() const { return kept_.size(); }

 private:
  struct Kept {
    SegmentT* segment;
    int device;
    size_t bytes;
  };
  std::vector<Kept> kept_;
};

}  // namespace gradsync
