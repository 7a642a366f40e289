// What a control session reports about its client (the admin service's `clients`): a plain
// value, filled on the io thread and copied out. It belongs to control/, so that control/
// includes nothing of admin/; admin/snapshot.h names it for the admin service.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace gradsync {

struct ClientInfo {
  pid_t pid = 0;
  uid_t uid = 0;
  std::string name;
  std::string job;
  int rank = -1, local_rank = -1;
  std::string state;  // "connected", "joined", "job failed"
  uint32_t segments = 0;
  uint64_t segment_bytes = 0;
  std::chrono::milliseconds idle{0};
};

}  // namespace gradsync
