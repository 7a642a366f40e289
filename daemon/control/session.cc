#include "daemon/control/session.h"

#include "shared/framing.h"

namespace gradsync {

namespace asio = boost::asio;

Session::Session(Socket socket, PeerCredentials peer, SessionOptions options)
    : socket_(std::move(socket)),
      peer_(peer),
      options_(std::move(options)),
      log_(options_.log.with("pid=" + std::to_string(peer.pid))),
      outbox_ready_(socket_.get_executor(), asio::steady_timer::time_point::max()) {}

Session::~Session() = default;

void Session::start() {
  std::weak_ptr<Session> weak = weak_from_this();
  ClientHandlerOptions handler;
  handler.registry = options_.registry;
  handler.peer = peer_;
  handler.log = log_;
  handler.send = [weak](const control::Reply& reply) {
    if (auto self = weak.lock()) self->send(reply);
  };
  handler_.emplace(std::move(handler));
  auto self = shared_from_this();
  asio::co_spawn(socket_.get_executor(), [self]() { return self->read_loop(); }, asio::detached);
  asio::co_spawn(socket_.get_executor(), [self]() { return self->write_loop(); }, asio::detached);
}

void Session::send(const control::Reply& reply) {
  if (closing_ && !socket_.is_open()) return;
  std::string frame = encode_frame(reply.SerializeAsString());
  // A client that sends requests but never reads replies must not grow the daemon's memory.
  if (outbox_bytes_ + frame.size() > kMaxOutboxBytes) {
    outbox_.clear();
    outbox_bytes_ = 0;
    log_.warning("closing connection: the client does not read its replies");
    close(Status::resource_exhausted("the client does not read its replies"));
    boost::system::error_code ignored;
    socket_.cancel(ignored);
    return;
  }
  outbox_bytes_ += frame.size();
  outbox_.push_back(std::move(frame));
  outbox_ready_.cancel();
}

void Session::refuse(const Status& status) {
  log_.warning("closing connection: " + status.to_string());
  control::Reply reply;
  set_error(status, &reply);
  send(reply);
  close(status);
}

void Session::stop() {
  close(Status::aborted("gradsyncd is shutting down"));
  boost::system::error_code ignored;
  socket_.cancel(ignored);
}

void Session::close(const Status& why) {
  if (closing_) return;
  closing_ = true;
  // Leave the job now, not when the last coroutine lets go of the session: the other clients
  // must learn about it within their timeout.
  if (handler_) handler_->disconnected(why.ok() ? "disconnected" : "was disconnected: " + why.message());
  boost::system::error_code ignored;
  socket_.shutdown(Socket::shutdown_receive, ignored);
  outbox_ready_.cancel();
}

asio::awaitable<void> Session::read_loop() {
  auto self = shared_from_this();
  std::array<std::byte, kFrameHeaderBytes> header{};
  std::string payload;
  while (!closing_) {
    boost::system::error_code ec;
    size_t got = co_await asio::async_read(socket_, asio::buffer(header),
                                           asio::redirect_error(asio::use_awaitable, ec));
    // The writer may have closed the session (and released the handler) while this read was
    // completing; nothing read after that point is served.
    if (closing_ || !handler_) break;
    if (ec) {
      if (got == 0) {
        close(Status());
      } else {
        refuse(Status::protocol("truncated frame header: got " + std::to_string(got) + " of " +
                                std::to_string(kFrameHeaderBytes) + " bytes before end of stream"));
      }
      break;
    }
    uint32_t length = 0;
    if (Status status = decode_frame_header(header, kMaxFrameBytes, &length); !status.ok()) {
      refuse(status);
      break;
    }
    payload.resize(length);
    got = co_await asio::async_read(socket_, asio::buffer(payload), asio::redirect_error(asio::use_awaitable, ec));
    if (closing_ || !handler_) break;
    if (ec) {
      refuse(Status::protocol("truncated frame: expected " + std::to_string(length) + " payload bytes, got " +
                              std::to_string(got) + " before end of stream"));
      break;
    }
    control::Request request;
    if (!request.ParseFromString(payload)) {
      refuse(Status::protocol("malformed request: " + std::to_string(length) +
                              " bytes do not parse as gradsync.control.Request"));
      break;
    }
    // A request that throws (out of memory, no room in /dev/shm) ends this connection with the
    // error, never the daemon, and never leaves the session half alive.
    try {
      handler_->handle(request);
    } catch (const Error& e) {
      refuse(e.status());
    } catch (const std::exception& e) {
      refuse(Status::internal(std::string("request failed: ") + e.what()));
    }
  }
}

asio::awaitable<void> Session::write_loop() {
  auto self = shared_from_this();
  for (;;) {
    while (!outbox_.empty()) {
      boost::system::error_code ec;
      co_await asio::async_write(socket_, asio::buffer(outbox_.front()), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        outbox_.clear();
        close(Status::peer_lost("writing to it failed: " + ec.message()));
        break;
      }
      outbox_bytes_ -= outbox_.front().size();
      outbox_.pop_front();
    }
    if (closing_) break;
    boost::system::error_code ec;
    outbox_ready_.expires_at(asio::steady_timer::time_point::max());
    co_await outbox_ready_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  // Everything queued before closing has been written; now release the handler (its segments,
  // its place in the job) and the socket.
  handler_.reset();
  boost::system::error_code ignored;
  socket_.close(ignored);
}

}  // namespace gradsync
