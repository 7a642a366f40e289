// gloo::rendezvous::Store over the job's rendezvous store (node 0's peer service, or etcd):
// how the nodes' Gloo contexts find each other. Keys are scoped by a prefix that names the job,
// its generation and the process group, so incarnations and groups never see each other's keys.
//
// Gloo's full mesh asks for every other rank's keys one by one ("<r>", its pair addresses, and
// "rank_<r>", its host), each a wait and then a get: 3 calls per peer, so N nodes made ~3.5 N²
// calls at the rendezvous (14,368 gets at 64 nodes, 3.6 s to form). Given the node count, the
// store fetches a whole family the first time Gloo asks for one of its keys (the calls wait
// until every rank has published, as Gloo would, one key at a time) and answers the rest from
// what it fetched. A family goes in replies of about 1 MiB.
//
// The "<r>" family is also transposed. Rank r's value lists a pair address for every other
// rank (N - 1 of them, rank s's at s - 1 when s > r, else at s: Gloo's Context::extractAddress),
// and rank s needs only its own entry of each list; read whole, every rank read every list, N³
// addresses at the rendezvous (35 MB at 64 nodes, 136 GB at 1,000). Now rank 0 reads the lists
// once and publishes, for each other rank s, "col_<s>": s's entry of every list, in rank order.
// Rank s reads only that column, and answers Gloo's get("<r>") with a list that holds its own
// entry where Gloo reads it and zeros elsewhere: about 4 N² addresses in all, N per node but
// rank 0. Should the lists not all be N - 1 entries of one size (another Gloo), rank 0 says so
// in every column ("whole") and every rank reads the whole lists, as before.
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
  // `ranks`: the mesh's size, for fetching whole families (0: every key on its own);
  // `rank`: this node's rank in it.
  PeerStore(std::shared_ptr<RendezvousStore> client, std::string job, std::string prefix, std::chrono::milliseconds timeout,
            bool tcp_addresses, int ranks, int rank);

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
  // What this rank needs of the "<r>" family, once, waiting up to `timeout`: on rank 0 the
  // whole lists (it then publishes the columns); elsewhere its column, or the whole lists when
  // rank 0's column says "whole".
  void fetch_addresses(std::chrono::milliseconds timeout);
  // Rank 0: publishes "col_<s>" for every other rank s from the lists in fetched_, by `deadline`.
  void publish_columns(std::chrono::steady_clock::time_point deadline);
  // Gets the key's family (or, for "<r>", what this rank needs of it) unless it was fetched.
  void ensure(const std::string& family, const std::string& key, std::chrono::milliseconds timeout);

  std::shared_ptr<RendezvousStore> client_;
  std::string job_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  bool tcp_addresses_;
  int ranks_;
  int rank_;
  std::map<std::string, std::string> fetched_;  // key (unscoped) -> value; Gloo calls from one thread
  // From this rank's column: rank r's entry for this rank, keyed by r. Empty on rank 0, and when
  // the lists were fetched whole.
  std::map<std::string, std::string> own_entry_;
  bool addresses_fetched_ = false;
};

}  // namespace gradsync
