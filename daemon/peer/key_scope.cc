#include "daemon/peer/key_scope.h"

namespace gradsync {
namespace {

constexpr char kReserved = '~';
constexpr uint64_t kMaxGeneration = 1'000'000'000;
constexpr uint64_t kMaxNode = 65'535;

// A decimal number as the protocol writes one: digits only, no leading zero, at most `max`.
bool parse_number(const std::string& text, uint64_t max, uint64_t* out) {
  if (text.empty() || text.size() > 10 || (text.size() > 1 && text[0] == '0')) return false;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > max) return false;
  *out = value;
  return true;
}

// "g<N>/" of `key`, N, and the rest, or false when the key is not in a generation.
bool split_generation(const std::string& key, std::string* generation, uint64_t* number, std::string* rest) {
  if (key.size() < 3 || key[0] != 'g') return false;
  const size_t slash = key.find('/');
  if (slash == std::string::npos || !parse_number(key.substr(1, slash - 1), kMaxGeneration, number)) return false;
  *generation = key.substr(0, slash + 1);
  *rest = key.substr(slash + 1);
  return true;
}

// The node number a key ends with ("set/1/layout/3" -> 3), if it ends with one.
bool trailing_node(const std::string& key, int* node) {
  const size_t slash = key.rfind('/');
  uint64_t value = 0;
  if (!parse_number(slash == std::string::npos ? key : key.substr(slash + 1), kMaxNode, &value)) return false;
  *node = static_cast<int>(value);
  return true;
}

// "cfg/<k>": a numbered settings change.
bool is_setting(const std::string& rest) {
  uint64_t k = 0;
  return rest.rfind("cfg/", 0) == 0 && parse_number(rest.substr(4), UINT64_MAX / 10, &k);
}

Status reserved(const std::string& key) {
  return Status::invalid_argument("peer key '" + key + "' uses the reserved character '~'");
}

std::string name_of(const std::string& generation) { return generation.substr(0, generation.size() - 1); }

// Who holds a node: the daemon instance and the identity it called as (kv_store.h: its
// certificate, or the node its token proofs declare). Both must match for the node's keys;
// the instance alone is no identity, since any member that learns one (a plain-text call
// carries it) could send it.
std::string holder_of(const std::string& instance, const StoreMember& member) {
  return instance + "\n" + member.identity;
}

}  // namespace

Status KeyScope::check_member(const std::string& job, const std::string& generation, const std::string& key,
                              const std::string& instance, const StoreMember& member) {
  std::string took_as;
  if (!instance.empty() && store_->peek(job, generation + "~member/" + instance, &took_as)) {
    if (took_as == member.identity) return Status();
    return Status::permission_denied("peer key '" + key + "' of job " + job + ": the calling daemon's instance id " +
                                     "took its node of " + name_of(generation) + " as '" + took_as +
                                     "', and now calls as '" + member.identity + "' (a node's place is bound to the "
                                     "identity that took it)");
  }
  return Status::permission_denied("peer key '" + key + "' of job " + job + ": the calling daemon holds no node of " +
                                   name_of(generation) + " (only the job's own daemons may use its keys)");
}

Status KeyScope::claim(const std::string& job, const std::string& generation, uint64_t number, int node,
                       const std::string& instance, const StoreMember& member) {
  const std::string where = "node " + std::to_string(node) + " of job " + job + " (" + name_of(generation) + ")";
  // A generation exists once enough nodes have counted an incarnation: never ahead of the count.
  std::string count;
  uint64_t incarnations = 0;
  if (!store_->peek(job, "incarnations", &count) || !parse_number(count, UINT64_MAX / 10, &incarnations) ||
      number >= incarnations) {
    return Status::permission_denied(where + ": that generation has not begun (incarnations " +
                                     (count.empty() ? std::string("unset") : count) + ")");
  }
  if (lookup_) {
    if (const auto local = lookup_(job)) {
      // Every node counts each incarnation once: generation N begins with count N * nodes + 1.
      // Both bounds come from this daemon's node count (world size / its local world size): a
      // claimant that counts differently most likely runs another local world size, which is
      // then the cause worth naming.
      const std::string cause = "; this daemon's part of the job has " + std::to_string(local->nodes) +
                                " nodes: if the job has another node count, the nodes' local world sizes differ";
      if (local->nodes > 0 && number > (incarnations - 1) / static_cast<uint64_t>(local->nodes)) {
        return Status::permission_denied(where + ": that generation has not begun (incarnations " + count + ")" + cause);
      }
      if (node >= local->nodes) {
        return Status::permission_denied(where + ": the job has " + std::to_string(local->nodes) + " nodes" + cause);
      }
      if (node == 0 && !local->node0_instance.empty() && instance != local->node0_instance) {
        return Status::permission_denied(where + " is the rendezvous daemon's own");
      }
    }
  }
  // An instance holds one identity in a generation: checked before anything is taken, so a
  // refused call leaves no claim behind.
  const std::string membership = generation + "~member/" + instance;
  std::string took_as;
  const bool member_already = store_->peek(job, membership, &took_as);
  if (member_already && took_as != member.identity) {
    return check_member(job, generation, generation + "node/" + std::to_string(node), instance, member);
  }
  // First come, first served, and idempotent for the taker.
  const std::string key = generation + "~claim/" + std::to_string(node);
  const std::string holder = holder_of(instance, member);
  bool stored = false;
  if (Status s = store_->set_if_absent(job, key, holder, &stored, member); !s.ok()) return s;
  std::string owner;
  if (!stored && store_->peek(job, key, &owner) && owner != holder) {
    return Status::permission_denied(where + " was already taken by another daemon");
  }
  if (member_already) return Status();
  return store_->set(job, membership, member.identity, member);
}

