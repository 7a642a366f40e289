// What every control connection uses from the daemon, handed from the server to each session
// and on to its handler as one value rather than field by field.
#pragma once

#include <memory>

#include "daemon/backend/factory.h"
#include "daemon/job/registry.h"
#include "daemon/util/local_limits.h"
#include "daemon/util/setup_threads.h"

namespace gradsync {

struct ControlContext {
  JobRegistry* registry = nullptr;
  BackendFactory* backends = nullptr;
  // Channel and segment setup, large requests' parsing and checks; null: inline (tests).
  SetupThreads* setup = nullptr;
  // Per-user limits (local_limits.h). A session without one makes a private one with the
  // default limits (tests); the server requires it.
  std::shared_ptr<UserCounts> users;
};

}  // namespace gradsync
