// A join request checked on its own, before any job is looked at: names, ranges, node layout,
// process groups. The first thing the daemon does with what a client sends, so it is also what
// the request fuzzer drives (tests/fuzz/request_fuzzer.cc).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "daemon/model/topology.h"
#include "proto/control.pb.h"
#include "shared/status.h"

namespace gradsync {

struct JobParams {
  std::string id;
  uid_t uid = 0;  // jobs are keyed by (uid, id): another user's job of the same id is another job
  int world_size = 0;
  int local_world_size = 0;
  std::chrono::milliseconds timeout{30'000};
  Topology topology;
  std::string rendezvous;  // node-0 peer service, multi-node jobs only
};

// Checks a join request and derives the job's parameters; the error names the field.
Status validate_join(const control::JoinRequest& request, std::chrono::milliseconds default_timeout,
                     std::chrono::milliseconds max_timeout, JobParams* params);

}  // namespace gradsync