Status KeyScope::may_set(const std::string& job, const std::string& key, bool if_absent, const std::string& instance,
                         const StoreMember& member) {
  if (key.find(kReserved) != std::string::npos) return reserved(key);
  std::string generation, rest;
  uint64_t number = 0;
  if (!split_generation(key, &generation, &number, &rest)) {
    return Status::permission_denied("peer key '" + key + "' of job " + job +
                                     " is not one the formation protocol sets");
  }
  if (instance.empty()) {
    return Status::permission_denied("peer call without a daemon instance id; every node must run a "
                                     "gradsyncd of the same cross-node protocol");
  }
  int node = 0;
  if (rest.rfind("node/", 0) == 0 && trailing_node(rest, &node) && rest == "node/" + std::to_string(node)) {
    return claim(job, generation, number, node, instance, member);
  }
  if (Status s = check_member(job, generation, key, instance, member); !s.ok()) return s;
  if (rest == "ended" || rest == "cfg/count") {
    return Status::permission_denied("peer counter '" + key + "' of job " + job + " changes by add only");
  }
  if (is_setting(rest)) {
    if (!if_absent) {
      return Status::permission_denied("peer key '" + key + "' of job " + job +
                                       ": a settings change is published once (set-if-absent)");
    }
    return Status();
  }
  if (rest.rfind("group/", 0) == 0) {
    // Gloo sets each of its keys once; a second, different value is someone else's.
    std::string existing;
    if (store_->peek(job, key, &existing)) {
      return Status::permission_denied("peer key '" + key + "' of job " + job + " is already set");
    }
    return Status();
  }
  if (trailing_node(rest, &node)) {
    std::string owner;
    if (!store_->peek(job, generation + "~claim/" + std::to_string(node), &owner) ||
        owner != holder_of(instance, member)) {
      return Status::permission_denied("peer key '" + key + "' of job " + job + " belongs to node " +
                                       std::to_string(node) + ", which the calling daemon does not hold");
    }
    return Status();
  }
  return Status::permission_denied("peer key '" + key + "' of job " + job + " is not one the formation protocol sets");
}

Status KeyScope::may_add(const std::string& job, const std::string& key, int64_t delta, const std::string& instance,
                         const StoreMember& member) {
  if (key.find(kReserved) != std::string::npos) return reserved(key);
  if (delta != 0 && delta != 1) {
    return Status::invalid_argument("peer counter '" + key + "' of job " + job +
                                    ": counters move by 0 or 1, not " + std::to_string(delta));
  }
  if (key == "incarnations") return Status();
  std::string generation, rest;
  uint64_t number = 0;
  if (!split_generation(key, &generation, &number, &rest) || (rest != "ended" && rest != "cfg/count")) {
    return Status::permission_denied("peer key '" + key + "' of job " + job +
                                     " is not a counter of the formation protocol (incarnations, g<N>/ended, "
                                     "g<N>/cfg/count)");
  }
  if (Status s = check_member(job, generation, key, instance, member); !s.ok()) return s;
  if (rest == "ended" && delta == 1) {
    bool stored = false;
    if (Status s = store_->set_if_absent(job, generation + "~ended/" + instance, "1", &stored, member); !s.ok()) {
      return s;
    }
    if (!stored) {
      return Status::permission_denied("peer counter '" + key + "' of job " + job +
                                       ": the calling daemon has counted its end already");
    }
  }
  return Status();
}

void KeyScope::undo_add(const std::string& job, const std::string& key, int64_t delta, const std::string& instance) {
  std::string generation, rest;
  uint64_t number = 0;
  if (delta == 1 && split_generation(key, &generation, &number, &rest) && rest == "ended") {
    store_->erase(job, generation + "~ended/" + instance);
  }
}

Status KeyScope::may_get(const std::string& job, const std::vector<std::string>& keys, const std::string& instance,
                         const StoreMember& member) {
  for (const std::string& key : keys) {
    if (key.find(kReserved) != std::string::npos) return reserved(key);
    std::string generation, rest;
    uint64_t number = 0;
    if (!split_generation(key, &generation, &number, &rest)) {
      if (key == "incarnations") continue;
      return Status::permission_denied("peer key '" + key + "' of job " + job +
                                       " is not one the formation protocol reads");
    }
    if (Status s = check_member(job, generation, key, instance, member); !s.ok()) return s;
  }
  return Status();
}

Status KeyScope::may_delete(const std::string& job, const std::string& prefix, const std::string& instance,
                            const StoreMember& member) {
  std::string generation, rest;
  uint64_t number = 0;
  if (!split_generation(prefix, &generation, &number, &rest) || !rest.empty()) {
    return Status::permission_denied("deleting job " + job + "'s keys: only a generation's (prefix g<N>/), not '" +
                                     prefix + "'");
  }
  if (Status s = check_member(job, generation, prefix, instance, member); !s.ok()) return s;
  // Only once every node that took a place has ended: nobody deletes a running generation.
  const size_t taken = store_->count_prefix(job, generation + "~claim/");
  const size_t ended = store_->count_prefix(job, generation + "~ended/");
  std::string mine;
  if (!store_->peek(job, generation + "~ended/" + instance, &mine) || ended < taken) {
    return Status::permission_denied("deleting " + name_of(generation) + " of job " + job + ": " +
                                     std::to_string(ended) + " of its " + std::to_string(taken) +
                                     " nodes have ended (all must, the caller included)");
  }
  return Status();
}

}  // namespace gradsync
