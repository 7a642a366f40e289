// The client's end of the control socket: blocking request/reply with frames. Used only for
// setup (hello, join, segments, registration), never on the per-step path.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "proto/control.pb.h"
#include "shared/framing.h"
#include "shared/status.h"

namespace gradsync {

class Connection {
 public:
  // Connects to the daemon's socket; throws Error naming the path and the cause.
  explicit Connection(const std::string& socket_path);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends the request (its id is filled in) and waits at most `timeout` for its reply. Throws
  // Error for transport failures and for an error reply.
  control::Reply call(control::Request request, std::chrono::milliseconds timeout);

  // True when the daemon has closed the connection (it died or dropped us). Never blocks.
  bool peer_closed() const;

  const std::string& path() const { return path_; }

 private:
  void write_all(const std::string& bytes);

  std::string path_;
  int fd_ = -1;
  uint64_t next_id_ = 1;
  FrameDecoder decoder_;
};

}  // namespace gradsync
