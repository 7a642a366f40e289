// gloo::rendezvous::Store over the rendezvous daemon's peer service: how the nodes' Gloo
// contexts find each other. Keys are scoped by a prefix that names the job, its generation and
// the process group, so incarnations and groups never see each other's keys.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "daemon/peer/peer_client.h"

namespace gradsync {

class PeerStore final : public gloo::rendezvous::Store {
 public:
  // `tcp_addresses`: the values are Gloo TCP addresses, whose unused bytes are zeroed before
  // they are published (address_scrub.h).
  PeerStore(std::shared_ptr<PeerClient> client, std::string job, std::string prefix, std::chrono::milliseconds timeout,
            bool tcp_addresses = false);

  // Failures throw gradsync::Error; the Gloo engine translates everything at its boundary.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<PeerClient> client_;
  std::string job_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  bool tcp_addresses_;
};

}  // namespace gradsync
