#include "daemon/rendezvous/store_opener.h"

#include "daemon/peer/peer_client.h"
#include "daemon/rendezvous/etcd_store.h"

namespace gradsync {

Status StoreOpener::open(const std::string& rendezvous, const Logger& log,
                         std::shared_ptr<RendezvousStore>* out) const {
  if (!is_etcd_rendezvous(rendezvous)) {
    *out = std::make_shared<PeerClient>(rendezvous, auth_);  // node 0's peer service, dialed as given
    return Status();
  }
  if (!etcd_) return Status::not_supported("this gradsyncd takes no etcd rendezvous");
  std::vector<std::string> members;
  if (Status s = etcd_->members(rendezvous, &members); !s.ok()) return s;
  *out = std::make_shared<EtcdStore>(std::make_shared<EtcdSession>(etcd_, std::move(members), log));
  return Status();
}

}  // namespace gradsync
