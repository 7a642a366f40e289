#include "daemon/peer/key_scope.h"

#include <charconv>

namespace gradsync {
namespace {

constexpr char kReserved = '~';

// The node number a key ends with ("layout/3" -> 3), if it ends with one.
bool trailing_node(const std::string& key, int* node) {
  const size_t slash = key.rfind('/');
  const std::string tail = slash == std::string::npos ? key : key.substr(slash + 1);
  if (tail.empty() || tail.size() > 9) return false;
  const auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), *node);
  return ec == std::errc() && end == tail.data() + tail.size();
}

Status reserved(const std::string& key) {
  return Status::invalid_argument("peer key '" + key + "' uses the reserved character '~'");
}

}  // namespace

bool KeyScope::split_generation(const std::string& key, std::string* generation, std::string* rest) {
  if (key.size() < 3 || key[0] != 'g') return false;
  size_t i = 1;
  while (i < key.size() && i < 12 && key[i] >= '0' && key[i] <= '9') ++i;
  if (i == 1 || i >= key.size() || key[i] != '/') return false;
  *generation = key.substr(0, i + 1);
  *rest = key.substr(i + 1);
  return true;
}

Status KeyScope::check_member(const std::string& job, const std::string& generation, const std::string& key,
                              const std::string& instance) {
  std::string ignored;
  if (!instance.empty() && store_->peek(job, generation + "~member/" + instance, &ignored)) return Status();
  return Status::permission_denied("peer key '" + key + "' of job " + job + ": the calling daemon holds no node of " +
                                   generation.substr(0, generation.size() - 1) +
                                   " (only the job's own daemons may use its keys)");
}

Status KeyScope::may_set(const std::string& job, const std::string& key, const std::string& instance) {
  if (key.find(kReserved) != std::string::npos) return reserved(key);
  std::string generation, rest;
  if (!split_generation(key, &generation, &rest)) {
    return Status::permission_denied("peer key '" + key + "' of job " + job +
                                     " is not one the formation protocol sets");
  }
  int node = 0;
  if (instance.empty()) {
    return Status::permission_denied("peer call without a daemon instance id (x-gradsync-instance); an older "
                                     "gradsyncd? Every node must run the same version");
  }
  if (rest.rfind("node/", 0) == 0 && trailing_node(rest, &node) && rest.find('/', 5) == std::string::npos) {
    // Taking node n of this generation: first come, first served, and idempotent.
    const std::string claim = generation + "~claim/" + std::to_string(node);
    bool stored = false;
    if (Status s = store_->set_if_absent(job, claim, instance, &stored); !s.ok()) return s;
    std::string owner;
    if (!stored && store_->peek(job, claim, &owner) && owner != instance) {
      return Status::permission_denied("node " + std::to_string(node) + " of job " + job + " (" +
                                       generation.substr(0, generation.size() - 1) +
                                       ") was already taken by another daemon");
    }
    return store_->set(job, generation + "~member/" + instance, "1");
  }
  if (Status s = check_member(job, generation, key, instance); !s.ok()) return s;
  if (rest.rfind("group/", 0) == 0 || rest.rfind("cfg/", 0) == 0) return Status();
  if (trailing_node(rest, &node)) {
    std::string owner;
    if (!store_->peek(job, generation + "~claim/" + std::to_string(node), &owner) || owner != instance) {
      return Status::permission_denied("peer key '" + key + "' of job " + job + " belongs to node " +
                                       std::to_string(node) + ", which the calling daemon does not hold");
    }
  }
  return Status();
}

Status KeyScope::may_add(const std::string& job, const std::string& key, int64_t delta, const std::string& instance) {
  if (key.find(kReserved) != std::string::npos) return reserved(key);
  if (delta != 0 && delta != 1) {
    return Status::invalid_argument("peer counter '" + key + "' of job " + job +
                                    ": counters move by 0 or 1, not " + std::to_string(delta));
  }
  if (key == "incarnations") return Status();
  std::string generation, rest;
  if (split_generation(key, &generation, &rest) && (rest == "ended" || rest == "cfg/count")) {
    return check_member(job, generation, key, instance);
  }
  return Status::permission_denied("peer key '" + key + "' of job " + job +
                                   " is not a counter of the formation protocol (incarnations, g<N>/ended, "
                                   "g<N>/cfg/count)");
}

Status KeyScope::may_get(const std::string& job, const std::vector<std::string>& keys, const std::string& instance) {
  for (const std::string& key : keys) {
    if (key.find(kReserved) != std::string::npos) return reserved(key);
    std::string generation, rest;
    if (!split_generation(key, &generation, &rest)) {
      if (key == "incarnations") continue;
      return Status::permission_denied("peer key '" + key + "' of job " + job +
                                       " is not one the formation protocol reads");
    }
    if (Status s = check_member(job, generation, key, instance); !s.ok()) return s;
  }
  return Status();
}

Status KeyScope::may_delete(const std::string& job, const std::string& prefix, const std::string& instance) {
  std::string generation, rest;
  if (!split_generation(prefix, &generation, &rest) || !rest.empty()) {
    return Status::permission_denied("deleting job " + job + "'s keys: only a generation's (prefix g<N>/), not '" +
                                     prefix + "'");
  }
  return check_member(job, generation, prefix, instance);
}

}  // namespace gradsync
