// The client's end of the control socket: blocking request/reply with frames, and descriptors
// passed alongside them (SCM_RIGHTS). Used only for setup (hello, join, segments,
// registration), never on the per-step path.
#pragma once

#include <chrono>
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "client/src/abort_reason.h"
#include "proto/control.pb.h"
#include "shared/framing.h"
#include "shared/status.h"
#include "shared/unique_fd.h"

namespace gradsync {

// The daemon's error reply to a call: it answered, refusing the request, which took no effect
// (unlike a transport failure or a call that timed out, after which the daemon may still carry
// it out). An Error like any other to whoever catches Error.
class Refused : public Error {
 public:
  using Error::Error;
};

class Connection {
 public:
  // Connects to the daemon's socket and checks who serves it (SO_PEERCRED): root, this
  // process's own user, or `daemon_uid`. Anybody else may be squatting the path to pose as the
  // daemon and receive the trainer's memory, so the connection is refused. Throws Error naming
  // the path and the cause.
  Connection(const std::string& socket_path, std::optional<uid_t> daemon_uid);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends the request (its id and fd_count are filled in) with `fds`, and waits at most
  // `timeout` for its reply. The descriptors sent with the reply go to *reply_fds (closed when
  // it is null). Throws Refused for an error reply, Error for transport failures and timeouts.
  control::Reply call(control::Request request, std::chrono::milliseconds timeout, std::span<const int> fds = {},
                      std::vector<UniqueFd>* reply_fds = nullptr);

  // True when the daemon has closed the connection (it died or dropped us). Never blocks.
  bool peer_closed() const;

  // The notice a stopping daemon sends before it closes (an error reply with id 0, such as
  // "gradsyncd is shutting down"), if one is waiting unread on the socket. Only peeks, so it
  // never disturbs a call in progress on another thread. Never blocks.
  std::optional<Status> parting_notice() const;

  const std::string& path() const { return path_; }

  // Ends the connection from this side at once (shutdown(2); the descriptor stays open until
  // the Connection goes): the daemon sees this client leave, as if it had exited. Safe from any
  // thread, also while another thread is in call(); only the first call's reason counts, and
  // every call after any of them throws it.
  void shut_down(const Status& why);
  // Why shut_down() was called; nullopt before. Never blocks; safe from any thread.
  std::optional<Status> shut_down_reason() const { return shut_why_->get(); }
  // The same, for holders that may outlive the connection (the client's completions).
  std::shared_ptr<const AbortReason> shut_down_state() const { return shut_why_; }

 private:
  control::Reply call_once(control::Request request, std::chrono::milliseconds timeout, std::span<const int> fds,
                           std::vector<UniqueFd>* reply_fds);
  // A read error as the user needs it: bytes of HTTP/2 mean the path is an admin socket.
  Status explain_foreign(const Status& read) const;
  void write_all(const std::string& bytes, std::span<const int> fds);
  // Why the daemon dropped us, after a write to it failed: its parting notice, if it sent one.
  std::optional<Status> notice_after_failed_write();

  std::string path_;
  int fd_ = -1;
  uint64_t next_id_ = 1;
  FrameDecoder decoder_;
  std::deque<UniqueFd> received_fds_;  // arrived, not yet claimed by a decoded reply
  std::shared_ptr<AbortReason> shut_why_ = std::make_shared<AbortReason>();  // shut_down()'s
};

}  // namespace gradsync
