// A node's formation record at the rendezvous: what every node of a multi-node job publishes
// about itself before the job forms, and checks of every other node's.
//
// Text form: "<local world size> <peer address> <cross-node protocol> <gradsyncd version>",
// space-separated. gradsyncd before 0.2.1 wrote the first two fields only. A later protocol may
// change the first two or add fields after the fourth, but must keep the protocol third (decimal,
// at most 10 digits, within 32 bits, not 0) and the version fourth ([0-9A-Za-z.+-], 1 to 32
// bytes), so that any two versions can name each other.
//
// A record comes from another daemon (any holder of the cluster token), so parse() accepts only
// what a gradsyncd writes: it is shown in errors that reach logs, clients and the admin service.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gradsync {

struct NodeRecord {
  int local_world_size = 0;
  std::string address;   // host:port of the node's peer service, printable ASCII
  uint32_t protocol = 0; // 0: not stated (before 0.2.1)
  std::string version;   // empty when the protocol is not stated

  // This daemon's record.
  static NodeRecord mine(int local_world_size, std::string address);
  std::string encode() const;
  // std::nullopt for anything a gradsyncd would not have written. A record of another protocol
  // carries only its protocol, version and (when printable) address.
  static std::optional<NodeRecord> parse(std::string_view text);
  // "gradsyncd 0.2.1 (cross-node protocol 1)", or, not stated, "a gradsyncd older than 0.2.1
  // (cross-node protocol not stated)".
  std::string describe_version() const;
};

}  // namespace gradsync
