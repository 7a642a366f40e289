// What a job reports about itself to whoever asks (the admin service, today): plain values,
// filled on the threads that own the state (the io thread for the job, its worker thread for
// its operations) and copied out, so that no other thread touches live job state. They belong
// to job/, so that job/ includes nothing of admin/; admin/snapshot.h names them for the admin
// service.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gradsync {

struct PendingBucket {
  uint32_t bucket = 0;
  std::string group;
  uint64_t bytes = 0;
  std::vector<int> ranks_not_ready;  // global ranks of this node
  bool launched = false;             // every local rank marked it: executing
};

// Where another node of a multi-node job is, as its daemon answered (or that it did not).
struct RemoteNode {
  int node = 0;
  std::string address;
  bool unreachable = false;
  bool not_asked = false;  // the view's time ran out before its turn: unknown, not behind
  std::string error;  // why unreachable or not asked, or the job's failure there
  uint64_t operations_done = 0;
  uint64_t current_seq = 0;
  uint32_t current_bucket = 0;
  bool executing = false;
};

struct PendingOperation {
  uint64_t seq = 0;
  std::string kind;  // describe(OpDesc)
  uint32_t set = 0;
  std::chrono::milliseconds age{0};
  std::vector<int> ranks_not_submitted;  // global ranks of this node
  std::vector<PendingBucket> buckets;    // not finished
  std::vector<RemoteNode> nodes_behind;  // the head operation: nodes not at its oldest unfinished bucket
};

struct JobInfo {
  std::string id;
  uid_t uid = 0;
  uint64_t incarnation = 0;
  std::string state;  // "running", "failed"
  int world_size = 0, local_world_size = 0, node = 0, nodes = 1;
  std::map<std::string, std::vector<int>> groups;
  std::vector<int> local_ranks_joined;
  uint32_t sets = 0;
  uint64_t registered_bytes = 0;
  uint64_t operations_done = 0;
  uint32_t operations_pending = 0;
  std::string last_error;
  std::chrono::milliseconds age{0};
};

}  // namespace gradsync
