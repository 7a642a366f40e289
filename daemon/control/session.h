// One client connection: framing, descriptor passing and I/O for a ClientHandler. One coroutine
// reads frames (with the descriptors sent alongside them) and serves them, another writes
// queued replies (with theirs), both on the daemon's single io thread. Requests are served one
// at a time, in order: the reader awaits each request (ClientHandler::serve, and the parsing
// of a large frame on a setup thread) before it reads further. A malformed frame (oversized,
// truncated, unparsable, with descriptors nobody claims or without the ones it names) is
// answered with an error naming the problem, and the connection is closed; the daemon and
// every other connection carry on. The handler is released when both coroutines have ended,
// so no request in flight outlives it.
#pragma once

#include <deque>
#include <exception>
#include <functional>
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
  ControlContext context;
  Logger log;
  // A client that sends requests but never reads its replies is disconnected once this many
  // reply bytes are queued.
  size_t max_outbox_bytes = 64u << 20;
  // A connection is closed when a frame it began is not complete this long after its first
  // byte (half-open), or when it has not joined a job this long after its last request (idle):
  // neither may hold the daemon's memory and descriptors. A joined trainer is never timed out.
  std::chrono::milliseconds connection_timeout{60'000};
  UserCounts::Ticket connection;  // this connection, against its user's limit
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

  // Queues an error reply and closes the connection once it is written; `logged`: the caller
  // logged it already (the acceptor throttles refused connections' lines).
  void refuse(const Status& status, bool logged = false);

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
    size_t cost = 0;            // what it holds of the daemon's memory (outbox_cost)
  };
  // A queued reply's share of the outbox bound: its frame, the queue's own overhead for it, and
  // what its descriptors keep alive (a Join reply's rings: three memfds, about 330 KiB).
  static size_t outbox_cost(const std::string& frame, const std::vector<UniqueFd>& fds);
  // Whether the reader should wait for the client to take its replies before reading more.
  bool outbox_backed_up() const;
  // Returns once the outbox is no longer backed up, or the session closes.
  boost::asio::awaitable<void> until_outbox_drained();
  // Makes closing descriptors a client sent unable to block (a lingering socket's close).
  static void defuse(const std::vector<UniqueFd>& fds);

  boost::asio::awaitable<void> read_loop();
  boost::asio::awaitable<void> write_loop();
  // Closes a half-open or idle connection (SessionOptions::connection_timeout).
  boost::asio::awaitable<void> watch_loop();
  // Serves every complete frame buffered so far, one after the other; false once the
  // connection is closing.
  boost::asio::awaitable<bool> serve_frames();
  // Serves one parsed request that ends at stream offset frame_end; false once closing.
  boost::asio::awaitable<bool> dispatch(control::Request* request, uint64_t frame_end);
  // The reader or the writer ended; the last one releases the handler.
  void loop_ended();
  // The reader or the writer threw: closes the connection, and the loop has ended.
  void loop_failed(std::exception_ptr error);
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
  size_t outbox_bytes_ = 0;      // the sum of the queue's costs
  size_t outbox_fds_ = 0;        // descriptors in the queue
  bool overflowed_ = false;      // the client stopped reading; the write loop drops the outbox
  boost::asio::steady_timer outbox_ready_;
  // The reader waits on it while the outbox is backed up; the writer wakes it as it drains.
  boost::asio::steady_timer outbox_drained_;
  // After close(): how long the last replies may take to be written before the socket's
  // operations are cancelled (a client that never reads would otherwise hold the session).
  boost::asio::steady_timer linger_timer_;
  // write_one() waits on it for the client to read what came before a reply with descriptors.
  boost::asio::steady_timer send_wait_timer_;
  boost::asio::steady_timer watch_timer_;
  // When the last complete request arrived, and when the frame now in the decoder began
  // (nullopt: none begun).
  std::chrono::steady_clock::time_point last_request_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> frame_started_;
  // Since when the client's job has failed while it stays in it (nullopt: not in a failed job).
  std::optional<std::chrono::steady_clock::time_point> failed_since_;
  bool closing_ = false;  // no more reads; close once the outbox is flushed
  // The reader is serving requests: the daemon's time, which the idle and half-open bounds do
  // not count.
  bool serving_ = false;
  int loops_ = 2;  // the reader and the writer, until each ends
  // Resumes the reader waiting for a setup thread to parse a large frame, as aborted.
  std::function<void()> abandon_;
};

}  // namespace gradsync
