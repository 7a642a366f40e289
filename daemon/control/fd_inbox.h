// The descriptors a connection has received and no request has claimed yet, with the stream
// offset at which each batch arrived. The kernel ends a recvmsg() right after the segment that
// carried descriptors, and descriptors travel with the first byte of the sendmsg() they were
// attached to; a frame that carries descriptors is sent with one sendmsg() (fd_passing.h). So a
// batch that arrived at stream offset E belongs to the frame [begin, end) with begin < E <= end.
// Anything else is a client bug or an attack, and take() says which.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "shared/status.h"
#include "shared/unique_fd.h"

namespace gradsync {

class FdInbox {
 public:
  // A batch arrived with the bytes ending at stream offset `end_offset`.
  void add(uint64_t end_offset, std::vector<UniqueFd> fds);

  // The descriptors of the frame occupying stream bytes [begin, end), which declares
  // `declared` of them; `request` names it in errors. A kProtocol error when the count differs
  // (descriptors with no request claiming them, or a request naming descriptors never sent).
  Status take(uint64_t begin, uint64_t end, uint32_t declared, const std::string& request,
              std::vector<UniqueFd>* out);

  // Descriptors held, for the per-connection bound.
  size_t size() const;

 private:
  struct Batch {
    uint64_t end_offset = 0;
    std::vector<UniqueFd> fds;
  };
  std::deque<Batch> batches_;
};

}  // namespace gradsync
