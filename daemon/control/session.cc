#include "daemon/control/session.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "shared/fd_passing.h"
#include "shared/framing.h"

namespace gradsync {

namespace asio = boost::asio;

namespace {

// Descriptors a connection may hold unclaimed (a frame still arriving); more is an attack.
constexpr size_t kMaxHeldFds = 4 * kMaxFdsPerMessage;
// Frames up to this size are parsed on the io thread; larger ones (a registration of many
// tensors) on a setup thread, so that no client's request stalls the others.
constexpr size_t kInlineParseBytes = 64u << 10;
// After a request this large its memory goes back to the system.
constexpr size_t kTrimAfterBytes = 1u << 20;

const char* request_name(const control::Request& request) {
  switch (request.body_case()) {
    case control::Request::kHello: return "Hello";
    case control::Request::kJoin: return "Join";
    case control::Request::kSegment: return "Segment";
    case control::Request::kRegister: return "Register";
    case control::Request::BODY_NOT_SET: break;
  }
  return "empty";
}

}  // namespace

Session::Session(Socket socket, PeerCredentials peer, SessionOptions options)
    : socket_(std::move(socket)),
      peer_(peer),
      options_(std::move(options)),
      log_(options_.log.with("pid=" + std::to_string(peer.pid))),
      outbox_ready_(socket_.get_executor(), asio::steady_timer::time_point::max()),
      watch_timer_(socket_.get_executor()),
      resumed_(socket_.get_executor(), asio::steady_timer::time_point::max()) {
  if (!options_.users) options_.users = std::make_shared<UserCounts>(LocalLimits{});
}

Session::~Session() = default;

void Session::start() {
  std::weak_ptr<Session> weak = weak_from_this();
  ClientHandlerOptions handler;
  handler.registry = options_.registry;
  handler.backends = options_.backends;
  handler.peer = peer_;
  handler.log = log_;
  handler.send = [weak](const control::Reply& reply, std::vector<UniqueFd> fds) {
    if (auto self = weak.lock()) self->send(reply, std::move(fds));
  };
  // Posted, so that a handler finishing inline does not re-enter serve_frames().
  handler.resume = [weak, executor = socket_.get_executor()] {
    asio::post(executor, [weak] {
      if (auto self = weak.lock()) self->resume();
    });
  };
  handler.refuse = [weak](const Status& status) {
    if (auto self = weak.lock()) self->refuse(status);
  };
  handler.setup = options_.setup;
  handler.users = options_.users;
  handler_.emplace(std::move(handler));
  auto self = shared_from_this();
  asio::co_spawn(socket_.get_executor(), [self]() { return self->read_loop(); }, asio::detached);
  asio::co_spawn(socket_.get_executor(), [self]() { return self->watch_loop(); }, asio::detached);
  asio::co_spawn(socket_.get_executor(), [self]() { return self->write_loop(); }, asio::detached);
}

void Session::send(const control::Reply& reply, std::vector<UniqueFd> fds) {
  if ((closing_ && !socket_.is_open()) || overflowed_) return;
  control::Reply copy = reply;
  copy.set_fd_count(static_cast<uint32_t>(fds.size()));
  std::string frame = encode_frame(copy.SerializeAsString());
  // A client that sends requests but never reads replies must not grow the daemon's memory.
  // The queue is not touched here: a write may be in flight from its front, so the write loop
  // drops it once that write has been cancelled.
  if (outbox_bytes_ + frame.size() > options_.max_outbox_bytes) {
    overflowed_ = true;
    log_.warning("closing connection: the client does not read its replies");
    close(Status::resource_exhausted("the client does not read its replies"));
    boost::system::error_code ignored;
    socket_.cancel(ignored);
    outbox_ready_.cancel();
    return;
  }
  outbox_bytes_ += frame.size();
  outbox_.push_back(Outgoing{std::move(frame), std::move(fds)});
  outbox_ready_.cancel();
}

void Session::refuse(const Status& status) {
  log_.warning("closing connection: " + status.to_string());
  control::Reply reply;
  set_error(status, &reply);
  send(reply);
  close(status);
}

void Session::stop(const Status& why) {
  // A request still waiting for its answer (a registration the job has not admitted yet) gets
  // the reason instead of a closed connection: a reply with id 0 answers whatever call the
  // client is in. Best effort: a client not in a call just sees the connection close, and the
  // notice is lost if a write to a client that does not read is still pending.
  if (!closing_ && !why.ok()) {
    control::Reply reply;
    set_error(why, &reply);
    send(reply);
  }
  close(why);
  boost::system::error_code ignored;
  socket_.cancel(ignored);
}

void Session::close(const Status& why) {
  if (closing_) return;
  closing_ = true;
  // Leave the job now, not when the last coroutine lets go of the session: the other clients
  // must learn about it within their timeout.
  if (handler_) handler_->disconnected(why);
  boost::system::error_code ignored;
  socket_.shutdown(Socket::shutdown_receive, ignored);
  // Nothing more is read: a frame cut off by the close (up to 16 MiB) goes back to the system
  // now, not to glibc's free lists when the last coroutine lets go of the session.
  if (decoder_.release() > kTrimAfterBytes && options_.setup) options_.setup->trim();
  outbox_ready_.cancel();
  watch_timer_.cancel();
  resumed_.cancel();
}

void Session::resume() {
  if (closing_ || !handler_) return;
  last_request_ = std::chrono::steady_clock::now();
  if (waiting()) return;
  // Frames that arrived meanwhile are served now; then the reader goes on.
  const uint64_t begun = frame_begin_;
  if (!serve_frames()) {
    resumed_.cancel();
    return;
  }
  if (received_bytes_ == frame_begin_) {
    frame_started_.reset();
  } else if (frame_begin_ != begun) {
    frame_started_ = std::chrono::steady_clock::now();
  }
  resumed_.cancel();
}

asio::awaitable<void> Session::read_loop() {
  auto self = shared_from_this();
  std::vector<std::byte> buffer(64 << 10);
  while (!closing_) {
    boost::system::error_code ec;
    if (waiting()) {
      // One request at a time: nothing more is read until the one in progress is done.
      resumed_.expires_at(asio::steady_timer::time_point::max());
      co_await resumed_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    co_await socket_.async_wait(Socket::wait_read, asio::redirect_error(asio::use_awaitable, ec));
    // The writer may have closed the session (and released the handler) meanwhile; nothing
    // read after that point is served.
    if (closing_ || !handler_) break;
    if (ec) {
      close(Status::peer_lost("reading from it failed: " + ec.message()));
      break;
    }
    Received got;
    const ssize_t n = receive_with_fds(socket_.native_handle(), buffer, MSG_DONTWAIT, &got);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      close(Status::peer_lost(std::string("reading from it failed: ") + std::strerror(errno)));
      break;
    }
    if (got.fds_truncated) {
      refuse(Status::protocol("more than " + std::to_string(kMaxFdsPerMessage) +
                              " file descriptors were sent in one message"));
      break;
    }
    if (n == 0) {
      const Status rest = decoder_.finish();
      if (rest.ok()) {
        close(Status());
      } else {
        refuse(rest);
      }
      break;
    }
    received_bytes_ += static_cast<uint64_t>(n);
    inbox_.add(received_bytes_, std::move(got.fds));
    if (inbox_.size() > kMaxHeldFds) {
      refuse(Status::protocol("more than " + std::to_string(kMaxHeldFds) +
                              " file descriptors arrived without a complete request claiming them"));
      break;
    }
    decoder_.feed(std::span<const std::byte>(buffer.data(), static_cast<size_t>(n)));
    const uint64_t begun = frame_begin_;
    if (!frame_started_) frame_started_ = std::chrono::steady_clock::now();
    if (!serve_frames()) break;
    // A frame not complete yet keeps its clock; one begun by these bytes starts it now.
    if (received_bytes_ == frame_begin_) {
      frame_started_.reset();
    } else if (frame_begin_ != begun) {
      frame_started_ = std::chrono::steady_clock::now();
    }
  }
}

asio::awaitable<void> Session::watch_loop() {
  auto self = shared_from_this();
  const auto limit = options_.connection_timeout;
  const auto ms = [](auto d) { return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()); };
  while (!closing_) {
    watch_timer_.expires_after(std::min<std::chrono::milliseconds>(limit / 4 + std::chrono::milliseconds(1),
                                                                   std::chrono::seconds(5)));
    boost::system::error_code ec;
    co_await watch_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec || closing_ || !handler_) break;
    const auto now = std::chrono::steady_clock::now();
    // A request being served off the io thread is the daemon's time, not the client's.
    if (waiting()) {
      last_request_ = now;
      if (frame_started_) frame_started_ = now;
      continue;
    }
    if (frame_started_ && now - *frame_started_ > limit) {
      log_.warning("closing connection: a request frame begun " + ms(now - *frame_started_) +
                   " ms ago is still incomplete (gradsyncd --connection-timeout-ms " + std::to_string(limit.count()) + ")");
      refuse(Status::timeout("a request frame was not completed within " + std::to_string(limit.count()) +
                             " ms (gradsyncd --connection-timeout-ms)"));
      break;
    }
    // A member of a failed job that neither leaves nor re-joins would keep the job (its
    // worker, its memory) alive against the job limits: it gets the same bound.
    if (!handler_->in_failed_job()) {
      failed_since_.reset();
    } else if (!failed_since_) {
      failed_since_ = now;
    } else if (now - *failed_since_ > limit) {
      log_.info("closing connection: its job failed " + ms(now - *failed_since_) +
                " ms ago and it neither left nor joined again (gradsyncd --connection-timeout-ms " +
                std::to_string(limit.count()) + ")");
      refuse(Status::timeout("the job failed and the client neither left nor joined again within " +
                             std::to_string(limit.count()) + " ms (gradsyncd --connection-timeout-ms)"));
      break;
    }
    if (!handler_->joined() && now - last_request_ > limit) {
      log_.info("closing connection: no job joined and no request for " + ms(now - last_request_) +
                " ms (gradsyncd --connection-timeout-ms " + std::to_string(limit.count()) + ")");
      refuse(Status::timeout("the connection was idle without joining a job for " + std::to_string(limit.count()) +
                             " ms (gradsyncd --connection-timeout-ms)"));
      break;
    }
  }
}

