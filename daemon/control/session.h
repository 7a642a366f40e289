// One client connection: framing, descriptor passing and I/O for a ClientHandler. One coroutine
// reads frames (with the descriptors sent alongside them), another writes queued replies (with
// theirs), both on the daemon's single io thread. Requests are served one at a time, in order:
// while the handler is busy off the io thread, or a large frame is being parsed there, the
// session reads no further. A malformed frame (oversized, truncated,
// unparsable, with descriptors nobody claims or without the ones it names) is answered with an
// error naming the problem, and the connection is closed; the daemon and every other
// connection carry on.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/control/asio.h"
#include "daemon/control/client_handler.h"
#include "daemon/control/fd_inbox.h"
#include "shared/framing.h"

namespace gradsync {

struct SessionOptions {
  JobRegistry* registry = nullptr;
  BackendFactory* backends = nullptr;
  Logger log;
  // A client that sends requests but never reads its replies is disconnected once this many
  // reply bytes are queued.
  size_t max_outbox_bytes = 64u << 20;
  // A connection is closed when a frame it began is not complete this long after its first
  // byte (half-open), or when it has not joined a job this long after its last request (idle):
  // neither may hold the daemon's memory and descriptors. A joined trainer is never timed out.
  std::chrono::milliseconds connection_timeout{60'000};
  SetupThreads* setup = nullptr;      // null: setup work runs inline (tests)
  std::shared_ptr<UserCounts> users;  // null: a private one with the default limits (tests)
  UserCounts::Ticket connection;      // this connection, against its user's limit
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;

  Session(Socket socket, PeerCredentials peer, SessionOptions options);
  ~Session();

  // Starts the reader and writer; they keep the session alive until the connection ends.
  void start();

  // Queues a frame and the descriptors that go with it; dropped once the connection is closing.
  void send(const control::Reply& reply, std::vector<UniqueFd> fds = {});

  // Queues an error reply and closes the connection once it is written.
  void refuse(const Status& status);

  // Daemon shutdown: tells the client `why` (id 0: whatever call it is in), leaves the
  // job (telling the other clients `why`) and ends both coroutines.
  void stop(const Status& why);

  // For the admin service; nullopt once the session is closing. On the io thread.
  std::optional<ClientInfo> info() const {
    if (closing_ || !handler_) return std::nullopt;
    return handler_->info();
  }

 private:
  struct Outgoing {
    std::string frame;
    std::vector<UniqueFd> fds;  // sent with the frame's first bytes, closed here once sent
  };

  boost::asio::awaitable<void> read_loop();
  boost::asio::awaitable<void> write_loop();
  // Closes a half-open or idle connection (SessionOptions::connection_timeout).
  boost::asio::awaitable<void> watch_loop();
  // Serves every complete frame buffered so far, or up to one that must wait (waiting());
  // false once the connection is closing.
  bool serve_frames();
  // Serves one parsed request that ends at stream offset frame_end; false once closing.
  bool dispatch(control::Request request, uint64_t frame_end);
  // The handler finished a request off the io thread, or a large frame was parsed: go on.
  void resume();
  bool waiting() const { return parsing_ || (handler_ && handler_->busy()); }
  // Sends one queued frame; false when the connection failed.
  boost::asio::awaitable<bool> write_one(Outgoing& out);
  // Ends the connection; `why` is ok for a plain disconnect, else what went wrong.
  void close(const Status& why);

  Socket socket_;
  PeerCredentials peer_;
  SessionOptions options_;
  Logger log_;
  std::optional<ClientHandler> handler_;
  FrameDecoder decoder_;
  FdInbox inbox_;
  uint64_t received_bytes_ = 0;  // stream offset of the next byte read
  uint64_t frame_begin_ = 0;     // stream offset of the next frame
  // Never cleared while a write may refer to its front: only the write loop pops or clears it.
  std::deque<Outgoing> outbox_;
  size_t outbox_bytes_ = 0;
  bool overflowed_ = false;      // the client stopped reading; the write loop drops the outbox
  boost::asio::steady_timer outbox_ready_;
  boost::asio::steady_timer watch_timer_;
  // When the last complete request arrived, and when the frame now in the decoder began
  // (nullopt: none begun).
  std::chrono::steady_clock::time_point last_request_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> frame_started_;
  // Since when the client's job has failed while it stays in it (nullopt: not in a failed job).
  std::optional<std::chrono::steady_clock::time_point> failed_since_;
  bool closing_ = false;         // no more reads; close once the outbox is flushed
  bool parsing_ = false;         // a large frame is being parsed off the io thread
  boost::asio::steady_timer resumed_;  // the reader sleeps on it while waiting()
};

}  // namespace gradsync
