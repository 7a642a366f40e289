// The control protocol of one connected client: Hello, then Join, then any number of Segment
// and Register requests. Holds what the client owns in the daemon (the memory regions it passed
// and its place in a job) and releases it when the client disconnects.
//
// Each request is one coroutine, serve(), that reads top to bottom: what must not run on the
// io thread (creating the client's channel, importing its memory, checking its tensors) is
// awaited on a setup thread (SetupThreads::offload), and the coroutine goes on back on the io
// thread, where the client's state lives. The Session awaits serve() before it reads the
// client's next request, so each client's requests keep their order while other clients are
// served, and the handler outlives every request in flight. Register is answered when the
// set's registration barrier completes, which may be after this handler is gone (the reply is
// then dropped by the Session).
//
// What a client may hold is bounded (local_limits.h): segments and tensors per client, and,
// through the shared UserCounts, connections, segments and waiting registrations per user.
#pragma once

#include <chrono>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "daemon/control/asio.h"
#include "daemon/control/client_report.h"
#include "daemon/control/context.h"
#include "daemon/backend/factory.h"
#include "daemon/util/local_limits.h"
#include "daemon/control/peer_credentials.h"
#include "daemon/util/setup_threads.h"
#include "daemon/job/registry.h"
#include "daemon/util/log.h"
#include "proto/control.pb.h"
#include "shared/unique_fd.h"
#include "shared/status.h"

namespace gradsync {

// Sends a reply with the descriptors that go with it.
using ReplySender = std::function<void(const control::Reply&, std::vector<UniqueFd>)>;

struct ClientHandlerOptions {
  ControlContext context;  // its user counts are required
  PeerCredentials peer;
  Logger log;
  // Sends a registration's answer, when its barrier completes: must be safe to call after the
  // handler is gone.
  ReplySender send;
};

class ClientHandler {
 public:
  explicit ClientHandler(ClientHandlerOptions options);
  ~ClientHandler();  // leaves the job, releases the memory regions
  ClientHandler(const ClientHandler&) = delete;
  ClientHandler& operator=(const ClientHandler&) = delete;

  // What a request is answered with at once: a reply and the descriptors that go with it, or
  // nothing for a registration, which its barrier answers through ClientHandlerOptions::send.
  struct Answer {
    std::optional<control::Reply> reply;
    std::vector<UniqueFd> fds;
  };

  // Serves one request; `fds` are the descriptors sent with it (already counted against the
  // request's fd_count). On the io thread; the caller awaits it before serving the next. An
  // exception it throws (out of memory) is the caller's to answer by closing the connection.
  // (No co_await expression here makes a temporary other than the awaitable and its result:
  // arguments are named objects, pointers or references. See SetupThreads::offload for the
  // compiler bug that this avoids.)
  boost::asio::awaitable<Answer> serve(control::Request request, std::vector<UniqueFd> fds);

  // The connection ended: ok for a plain disconnect, else why it was closed.
  void disconnected(const Status& why);

  // For the admin service.
  ClientInfo info() const;

  // Whether the client joined a job (and is in it): a joined trainer may stay quiet on the
  // control socket for as long as it trains.
  bool joined() const { return job_ != nullptr; }
  // Whether the client's job has failed: it may re-join, but not hold the failed job forever.
  bool in_failed_job() const { return job_ != nullptr && !job_->failure().ok(); }

 private:
  // Each fills `answer` (its reply is set, with the request's id) or returns an error.
  Status on_hello(const control::Hello& hello, Answer* answer);
  boost::asio::awaitable<Status> on_join(const control::JoinRequest& join, Answer* answer);
  boost::asio::awaitable<Status> on_segment(const control::SegmentRequest& segment, std::vector<UniqueFd>* fds,
                                            Answer* answer);
  // Leaves answer->reply unset once the job holds the registration.
  boost::asio::awaitable<Status> on_register(control::Request* request, Answer* answer);
  Status on_release(const control::ReleaseRequest& release, Answer* answer);
  boost::asio::awaitable<Status> on_free_segment(const control::FreeSegmentRequest& request, Answer* answer);
  // Awaiting what off_io(work) returns: work() on a setup thread (inline without one), its
  // result back here.
  template <class Work>
  boost::asio::awaitable<std::invoke_result_t<Work&>> off_io(Work work);
  // A refused request of many tensors is freed (and the heap trimmed) off the io thread.
  void dispose(control::Request request);
  void leave_job(const Status& why);
  std::string who() const;

  ClientHandlerOptions options_;
  bool greeted_ = false;
  std::string name_;  // what the client called itself in its Hello
  std::chrono::steady_clock::time_point last_request_ = std::chrono::steady_clock::now();
  std::shared_ptr<Job> job_;
  int rank_ = -1;
  int local_rank_ = -1;
  std::map<uint32_t, std::shared_ptr<const MemoryRegion>> segments_;
  // A segment's (or a waiting registration's) hold on the user's count and byte budget.
  struct SegmentTickets {
    UserCounts::Ticket count;
    UserCounts::Ticket bytes;
  };
  std::map<uint32_t, SegmentTickets> segment_tickets_;  // by segment id, against the user's limits
  uint32_t next_segment_id_ = 1;
  // Tensors in this client's registrations that are waiting or committed; shared with their
  // callbacks, which give a failed registration's back.
  std::shared_ptr<uint64_t> tensors_ = std::make_shared<uint64_t>(0);
  // Each masked set's charge against the user's byte budget, by set id, held while the set is
  // registered (until released, or the client goes); shared with the registrations' callbacks.
  std::shared_ptr<std::map<uint32_t, UserCounts::Ticket>> mask_tickets_ =
      std::make_shared<std::map<uint32_t, UserCounts::Ticket>>();
  bool closed_ = false;  // the connection ended; a request in flight drops what it made
  // A client may send refused requests as fast as it can write (empty frames): their log lines
  // are one a second per connection at most, the rest counted.
  LogThrottle refusals_;
  // Resumes the request waiting for a setup thread, as aborted (SetupThreads::offload).
  std::function<void()> abandon_;
};

// Sets reply->error from a status.
void set_error(const Status& status, control::Reply* reply);

}  // namespace gradsync
