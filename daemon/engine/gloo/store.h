// gloo::rendezvous::Store over the job's rendezvous store (node 0's peer service, or etcd):
// how the nodes' Gloo contexts find each other. Keys are scoped by a prefix that names the job,
// its generation and the process group, so incarnations and groups never see each other's keys.
//
// Gloo's full mesh asks for every other rank's keys one by one ("<r>", its pair addresses, and
// "rank_<r>", its host), each a wait and then a get: 3 calls per peer, so N nodes made ~3.5 N²
// calls at the rendezvous (14,368 gets at 64 nodes, 3.6 s to form). Given the node count, the
// store fetches a whole family the first time Gloo asks for one of its keys (the calls wait
// until every rank has published, as Gloo would, one key at a time) and answers the rest from
// what it fetched. A family goes in replies of about 1 MiB: one call each up to about 100
// ranks, two calls per node in all; beyond, the "<r>" family (N addresses per value) takes
// N / (7,700 / N) calls per node, still a fraction of one per peer.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/peer/rendezvous_store.h"

namespace gradsync {

class PeerStore final : public gloo::rendezvous::Store {
 public:
  // `tcp_addresses`: the values are Gloo TCP addresses, whose unused bytes are zeroed before
  // they are published (address_scrub.h).
  // `ranks`: the mesh's size, for fetching whole families (0: every key on its own).
  PeerStore(std::shared_ptr<RendezvousStore> client, std::string job, std::string prefix, std::chrono::milliseconds timeout,
            bool tcp_addresses = false, int ranks = 0);

  // Failures throw gradsync::Error; the Gloo engine translates everything at its boundary.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  // The family of `key` ("" for "<r>", "rank_" for "rank_<r>") when it is one; nullopt else.
  std::optional<std::string> family_of(const std::string& key) const;
  // Fetches every rank's key of the family, once, into fetched_, waiting up to `timeout`.
  void fetch_family(const std::string& family, std::chrono::milliseconds timeout);

  std::shared_ptr<RendezvousStore> client_;
  std::string job_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  bool tcp_addresses_;
  int ranks_;
  std::map<std::string, std::string> fetched_;  // key (unscoped) -> value; Gloo calls from one thread
};

}  // namespace gradsync
