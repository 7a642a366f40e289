#include "daemon/peer/peer_requests.h"

#include <vector>

namespace gradsync {

Status serve_set(KvStore& store, KeyScope& scope, const peer::SetRequest& request, const PeerCaller& caller,
                 peer::SetReply* reply) {
  // Room first, for the key and the claim and membership a node's record may take with it: a
  // member at its quota must not leave a claim (or anything) behind.
  if (Status s = store.check_room(caller.member, request.key().size() + request.value().size() + 128, 3); !s.ok()) {
    return s;
  }
  if (Status s = scope.may_set(request.job(), request.key(), request.if_absent(), caller.instance, caller.member);
      !s.ok()) {
    return s;
  }
  if (request.if_absent()) {
    bool stored = false;
    Status status = store.set_if_absent(request.job(), request.key(), request.value(), &stored, caller.member);
    reply->set_stored(stored);
    return status;
  }
  reply->set_stored(true);
  return store.set(request.job(), request.key(), request.value(), caller.member);
}

Status serve_add(KvStore& store, KeyScope& scope, const peer::AddRequest& request, const PeerCaller& caller,
                 peer::AddReply* reply) {
  // Room first, for the counter and the end marker an "ended" takes with it.
  if (Status s = store.check_room(caller.member, request.key().size() + 20 + 64, 2); !s.ok()) return s;
  if (Status s = scope.may_add(request.job(), request.key(), request.delta(), caller.instance, caller.member);
      !s.ok()) {
    return s;
  }
  int64_t value = 0;
  Status status = store.add(request.job(), request.key(), request.delta(), &value, caller.member);
  // Not counted after all: the scope's marker goes too, so that the node may count again.
  if (!status.ok()) scope.undo_add(request.job(), request.key(), request.delta(), caller.instance);
  reply->set_value(value);
  return status;
}

Status serve_delete(KvStore& store, KeyScope& scope, const peer::DeleteJobRequest& request, const PeerCaller& caller,
                    peer::DeleteJobReply* reply) {
  if (Status s = scope.may_delete(request.job(), request.prefix(), caller.instance, caller.member); !s.ok()) return s;
  reply->set_removed(store.delete_job(request.job(), request.prefix()));
  return Status();
}

Status check_get(KeyScope& scope, const peer::GetRequest& request, const PeerCaller& caller) {
  return scope.may_get(request.job(), std::vector<std::string>(request.keys().begin(), request.keys().end()),
                       caller.instance, caller.member);
}

}  // namespace gradsync