bool Session::serve_frames() {
  for (;;) {
    if (waiting()) return true;  // resume() goes on
    std::optional<std::string> payload;
    if (Status status = decoder_.next(&payload); !status.ok()) {
      refuse(status);
      return false;
    }
    // Only a joined client's registration is ever this large; anything else is refused as soon
    // as its header announces it, before the daemon buffers (up to 16 MiB) or parses it.
    const size_t bytes = payload ? payload->size() : decoder_.announced_bytes().value_or(0);
    if (bytes > kInlineParseBytes && !handler_->joined()) {
      refuse(Status::invalid_argument("a request of " + std::to_string(bytes) +
                                      " bytes before joining a job (only a registration may exceed " +
                                      std::to_string(kInlineParseBytes) + " bytes)"));
      return false;
    }
    if (!payload) return true;
    const uint64_t frame_end = frame_begin_ + kFrameHeaderBytes + bytes;
    if (bytes > kInlineParseBytes && options_.setup) {
      parsing_ = true;
      struct Parsed {
        Status status;
        control::Request request;
      };
      std::weak_ptr<Session> weak = weak_from_this();
      options_.setup->run(
          [payload = std::make_shared<std::string>(std::move(*payload)), bytes]() mutable {
            Parsed parsed;
            if (!parsed.request.ParseFromString(*payload)) {
              parsed.status = Status::protocol("malformed request: " + std::to_string(bytes) +
                                               " bytes do not parse as gradsync.control.Request");
            }
            payload.reset();  // freed now, before the trim below can run, not with this lambda
            return parsed;
          },
          [weak, frame_end, bytes, setup = options_.setup](Parsed parsed) {
            // A request nobody serves is freed off the io thread, then trimmed (a million
            // tensors are ~100 MB of small allocations), whichever way this ends.
            const auto drop = [&] {
              setup->dispose(std::make_shared<control::Request>(std::move(parsed.request)), bytes > kTrimAfterBytes);
            };
            auto self = weak.lock();
            if (!self) return drop();
            self->parsing_ = false;
            if (self->closing_ || !self->handler_) {
              self->resumed_.cancel();
              return drop();
            }
            if (!parsed.status.ok()) {
              self->refuse(parsed.status);
              return drop();
            }
            if (self->dispatch(std::move(parsed.request), frame_end)) self->resume();
            if (bytes > kTrimAfterBytes) setup->trim();
          });
      return true;
    }
    control::Request request;
    if (!request.ParseFromString(*payload)) {
      refuse(Status::protocol("malformed request: " + std::to_string(bytes) +
                              " bytes do not parse as gradsync.control.Request"));
      return false;
    }
    payload.reset();
    if (!dispatch(std::move(request), frame_end)) return false;
    if (bytes > kTrimAfterBytes && options_.setup) options_.setup->trim();
  }
}

