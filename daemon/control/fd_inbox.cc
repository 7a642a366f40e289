#include "daemon/control/fd_inbox.h"

namespace gradsync {

void FdInbox::add(uint64_t end_offset, std::vector<UniqueFd> fds) {
  if (!fds.empty()) batches_.push_back(Batch{end_offset, std::move(fds)});
}

size_t FdInbox::size() const {
  size_t count = 0;
  for (const auto& batch : batches_) count += batch.fds.size();
  return count;
}

Status FdInbox::take(uint64_t begin, uint64_t end, uint32_t declared, const std::string& request,
                     std::vector<UniqueFd>* out) {
  out->clear();
  size_t stray = 0;
  while (!batches_.empty() && batches_.front().end_offset <= end) {
    Batch batch = std::move(batches_.front());
    batches_.pop_front();
    if (batch.end_offset <= begin) {
      stray += batch.fds.size();  // arrived with an earlier frame that did not claim it
      continue;
    }
    for (auto& fd : batch.fds) out->push_back(std::move(fd));
  }
  if (stray > 0) {
    out->clear();
    return Status::protocol(std::to_string(stray) + " file descriptor(s) arrived with no request claiming them");
  }
  if (out->size() != declared) {
    const size_t got = out->size();
    out->clear();
    if (got > declared) {
      return Status::protocol("the " + request + " request declares " + std::to_string(declared) +
                              " file descriptor(s), but " + std::to_string(got) +
                              " were sent with it; descriptors with no request claiming them are refused");
    }
    return Status::protocol("the " + request + " request names " + std::to_string(declared) +
                            " file descriptor(s), but " + std::to_string(got) + " were sent with it");
  }
  return Status::ok_status();
}

}  // namespace gradsync
