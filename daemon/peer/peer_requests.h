// The peer store's side of each peer call, once the caller is authenticated: what the key
// scope allows (key_scope.h), then the store. PeerService answers gRPC calls with these, and the
// peer store fuzzer drives them directly (tests/fuzz/peer_store_fuzzer.cc).
#pragma once

#include <string>

#include "daemon/peer/key_scope.h"
#include "daemon/peer/kv_store.h"
#include "proto/peer.pb.h"
#include "shared/status.h"

namespace gradsync {

// Who calls: the calling daemon's instance id for the job (key_scope.h; empty when the call
// carried none), and the member the store's quotas charge (kv_store.h).
struct PeerCaller {
  std::string instance;
  StoreMember member;
};

Status serve_set(KvStore& store, KeyScope& scope, const peer::SetRequest& request, const PeerCaller& caller,
                 peer::SetReply* reply);
Status serve_add(KvStore& store, KeyScope& scope, const peer::AddRequest& request, const PeerCaller& caller,
                 peer::AddReply* reply);
Status serve_delete(KvStore& store, KeyScope& scope, const peer::DeleteJobRequest& request, const PeerCaller& caller,
                    peer::DeleteJobReply* reply);
// A get is answered by the store (it may wait); this is whether it may be asked at all.
Status check_get(KeyScope& scope, const peer::GetRequest& request, const PeerCaller& caller);

}  // namespace gradsync
