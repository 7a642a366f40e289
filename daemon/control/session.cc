#include "daemon/control/session.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <utility>

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
// A queued reply's cost beyond its frame: the queue's entry and the frame's heap block (a
// 17-byte Hello reply once held about 100 bytes of heap, counted as 17), and per descriptor,
// its table entry and kernel file beyond the memory it names.
constexpr size_t kQueuedReplyOverhead = 256;
constexpr size_t kQueuedFdOverhead = 4096;
// Descriptors queued for one client at most (a well-behaved one has one reply in flight, with
// at most three), and where the reader stops reading that client's requests.
constexpr size_t kMaxQueuedFds = 64;
constexpr size_t kPauseReadingBytes = 1u << 20;
constexpr size_t kPauseReadingFds = 16;
constexpr auto kCloseLinger = std::chrono::seconds(2);
// Frames one connection is served in a row before the io thread turns to the others.
constexpr size_t kFramesPerTurn = 32;

const char* request_name(const control::Request& request) {
  switch (request.body_case()) {
    case control::Request::kHello: return "Hello";
    case control::Request::kJoin: return "Join";
    case control::Request::kSegment: return "Segment";
    case control::Request::kRegister: return "Register";
    case control::Request::kRelease: return "Release";
    case control::Request::kFreeSegment: return "FreeSegment";
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
      outbox_drained_(socket_.get_executor(), asio::steady_timer::time_point::max()),
      linger_timer_(socket_.get_executor()),
      send_wait_timer_(socket_.get_executor()),
      watch_timer_(socket_.get_executor()) {
  if (!options_.context.users) options_.context.users = std::make_shared<UserCounts>(LocalLimits{});
}

Session::~Session() = default;

void Session::start() {
  std::weak_ptr<Session> weak = weak_from_this();
  ClientHandlerOptions handler;
  handler.context = options_.context;
  handler.peer = peer_;
  handler.log = log_;
  handler.send = [weak](const control::Reply& reply, std::vector<UniqueFd> fds) {
    if (auto self = weak.lock()) self->send(reply, std::move(fds));
  };
  handler_.emplace(std::move(handler));
  auto self = shared_from_this();
  // A loop that throws (out of memory) closes the connection and still counts as ended, so the
  // handler is released; the daemon goes on.
  const auto ended = [self](std::exception_ptr error) {
    if (error) self->loop_failed(error);
  };
  asio::co_spawn(socket_.get_executor(), [self]() { return self->read_loop(); }, ended);
  // The watch loop holds no part of the handler's lifetime: one that throws closes the
  // connection, which would otherwise lose its idle and half-open bounds.
  asio::co_spawn(socket_.get_executor(), [self]() { return self->watch_loop(); }, [self](std::exception_ptr error) {
    if (!error) return;
    try {
      self->close(Status::internal("watching the connection failed"));
    } catch (...) {
    }
  });
  asio::co_spawn(socket_.get_executor(), [self]() { return self->write_loop(); }, ended);
}

void Session::send(const control::Reply& reply, std::vector<UniqueFd> fds) {
  if ((closing_ && !socket_.is_open()) || overflowed_) return;
  control::Reply copy = reply;
  copy.set_fd_count(static_cast<uint32_t>(fds.size()));
  std::string payload = copy.SerializeAsString();
  if (payload.size() > kMaxFrameBytes) {
    // Registrations are refused before their reply could grow this large
    // (register_reply.h); should any other reply, the call fails rather than the io thread,
    // which an exception here would end, and with it every client of the daemon.
    const Status too_big = Status::internal("the daemon's reply was " + std::to_string(payload.size()) +
                                            " bytes, over the control protocol's frame limit of " +
                                            std::to_string(kMaxFrameBytes));
    log_.error(too_big.to_string());
    control::Reply refused;
    refused.set_id(reply.id());
    set_error(too_big, &refused);
    payload = refused.SerializeAsString();
    fds.clear();
  }
  std::string frame = encode_frame(payload);
  // A client that sends requests but never reads replies must not grow the daemon's memory:
  // the reader stops reading its requests while replies are backed up, and what is queued
  // anyway (a registration's answer comes when the job admits it) is bounded, descriptors and
  // what they hold included. The queue is not touched here: a write may be in flight from its
  // front, so the write loop drops it once that write has been cancelled.
  const size_t cost = outbox_cost(frame, fds);
  if (outbox_bytes_ + cost > options_.max_outbox_bytes || outbox_fds_ + fds.size() > kMaxQueuedFds) {
    overflowed_ = true;
    log_.warning("closing connection: the client does not read its replies");
    close(Status::resource_exhausted("the client does not read its replies"));
    boost::system::error_code ignored;
    socket_.cancel(ignored);
    outbox_ready_.cancel();
    return;
  }
  outbox_bytes_ += cost;
  outbox_fds_ += fds.size();
  outbox_.push_back(Outgoing{std::move(frame), std::move(fds), cost});
  outbox_ready_.cancel();
}

void Session::defuse(const std::vector<UniqueFd>& fds) {
  // A client's descriptors are closed where they are refused, on the io thread among others.
  // close() of a socket whose owner set SO_LINGER, with data its peer never reads, blocks for
  // the linger time (up to hours), and every client of the daemon with it. Any descriptor may
  // be a socket, whatever the request claims: those get the default linger, under which close()
  // returns at once (the kernel goes on sending, or drops, in the background). The setting is
  // the socket's, which its sender shares; it only made the socket a weapon.
  for (const UniqueFd& fd : fds) {
    int type = 0;
    socklen_t length = sizeof(type);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &type, &length) != 0) continue;  // not a socket
    const struct linger off {};
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &off, sizeof(off));
  }
}

