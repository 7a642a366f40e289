// The control protocol spoken by hand, for tests that play a hostile or broken client: the
// bytes and descriptors go out exactly as the test says, and the test keeps every descriptor
// the daemon hands over (a well-behaved client closes them once mapped).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "client/src/completions.h"
#include "client/src/connection.h"
#include "proto/control.pb.h"
#include "shared/memfd.h"
#include "shared/unique_fd.h"

namespace gradsync::test {

// What a raw join got: the reply, the three descriptors (JoinFd order) and their mappings, the
// daemon's rings read-only as a client must map them.
struct RawJoin {
  control::Reply reply;
  std::vector<UniqueFd> fds;
  JobChannel channel;
};

// Hello, then join as `rank` of a single-node job of `world` ranks.
RawJoin raw_join(Connection& raw, const std::string& job, int world, int rank = 0);

// A sealed memfd of `bytes` handed to the daemon as a segment; the test keeps the descriptor.
struct RawSegment {
  uint32_t id = 0;
  MappedMemfd memory;
};
RawSegment raw_segment(Connection& raw, size_t bytes);

// Waits (at most 5 s) until the daemon publishes the job's failure in `rings`; returns its code
// and message (code 0 if it never came).
std::pair<uint32_t, std::string> wait_for_failure(const DaemonRings* rings);

// A connected socket without the client library's checks, sending bytes and descriptors as
// given, for frames no library would send.
class RawSocket {
 public:
  explicit RawSocket(const std::string& path);
  ~RawSocket();
  void send(const std::string& bytes, const std::vector<int>& fds = {});
  void finish_writing();
  // Everything the daemon sends until it closes the connection (bounded by 10 s).
  std::string read_to_end();
  // The next reply; descriptors sent with it are closed. Fails the test after `timeout`.
  control::Reply read_reply(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Whether a reply (or the end of the stream) is waiting unread. Never blocks.
  bool readable() const;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::string unread_;  // bytes read past the last reply
};

// The error message of the first reply in `bytes`.
std::string first_error(const std::string& bytes);

// A request as one frame.
std::string frame_of(const control::Request& request);

}  // namespace gradsync::test
