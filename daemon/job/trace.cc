#include "daemon/job/trace.h"

namespace gradsync {

void TraceLog::add(OpTrace op) {
  MutexLock lock(mutex_);
  ops_.push_back(std::move(op));
  if (ops_.size() > kCapacity) ops_.pop_front();
}

std::vector<OpTrace> TraceLog::last(size_t count) const {
  MutexLock lock(mutex_);
  const size_t n = count == 0 ? ops_.size() : std::min(count, ops_.size());
  return std::vector<OpTrace>(ops_.end() - static_cast<std::ptrdiff_t>(n), ops_.end());
}

}  // namespace gradsync
