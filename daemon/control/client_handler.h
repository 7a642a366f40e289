// The control protocol of one connected client: Hello, then Join, then any number of Segment
// and Register requests. Holds what the client owns in the daemon (the memory regions it passed
// and its place in a job) and releases it when the client disconnects.
//
// Every request gets exactly one reply. Most are answered at once; Register is answered when the
// set's registration barrier completes, which may be after this handler is gone (the reply is
// then dropped by the Session).
#pragma once

#include <chrono>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "daemon/admin/snapshot.h"
#include "daemon/backend/factory.h"
#include "daemon/control/peer_credentials.h"
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
  size_t max_segments = 65536;
};

class ClientHandler {
 public:
  explicit ClientHandler(ClientHandlerOptions options);
  ~ClientHandler();  // leaves the job, releases the memory regions
  ClientHandler(const ClientHandler&) = delete;
  ClientHandler& operator=(const ClientHandler&) = delete;

  // Serves one request; `fds` are the descriptors sent with it (already counted against the
  // request's fd_count).
  void handle(const control::Request& request, std::vector<UniqueFd> fds);

  // The connection ended: ok for a plain disconnect, else why it was closed.
  void disconnected(const Status& why);

  // For the admin service.
  admin::ClientInfo info() const;

  // Whether the client joined a job (and is in it): a joined trainer may stay quiet on the
  // control socket for as long as it trains.
  bool joined() const { return job_ != nullptr; }

 private:
  Status on_hello(const control::Hello& hello, control::Reply* reply);
  Status on_join(const control::JoinRequest& join, control::Reply* reply, std::vector<UniqueFd>* fds);
  Status on_segment(const control::SegmentRequest& segment, std::vector<UniqueFd> fds, control::Reply* reply);
  Status on_register(uint64_t request_id, const control::RegisterRequest& request);
  // Device sets: makes the client's event rings on the GPU of its tensors (`used` regions).
  Status create_set_events(const std::vector<const MemoryRegion*>& used, std::shared_ptr<const ClientEvents>* events);
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
  uint32_t next_segment_id_ = 1;
};

// Sets reply->error from a status.
void set_error(const Status& status, control::Reply* reply);

}  // namespace gradsync