asio::awaitable<void> Session::until_outbox_drained() {
  boost::system::error_code ec;
  while (outbox_backed_up() && !closing_) {
    outbox_drained_.expires_at(asio::steady_timer::time_point::max());
    co_await outbox_drained_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

size_t Session::outbox_cost(const std::string& frame, const std::vector<UniqueFd>& fds) {
  size_t cost = frame.size() + kQueuedReplyOverhead;
  for (const UniqueFd& fd : fds) {
    struct stat st {};
    cost += kQueuedFdOverhead;
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode)) cost += static_cast<size_t>(st.st_size);
  }
  return cost;
}

bool Session::outbox_backed_up() const {
  return outbox_bytes_ > kPauseReadingBytes || outbox_fds_ > kPauseReadingFds;
}

void Session::refuse(const Status& status, bool logged) {
  if (!logged) log_.warning("closing connection: " + status.to_string());
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
  // The coroutines are woken first, so that they end even should what follows throw.
  boost::system::error_code ignored;
  socket_.shutdown(Socket::shutdown_receive, ignored);
  outbox_ready_.cancel();
  outbox_drained_.cancel();
  send_wait_timer_.cancel();
  watch_timer_.cancel();
  // The last replies (the reason for closing) get a moment to be written; a client that does
  // not read them does not keep the session, its queue and its descriptor.
  linger_timer_.expires_after(kCloseLinger);
  linger_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self) return;
    boost::system::error_code cancelled;
    self->socket_.cancel(cancelled);
  });
  if (std::function<void()> abandon = std::exchange(abandon_, nullptr)) abandon();
  // Nothing more is read: a frame cut off by the close (up to 16 MiB) goes back to the system
  // now, not to glibc's free lists when the last coroutine lets go of the session.
  if (decoder_.release() > kTrimAfterBytes && options_.context.setup) options_.context.setup->trim();
  // Leave the job now, not when the last coroutine lets go of the session: the other clients
  // must learn about it within their timeout.
  if (handler_) handler_->disconnected(why);
}

