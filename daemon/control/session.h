// One client connection: framing and I/O for a ClientHandler. One coroutine reads frames,
// another writes queued replies, both on the daemon's single io thread. A malformed frame
// (oversized, truncated, unparsable) is answered with an error naming the problem, and the
// connection is closed; the daemon and every other connection carry on.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "daemon/control/asio.h"
#include "daemon/control/client_handler.h"

namespace gradsync {

struct SessionOptions {
  JobRegistry* registry = nullptr;
  Logger log;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;

  Session(Socket socket, PeerCredentials peer, SessionOptions options);
  ~Session();

  // Starts the reader and writer; they keep the session alive until the connection ends.
  void start();

  // Queues a frame; dropped once the connection is closing.
  void send(const control::Reply& reply);

  // Queues an error reply and closes the connection once it is written.
  void refuse(const Status& status);

  // Daemon shutdown: leaves the job and ends both coroutines promptly.
  void stop();

 private:
  boost::asio::awaitable<void> read_loop();
  boost::asio::awaitable<void> write_loop();
  // Ends the connection; `why` is ok for a plain disconnect, else what went wrong.
  void close(const Status& why);

  Socket socket_;
  PeerCredentials peer_;
  SessionOptions options_;
  Logger log_;
  std::optional<ClientHandler> handler_;
  static constexpr size_t kMaxOutboxBytes = 64u << 20;
  std::deque<std::string> outbox_;
  size_t outbox_bytes_ = 0;
  boost::asio::steady_timer outbox_ready_;
  bool closing_ = false;       // no more reads; close once the outbox is flushed
};

}  // namespace gradsync
