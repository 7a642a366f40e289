// node_parts (daemon/model/tensor_set.h): a reduce-scatter bucket's stretch per node of its group,
// against an element-by-element count from the shard layout (shared/shard.h), and the property
// the engine's reduce_scatter relies on: in canonical order each node's elements are one
// stretch, node after node.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <vector>

#include "daemon/model/tensor_set.h"

namespace gradsync {
namespace {

struct Case {
  int nodes = 3, local = 2;
  std::vector<uint64_t> numels;
  uint64_t bucket_cap = 0;
  std::vector<int> group;  // empty: "dp"
};

void check(const Case& k) {
  Topology topology;
  std::map<std::string, std::vector<int>> declared;
  if (!k.group.empty()) declared["g"] = k.group;
  REQUIRE(make_topology(k.nodes * k.local, k.local, 0, 0, declared, &topology).ok());
  const std::string group = k.group.empty() ? kDefaultGroup : "g";
  TensorSet set;
  set.bucket_cap = k.bucket_cap;
  uint64_t total = 0;
  for (uint64_t n : k.numels) {
    set.layout.push_back(plan::TensorLayout{DType::kFloat32, n, group});
    total += n;
  }
  std::vector<std::vector<float>> memory(static_cast<size_t>(k.local), std::vector<float>(total + 1));
  std::vector<float> shards(total + 1);
  for (auto& m : memory) {
    std::vector<std::byte*> addresses;
    uint64_t at = 0;
    for (uint64_t n : k.numels) {
      addresses.push_back(reinterpret_cast<std::byte*>(m.data() + at));
      at += n;
    }
    set.address.push_back(addresses);
    set.shard_output.push_back(reinterpret_cast<std::byte*>(shards.data()));
  }
  complete_tensor_set(&set, topology);
  const std::vector<int>& ranks = topology.ranks(group);
  const std::vector<int> nodes = topology.nodes_of(group);
  const uint64_t capacity = shard_capacity(total, ranks.size());
  for (size_t b = 0; b < set.plan.buckets.size(); ++b) {
    INFO("bucket " << b);
    const std::vector<uint64_t> parts = node_parts(set, b, topology);
    REQUIRE(parts.size() == nodes.size());
    // Element by element, in canonical order: the node whose rank owns its shard.
    std::vector<uint32_t> tensors = set.plan.buckets[b].tensors;
    std::sort(tensors.begin(), tensors.end());
    std::vector<uint64_t> counted(nodes.size(), 0);
    size_t last = 0;
    for (uint32_t t : tensors) {
      for (uint64_t e = 0; e < set.layout[t].numel; ++e) {
        const uint64_t position = (set.flat_offset[t] + e) / capacity;
        const int node = ranks[position] / topology.local_world_size;
        const size_t index = static_cast<size_t>(std::find(nodes.begin(), nodes.end(), node) - nodes.begin());
        REQUIRE(index >= last);  // one stretch per node, node after node
        last = index;
        ++counted[index];
      }
    }
    CHECK(parts == counted);
  }
}

}  // namespace

TEST_CASE("node parts: each node's stretch of a reduce-scatter bucket, one after another", "[unit][node_parts]") {
  // 70,520 elements over 6 ranks on 3 nodes, one bucket and buckets cutting the shards.
  check(Case{3, 2, {3, 70'000, 517}, 0, {}});
  check(Case{3, 2, {3, 70'000, 517}, 4096, {}});
  check(Case{3, 2, {100'003, 70'001}, 262'144, {}});
  // A group of rank 1 (node 0) and rank 4 (node 2): node 1 hosts none of its ranks.
  check(Case{3, 2, {9'999, 2}, 4096, {1, 4}});
  // Fewer elements than ranks: the last ranks' shards, and so a whole node's, are empty.
  check(Case{4, 2, {3, 2}, 0, {}});
  // One node with every rank, and one rank per node.
  check(Case{1, 4, {1000, 7}, 0, {}});
  check(Case{5, 1, {12'345}, 8192, {}});
}

TEST_CASE("node parts: a bucket crosses as parts only where no node receives more than a ring gives it",
          "[unit][node_parts]") {
  CHECK(node_parts_even({5, 5}));
  CHECK(node_parts_even({10, 0}));  // 2 nodes: (N - 1) x 10 = 10 <= 2 (N - 1) / N x 10
  CHECK(node_parts_even({4, 4, 4}));
  CHECK(node_parts_even({6, 3, 0}));  // at the bound: 3 x 6 == 2 x 9
  CHECK_FALSE(node_parts_even({7, 2, 0}));
  CHECK_FALSE(node_parts_even({0, 7, 0}));
  CHECK(node_parts_even({16'674, 13'337, 16'670, 1}));  // 4 x 16674 <= 2 x 46682
  CHECK_FALSE(node_parts_even({20, 1, 1, 1}));          // 4 x 20 > 2 x 23
  CHECK(node_parts_even({16'674, 13'337, 0}));
  CHECK(node_parts_even({0, 0}));    // an empty bucket: no call on any node either way
  CHECK_FALSE(node_parts_even({9}));  // one node: nothing crosses
}

}  // namespace gradsync
