#include "daemon/engine/nccl/store.h"

#include <sstream>

#include "daemon/util/safe_text.h"

namespace gradsync::nccl {
namespace {

std::string to_hex(const UniqueId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  for (char c : id) {
    const auto byte = static_cast<unsigned char>(c);
    text += kDigits[byte >> 4];
    text += kDigits[byte & 15];
  }
  return text;
}

bool from_hex(const std::string& text, UniqueId* id) {
  if (text.size() != 2 * id->size()) return false;
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < id->size(); ++i) {
    const int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*id)[i] = static_cast<char>(hi * 16 + lo);
  }
  return true;
}

// "<devices> <slot> <slot> ...", one slot per local rank.
bool decode_ranks(const std::string& text, int* devices, std::vector<int>* slots) {
  std::istringstream in(text);
  if (!(in >> *devices) || *devices < 0) return false;
  int slot = 0;
  while (in >> slot) {
    if (slot < -1 || slot >= *devices) return false;
    slots->push_back(slot);
  }
  return in.eof();
}

}  // namespace

int RankPlan::rank_of(int n, int local_rank) const {
  if (n < 0 || static_cast<size_t>(n) >= slot.size()) return -1;
  const auto& slots = slot[static_cast<size_t>(n)];
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= slots.size()) return -1;
  const int s = slots[static_cast<size_t>(local_rank)];
  return s < 0 ? -1 : base[static_cast<size_t>(n)] + s;
}

Status plan_ranks(Rendezvous* rendezvous, const std::string& name, int devices, const std::vector<int>& slots,
                  RankPlan* plan) {
  std::string mine = std::to_string(devices);
  for (int s : slots) mine += " " + std::to_string(s);
  std::vector<std::string> all;
  if (Status status = rendezvous->exchange(name + "/ranks", mine, &all); !status.ok()) return status;
  if (all.size() != static_cast<size_t>(rendezvous->nodes())) {
    return Status::internal("'" + name + "/ranks': " + std::to_string(all.size()) + " values for " +
                            std::to_string(rendezvous->nodes()) + " nodes");
  }
  RankPlan made;
  made.node = rendezvous->node();
  for (size_t n = 0; n < all.size(); ++n) {
    int count = 0;
    std::vector<int> node_slots;
    // A node has at most a GPU per local rank: a count above that is no node's plan (and a sum
    // of such counts could overflow the rank count NCCL is given).
    if (!decode_ranks(all[n], &count, &node_slots) || node_slots.size() != slots.size() ||
        static_cast<size_t>(count) > slots.size()) {
      return Status::protocol("node " + std::to_string(n) + " offered an undecodable GPU plan for '" + name +
                              "': '" + safe_text(all[n], 200) + "'");
    }
    made.base.push_back(made.ranks);
    made.ranks += count;
    made.slot.push_back(std::move(node_slots));
  }
  *plan = std::move(made);
  return Status();
}

std::string reuse_offer(const UniqueId& id, uint64_t collectives) {
  return to_hex(id) + ":" + std::to_string(collectives);
}

Status agree_reuse(Rendezvous* rendezvous, const std::string& name, const std::string& offer, bool* reuse) {
  *reuse = false;
  std::vector<std::string> all;
  if (Status status = rendezvous->exchange(name + "/reuse", offer, &all); !status.ok()) return status;
  std::string common;
  for (const std::string& value : all) {
    if (value.empty()) continue;  // a node without GPUs in the group
    if (value == "fresh" || (!common.empty() && value != common)) return Status();
    common = value;
  }
  *reuse = !common.empty();
  return Status();
}

Status agree_unique_id(Rendezvous* rendezvous, const std::string& name, const RankPlan& plan,
                       const std::function<Status(UniqueId*)>& make, UniqueId* id) {
  // The owner of rank 0 is the first node that brings a GPU.
  int owner = -1;
  for (size_t n = 0; n < plan.base.size() && owner < 0; ++n) {
    const bool brings = (n + 1 < plan.base.size() ? plan.base[n + 1] : plan.ranks) > plan.base[n];
    if (brings) owner = static_cast<int>(n);
  }
  if (owner < 0) return Status::internal("'" + name + "': no node brings a GPU");
  std::string mine;
  if (owner == plan.node) {
    if (Status status = make(id); !status.ok()) return status;
    mine = to_hex(*id);
  }
  std::vector<std::string> all;
  if (Status status = rendezvous->exchange(name + "/id", mine, &all); !status.ok()) return status;
  if (all.size() <= static_cast<size_t>(owner) || !from_hex(all[static_cast<size_t>(owner)], id)) {
    return Status::protocol("node " + std::to_string(owner) + " offered an undecodable NCCL unique id for '" + name +
                            "'");
  }
  return Status();
}

}  // namespace gradsync::nccl