bool Session::dispatch(control::Request request, uint64_t frame_end) {
  std::vector<UniqueFd> fds;
  if (Status status = inbox_.take(frame_begin_, frame_end, request.fd_count(), request_name(request), &fds);
      !status.ok()) {
    refuse(status);
    return false;
  }
  frame_begin_ = frame_end;
  last_request_ = std::chrono::steady_clock::now();
  // A request that throws (out of memory, no memory for a memfd) ends this connection with
  // the error, never the daemon, and never leaves the session half alive.
  try {
    handler_->handle(std::move(request), std::move(fds));
  } catch (const Error& e) {
    refuse(e.status());
  } catch (const std::exception& e) {
    refuse(Status::internal(std::string("request failed: ") + e.what()));
  }
  return !(closing_ || !handler_);
}

asio::awaitable<bool> Session::write_one(Outgoing& out) {
  boost::system::error_code ec;
  size_t sent = 0;
  if (!out.fds.empty()) {
    // The descriptors go with the frame's first bytes, in one sendmsg().
    std::vector<int> raw;
    for (const auto& fd : out.fds) raw.push_back(fd.get());
    for (;;) {
      co_await socket_.async_wait(Socket::wait_write, asio::redirect_error(asio::use_awaitable, ec));
      if (ec || overflowed_) co_return false;
      const ssize_t n = send_with_fds(socket_.native_handle(),
                                      std::as_bytes(std::span<const char>(out.frame.data(), out.frame.size())), raw,
                                      MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n < 0) {
        close(Status::peer_lost(std::string("writing to it failed: ") + std::strerror(errno)));
        co_return false;
      }
      sent = static_cast<size_t>(n);
      break;
    }
    out.fds.clear();  // the client holds its own copies now
  }
  if (sent < out.frame.size()) {
    co_await asio::async_write(socket_, asio::buffer(out.frame.data() + sent, out.frame.size() - sent),
                               asio::redirect_error(asio::use_awaitable, ec));
  }
  if (ec) {
    if (!overflowed_) close(Status::peer_lost("writing to it failed: " + ec.message()));
    co_return false;
  }
  co_return true;
}

asio::awaitable<void> Session::write_loop() {
  auto self = shared_from_this();
  for (;;) {
    while (!outbox_.empty() && !overflowed_) {
      if (!co_await write_one(outbox_.front())) break;
      outbox_bytes_ -= outbox_.front().frame.size();
      outbox_.pop_front();
    }
    // No write is in flight here, so the queue can go.
    if (overflowed_ || (closing_ && !outbox_.empty() && !socket_.is_open())) {
      outbox_.clear();
      outbox_bytes_ = 0;
    }
    if (closing_ || overflowed_) break;
    boost::system::error_code ec;
    outbox_ready_.expires_at(asio::steady_timer::time_point::max());
    co_await outbox_ready_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  // Everything queued before closing has been written; now release the handler (its memory,
  // its place in the job) and the socket.
  handler_.reset();
  boost::system::error_code ignored;
  socket_.close(ignored);
}

}  // namespace gradsync
