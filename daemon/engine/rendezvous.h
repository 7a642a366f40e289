// Rendezvous: how the daemons of one job agree on small values before a collective library can
// connect them (the NCCL unique id, which GPUs each node brings). Each node offers one value
// under a name and gets every node's value back, in node order. A multi-node job's Cluster
// implements it over the peer service; a single-node job uses LocalRendezvous.
//
// Contract: every node calls exchange() with the same names in the same order (they commit the
// same sets), names are scoped to the job's generation by the implementation, and a call blocks
// at most the job timeout and returns promptly when the job is aborted.
#pragma once

#include <string>
#include <vector>

#include "shared/status.h"

namespace gradsync {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual int node() const = 0;
  virtual int nodes() const = 0;
  // Offers `mine` under `name`; *all receives nodes() values, node i's at index i.
  virtual Status exchange(const std::string& name, const std::string& mine, std::vector<std::string>* all) = 0;
};

// The one node of a single-node job: every exchange returns its own value.
class LocalRendezvous final : public Rendezvous {
 public:
  int node() const override { return 0; }
  int nodes() const override { return 1; }
  Status exchange(const std::string&, const std::string& mine, std::vector<std::string>* all) override {
    *all = {mine};
    return Status();
  }
};

}  // namespace gradsync
