// Which store a job's nodes meet through, from the rendezvous its trainers name:
//   "HOST:PORT"                   node 0's daemon's peer service (PeerClient), the default;
//   "etcd://HOST:PORT[,...]"      an etcd cluster (EtcdStore), as this daemon's --etcd-*
//                                 settings allow.
// Opening checks the rendezvous (what a join is refused with) but connects to nothing: the
// first call reports an unreachable store.
#pragma once

#include <memory>
#include <string>

#include "daemon/peer/peer_auth.h"
#include "daemon/peer/rendezvous_store.h"
#include "daemon/rendezvous/etcd_access.h"
#include "daemon/util/log.h"

namespace gradsync {

class StoreOpener {
 public:
  StoreOpener(std::shared_ptr<const PeerAuth> auth, std::shared_ptr<const EtcdAccess> etcd)
      : auth_(std::move(auth)), etcd_(std::move(etcd)) {}

  // A store for one job on this node; `log` names the job. The error names what is wrong with
  // the rendezvous.
  Status open(const std::string& rendezvous, const Logger& log, std::shared_ptr<RendezvousStore>* out) const;

 private:
  std::shared_ptr<const PeerAuth> auth_;
  std::shared_ptr<const EtcdAccess> etcd_;  // null: etcd is refused
};

}  // namespace gradsync
