// The control protocol of one connected client: Hello, then Join, then any number of Segment
// and Register requests. Holds what the client owns in the daemon (the memory regions it passed
// and its place in a job) and releases it when the client disconnects.
//
// Every request gets exactly one reply. Hello is answered at once. Join, Segment and Register do
// their work off the io thread (SetupThreads: creating the client's channel, importing its
// memory, checking its tensors), and the handler is busy() meanwhile: the Session serves the
// client's next request only once this one is done, so each client's requests keep their
// order while other clients are served. Register is answered when the set's registration
// barrier completes, which may be after this handler is gone (the reply is then dropped by the
// Session).
//
// What a client may hold is bounded (local_limits.h): segments and tensors per client, and,
// through the shared UserCounts, connections, segments and waiting registrations per user.
#pragma once

#include <chrono>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "daemon/control/client_report.h"
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
  JobRegistry* registry = nullptr;
  BackendFactory* backends = nullptr;
  PeerCredentials peer;
  Logger log;
  ReplySender send;  // must be safe to call after the handler is gone
  // Called on the io thread when a request that made the handler busy() is done.
  std::function<void()> resume;
  // Ends the connection with an error (a request whose work failed unexpectedly).
  std::function<void(const Status&)> refuse;
  SetupThreads* setup = nullptr;  // null: the work runs inline (tests)
  std::shared_ptr<UserCounts> users;  // required
};

class ClientHandler {
 public:
  explicit ClientHandler(ClientHandlerOptions options);
  ~ClientHandler();  // leaves the job, releases the memory regions
  ClientHandler(const ClientHandler&) = delete;
  ClientHandler& operator=(const ClientHandler&) = delete;

  // Serves one request; `fds` are the descriptors sent with it (already counted against the
  // request's fd_count). May leave the handler busy() until its work is done off the io thread.
  void handle(control::Request request, std::vector<UniqueFd> fds);

  // A request is being served off the io thread; the next must wait (resume() is called then).
  bool busy() const { return busy_; }

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
  Status on_hello(const control::Hello& hello, control::Reply* reply);
  // These three answer through finish(); an error they return is answered at once instead.
  Status on_join(uint64_t request_id, const control::JoinRequest& join);
  Status on_segment(uint64_t request_id, const control::SegmentRequest& segment, std::vector<UniqueFd> fds);
  Status on_register(uint64_t request_id, control::Request request);
  // Runs work() off the io thread and then(result) back on it, unless the handler is gone by
  // then; the handler is busy() in between.
  template <class Work, class Then>
  void offload(Work work, Then then);
  // Answers the request the handler was busy with, and lets the Session go on.
  void finish(control::Reply reply, std::vector<UniqueFd> fds, const Status& status);
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
  std::vector<SegmentTickets> segment_tickets_;  // one per segment, against the user's limits
  uint32_t next_segment_id_ = 1;
  // Tensors in this client's registrations that are waiting or committed; shared with their
  // callbacks, which give a failed registration's back.
  std::shared_ptr<uint64_t> tensors_ = std::make_shared<uint64_t>(0);
  bool busy_ = false;
  bool closed_ = false;  // the connection ended; work still coming back is dropped
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // false once destroyed
};

// Sets reply->error from a status.
void set_error(const Status& status, control::Reply* reply);

}  // namespace gradsync
