// Many peer daemons pinged at once, for a failure probe's question "which of these answer?"
// (PeerCluster::probe): one deadline for them all, whatever their number, and no thread per
// peer (gRPC's callback API). At most `most_in_flight` pings are open at a time, each a
// connection (freed as its ping ends), so a job of thousands of nodes (or one a hostile store
// made up) cannot take the daemon's descriptors. Pings start only while a quarter of the
// bound is left; a peer whose ping had not started by then is reported as not asked, never as
// silent.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "daemon/peer/peer_auth.h"

namespace gradsync {

enum class PingAnswer {
  kAnswers,   // its daemon answered
  kSilent,    // asked, and no answer within the deadline (gone, frozen, cut off, refused)
  kNotAsked,  // its turn came too late in the bound
};

// One answer per address, in order. Blocks until every ping started has ended (at most a
// moment past `bound`). `auth` proves the pings as PeerClient's are; null: unproven.
std::vector<PingAnswer> ping_all(const std::vector<std::string>& addresses, const std::shared_ptr<const PeerAuth>& auth,
                                 std::chrono::milliseconds bound, size_t most_in_flight = 256);

}  // namespace gradsync