void Session::loop_failed(std::exception_ptr error) {
  serving_ = false;
  // Nothing here may throw out: this runs as a completion handler, outside any coroutine.
  try {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    close(Status::internal("serving the connection failed: " + what));
  } catch (...) {
    closing_ = true;  // what close() could not finish, the loops' end does
  }
  boost::system::error_code ignored;
  socket_.shutdown(Socket::shutdown_receive, ignored);
  socket_.cancel(ignored);
  outbox_ready_.cancel();
  watch_timer_.cancel();
  loop_ended();
}

void Session::loop_ended() {
  if (--loops_ > 0) return;
  // Both have ended, so no request is in flight: release the handler (its memory, its place in
  // the job) and the socket.
  handler_.reset();
  boost::system::error_code ignored;
  socket_.close(ignored);
}

asio::awaitable<void> Session::read_loop() {
  auto self = shared_from_this();
  std::vector<std::byte> buffer(64 << 10);
  while (!closing_) {
    boost::system::error_code ec;
    // Backpressure: no more requests from a client that does not take its replies.
    co_await until_outbox_drained();
    if (closing_) break;
    co_await socket_.async_wait(Socket::wait_read, asio::redirect_error(asio::use_awaitable, ec));
    // The session may have closed meanwhile; nothing read after that point is served.
    if (closing_) break;
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
    defuse(got.fds);
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
    // One request at a time: nothing more is read until every complete one is served.
    serving_ = true;
    const bool open = co_await serve_frames();
    serving_ = false;
    if (!open) break;
    // The idle bound counts from the end of the last request served; a frame not complete yet
    // keeps its clock, and one begun by these bytes (after requests served) starts it now.
    if (frame_begin_ != begun) last_request_ = std::chrono::steady_clock::now();
    if (received_bytes_ == frame_begin_) {
      frame_started_.reset();
    } else if (frame_begin_ != begun) {
      frame_started_ = std::chrono::steady_clock::now();
    }
  }
  loop_ended();
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
    // A request being served is the daemon's time, not the client's.
    if (serving_) {
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

asio::awaitable<bool> Session::serve_frames() {
  for (size_t served = 0;; ++served) {
    // One read may bring a thousand small frames: the io thread serves every connection, so a
    // client that floods it with requests gets its turn in slices, the others in between.
    if (served > 0 && served % kFramesPerTurn == 0) {
      co_await asio::post(socket_.get_executor(), asio::use_awaitable);
      if (closing_) co_return false;
    }
    // Frames already read wait too, while the client does not take its replies: one read can
    // bring hundreds of Joins, each answered with descriptors.
    if (outbox_backed_up()) {
      serving_ = false;  // the client's time, not the daemon's: the idle and half-open bounds count it
      co_await until_outbox_drained();
      serving_ = true;
      if (closing_) co_return false;
    }
    std::optional<std::string> payload;
    if (Status status = decoder_.next(&payload); !status.ok()) {
      refuse(status);
      co_return false;
    }
    // Only a joined client's registration is ever this large; anything else is refused as soon
    // as its header announces it, before the daemon buffers (up to 16 MiB) or parses it.
    const size_t bytes = payload ? payload->size() : decoder_.announced_bytes().value_or(0);
    if (bytes > kInlineParseBytes && !handler_->joined()) {
      refuse(Status::invalid_argument("a request of " + std::to_string(bytes) +
                                      " bytes before joining a job (only a registration may exceed " +
                                      std::to_string(kInlineParseBytes) + " bytes)"));
      co_return false;
    }
    if (!payload) co_return true;
    const uint64_t frame_end = frame_begin_ + kFrameHeaderBytes + bytes;
    struct Parsed {
      Status status;
      control::Request request;
    };
    const auto parse = [bytes](const std::string& text) {
      Parsed parsed;
      if (!parsed.request.ParseFromString(text)) {
        parsed.status = Status::protocol("malformed request: " + std::to_string(bytes) +
                                         " bytes do not parse as gradsync.control.Request");
      }
      return parsed;
    };
    Parsed parsed;
    if (bytes > kInlineParseBytes && options_.context.setup) {
      // A large frame (a registration of many tensors) is parsed on a setup thread, so that no
      // client's request stalls the others; its text is freed there too.
      auto parse_off_io = [parse, text = std::move(*payload)]() mutable {
        Parsed result = parse(text);
        std::string().swap(text);
        return result;
      };
      auto pending = options_.context.setup->offload(std::move(parse_off_io), &abandon_);
      parsed = co_await std::move(pending);
    } else {
      parsed = parse(*payload);
    }
    payload.reset();
    // A request nobody serves is freed off the io thread, then trimmed (a million tensors are
    // ~100 MB of small allocations).
    const auto drop = [&] {
      if (options_.context.setup) {
        options_.context.setup->dispose(std::make_shared<control::Request>(std::move(parsed.request)), bytes > kTrimAfterBytes);
      }
    };
    if (closing_) {
      drop();
      co_return false;
    }
    if (!parsed.status.ok()) {
      refuse(parsed.status);
      drop();
      co_return false;
    }
    if (!co_await dispatch(&parsed.request, frame_end)) co_return false;
    if (bytes > kTrimAfterBytes && options_.context.setup) options_.context.setup->trim();
  }
}

asio::awaitable<bool> Session::dispatch(control::Request* request, uint64_t frame_end) {
  std::vector<UniqueFd> fds;
  if (Status status = inbox_.take(frame_begin_, frame_end, request->fd_count(), request_name(*request), &fds);
      !status.ok()) {
    refuse(status);
    co_return false;
  }
  frame_begin_ = frame_end;
  last_request_ = std::chrono::steady_clock::now();
  // A request that throws (out of memory, no memory for a memfd) ends this connection with
  // the error, never the daemon, and never leaves the session half alive.
  Status failed;
  try {
    auto serving = handler_->serve(std::move(*request), std::move(fds));
    ClientHandler::Answer answer = co_await std::move(serving);
    if (answer.reply && !closing_) send(*answer.reply, std::move(answer.fds));
  } catch (const Error& e) {
    failed = e.status();
  } catch (const std::exception& e) {
    failed = Status::internal(std::string("request failed: ") + e.what());
  }
  if (!failed.ok()) refuse(failed);
  co_return !closing_;
}

asio::awaitable<bool> Session::write_one(Outgoing& out) {
  boost::system::error_code ec;
  size_t sent = 0;
  if (!out.fds.empty()) {
    // At most one reply with descriptors in the kernel at a time: sent descriptors are counted
    // nowhere of the daemon's, and a client that never reads could otherwise keep a socket
    // buffer's worth of them (a Join's rings each, about 330 KiB) in flight. It is sent once
    // the client read everything sent before it.
    for (std::chrono::milliseconds pause{1};; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
      int unread = 0;
      if (::ioctl(socket_.native_handle(), SIOCOUTQ, &unread) != 0 || unread == 0) break;
      send_wait_timer_.expires_after(pause);
      co_await send_wait_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (ec || overflowed_ || closing_) co_return false;
    }
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
      const size_t fds = outbox_.front().fds.size();
      if (!co_await write_one(outbox_.front())) break;
      outbox_bytes_ -= outbox_.front().cost;
      outbox_fds_ -= fds;
      outbox_.pop_front();
      if (!outbox_backed_up()) outbox_drained_.cancel();
    }
    // No write is in flight here, so the queue can go.
    if (overflowed_ || (closing_ && !outbox_.empty() && !socket_.is_open())) {
      outbox_.clear();
      outbox_bytes_ = 0;
      outbox_fds_ = 0;
    }
    if (closing_ || overflowed_) break;
    boost::system::error_code ec;
    outbox_ready_.expires_at(asio::steady_timer::time_point::max());
    co_await outbox_ready_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  // Everything queued before closing has been written: the client sees the end of the stream
  // now, and the reader, if it waits on the socket, ends.
  boost::system::error_code ignored;
  socket_.close(ignored);
  loop_ended();
}

}  // namespace gradsync
