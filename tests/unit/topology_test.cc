// The job topology: node-major rank numbering, the checks make_topology applies to the node
// layout and to declared process groups, and the per-node views of a group.
#include "daemon/model/topology.h"

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

namespace gradsync {
namespace {

using Groups = std::map<std::string, std::vector<int>>;

// make_topology that must succeed.
Topology topology_of(int world_size, int local_world_size, int rank, const Groups& declared = {}) {
  Topology topology;
  const Status status = make_topology(world_size, local_world_size, rank, rank % local_world_size, declared, &topology);
  INFO(status.to_string());
  REQUIRE(status.ok());
  return topology;
}

// make_topology that must fail; returns its status.
Status refusal_of(int world_size, int local_world_size, int rank, int local_rank, const Groups& declared = {}) {
  Topology topology;
  const Status status = make_topology(world_size, local_world_size, rank, local_rank, declared, &topology);
  REQUIRE_FALSE(status.ok());
  CHECK(status.code() == ErrorCode::kInvalidArgument);
  return status;
}

TEST_CASE("ranks are numbered node-major", "[topology]") {
  // 3 nodes of 4: rank 6 is local rank 2 of node 1.
  const Topology t = topology_of(12, 4, 6);
  CHECK(t.world_size == 12);
  CHECK(t.local_world_size == 4);
  CHECK(t.node == 1);
  CHECK(t.nodes == 3);
  CHECK(t.rank_of(0) == 4);
  CHECK(t.rank_of(2) == 6);
  CHECK(t.rank_of(3) == 7);

  const Topology last = topology_of(12, 4, 11);
  CHECK(last.node == 2);
  CHECK(last.rank_of(0) == 8);

  const Topology single = topology_of(4, 4, 0);
  CHECK(single.node == 0);
  CHECK(single.nodes == 1);
}

TEST_CASE("a world size that is not a multiple of the local world size is refused", "[topology]") {
  const Status status = refusal_of(10, 4, 0, 0);
  CHECK_THAT(status.message(), Catch::Contains("10") && Catch::Contains("4"));
}

TEST_CASE("a rank whose local rank does not fit node-major numbering is refused", "[topology]") {
  // Rank 5 of 2-rank nodes is local rank 1, not 0.
  const Status status = refusal_of(8, 2, 5, 0);
  CHECK_THAT(status.message(), Catch::Contains("rank 5") && Catch::Contains("local rank 0"));
}

TEST_CASE("topology: 'dp' holds every rank without being declared", "[topology]") {
  const Topology t = topology_of(6, 2, 3);
  REQUIRE(t.has_group(kDefaultGroup));
  CHECK(t.ranks(kDefaultGroup) == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(t.groups.size() == 1);

  // Declared groups come on top of it.
  const Topology with_group = topology_of(6, 2, 3, {{"tp", {2, 3}}});
  CHECK(with_group.ranks(kDefaultGroup) == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(with_group.has_group("tp"));
  CHECK_FALSE(with_group.has_group("pp"));
}

TEST_CASE("topology: 'dp' cannot be declared", "[topology]") {
  const Status status = refusal_of(4, 2, 0, 0, {{"dp", {0, 1}}});
  CHECK_THAT(status.message(), Catch::Contains("'dp'") && Catch::Contains("reserved"));
}

TEST_CASE("declared group ranks are kept sorted", "[topology]") {
  const Topology t = topology_of(8, 2, 0, {{"odd", {7, 1, 5, 3}}, {"pair", {6, 0}}});
  CHECK(t.ranks("odd") == std::vector<int>{1, 3, 5, 7});
  CHECK(t.ranks("pair") == std::vector<int>{0, 6});
}

TEST_CASE("a group naming a rank outside the world is refused, naming it", "[topology]") {
  const Status above = refusal_of(4, 2, 0, 0, {{"g", {0, 4}}});
  CHECK_THAT(above.message(), Catch::Contains("'g'") && Catch::Contains("rank 4") && Catch::Contains("world size 4"));

  const Status below = refusal_of(4, 2, 0, 0, {{"neg", {-1, 2}}});
  CHECK_THAT(below.message(), Catch::Contains("'neg'") && Catch::Contains("rank -1"));
}

TEST_CASE("a group naming a rank twice is refused, naming it", "[topology]") {
  const Status status = refusal_of(8, 2, 0, 0, {{"twice", {3, 5, 3}}});
  CHECK_THAT(status.message(), Catch::Contains("'twice'") && Catch::Contains("rank 3 twice"));
}

TEST_CASE("an empty group is refused", "[topology]") {
  const Status status = refusal_of(4, 2, 0, 0, {{"empty", {}}});
  CHECK_THAT(status.message(), Catch::Contains("'empty'"));
}

TEST_CASE("group names of 1 to 64 characters are accepted, others refused", "[topology]") {
  topology_of(4, 2, 0, {{std::string(64, 'n'), {0}}});
  refusal_of(4, 2, 0, 0, {{std::string(65, 'n'), {0}}});
  refusal_of(4, 2, 0, 0, {{"", {0}}});
}

TEST_CASE("group names of letters, digits, '-', '_' and '.' are accepted", "[topology]") {
  const Topology t = topology_of(4, 2, 0, {{"tp-0.a_b", {0, 1}}, {"Z9", {2}}});
  CHECK(t.has_group("tp-0.a_b"));
  CHECK(t.has_group("Z9"));
}

// Group names go into whitespace-separated layout text and into peer-store keys
// ("group/<name>/"), so any other character is refused, naming the group and the allowed set.
TEST_CASE("a group name with a character outside [A-Za-z0-9._-] is refused, naming it", "[topology]") {
  const std::string name = GENERATE(as<std::string>{}, "tp 0", "tp/0", "tp\n0", "tp\t0", "t\xc3\xa9", "tp:0");
  const Status status = refusal_of(4, 2, 0, 0, {{name, {0}}});
  CHECK_THAT(status.message(), Catch::Contains("'" + name + "'") && Catch::Contains("letters, digits, '-', '_' and '.'"));
}

TEST_CASE("an empty group name is refused, saying what a name may hold", "[topology]") {
  const Status status = refusal_of(4, 2, 0, 0, {{"", {0}}});
  CHECK_THAT(status.message(), Catch::Contains("''") && Catch::Contains("1 to 64") &&
                                   Catch::Contains("letters, digits, '-', '_' and '.'"));
}

TEST_CASE("a group spanning nodes 0 and 2 of 3 has members on those nodes only", "[topology]") {
  // 3 nodes of 2 ranks: node 0 = {0, 1}, node 1 = {2, 3}, node 2 = {4, 5}.
  const Groups declared{{"g", {5, 0, 1}}};
  const Topology node0 = topology_of(6, 2, 1, declared);
  const Topology node1 = topology_of(6, 2, 2, declared);
  const Topology node2 = topology_of(6, 2, 4, declared);

  for (const Topology* t : {&node0, &node1, &node2}) {
    CHECK(t->nodes_of("g") == std::vector<int>{0, 2});
    CHECK(t->nodes_of(kDefaultGroup) == std::vector<int>{0, 1, 2});
  }
  CHECK(node0.local_members("g") == std::vector<int>{0, 1});
  CHECK(node1.local_members("g").empty());
  CHECK(node2.local_members("g") == std::vector<int>{1});
  CHECK(node1.local_members(kDefaultGroup) == std::vector<int>{0, 1});
}

TEST_CASE("a group on one node has that node only and no members elsewhere", "[topology]") {
  // 2 nodes of 4 ranks; the group is ranks 5 and 7, local ranks 1 and 3 of node 1.
  const Groups declared{{"local", {7, 5}}};
  const Topology node0 = topology_of(8, 4, 0, declared);
  const Topology node1 = topology_of(8, 4, 6, declared);

  CHECK(node0.nodes_of("local") == std::vector<int>{1});
  CHECK(node1.nodes_of("local") == std::vector<int>{1});
  CHECK(node0.local_members("local").empty());
  CHECK(node1.local_members("local") == std::vector<int>{1, 3});
}

}  // namespace
}  // namespace gradsync
