// The cluster token's proofs (daemon/peer/token_proof.h): the token itself never travels; a
// proof is good once, for its method, callee, node, instance and request, within the clock
// window.
#include <catch2/catch.hpp>

#include "daemon/peer/token_proof.h"
#include "proto/peer.pb.h"

namespace gradsync {

namespace {

// Checks `proof` at a fresh checker of `token` for the daemon process `callee`.
grpc::Status check(const std::string& token, const std::string& callee, const std::string& proof,
                   std::string_view method, const std::string& instance, const google::protobuf::Message& request,
                   std::chrono::system_clock::time_point now, std::string* node = nullptr) {
  std::string named;
  return ProofChecker(token, callee).check_value(proof, method, instance, request, now, node ? node : &named);
}

}  // namespace

TEST_CASE("token proof: good once, for exactly its call, within the window, the token never in it", "[proof]") {
  const std::string token = "0123456789abcdef0123456789abcdef-cluster";
  peer::SetRequest request;
  request.set_job("0.job");
  request.set_key("g0/node/1");
  request.set_value("2 node1:29590");
  const std::string proof = make_proof(token, "Set", ProofScope{"callee-a", "node1:29590", "inst"}, request);
  CHECK(proof.find(token) == std::string::npos);
  const auto now = std::chrono::system_clock::now();

  ProofChecker checker(token, "callee-a");
  std::string node;
  CHECK(checker.check_value(proof, "Set", "inst", request, now, &node).ok());
  CHECK(node == "node1:29590");
  CHECK_THAT(checker.check_value(proof, "Set", "inst", request, now, &node).error_message(), Catch::Contains("replays"));

  peer::SetRequest changed = request;
  changed.set_value("2 evil:1");
  CHECK_THAT(check(token, "callee-a", proof, "Set", "inst", changed, now).error_message(), Catch::Contains("does not match"));
  CHECK_FALSE(check(token, "callee-a", proof, "Add", "inst", request, now).ok());
  CHECK_FALSE(check(token, "callee-a", proof, "Set", "other", request, now).ok());
  // The window holds both ways: a proof too old, and one from too far ahead of this clock
  // (a sender whose clock runs fast), each refused; just inside either edge, accepted.
  CHECK_THAT(check(token, "callee-a", proof, "Set", "inst", request, now + std::chrono::minutes(5)).error_message(),
             Catch::Contains("from this node's clock"));
  CHECK_THAT(check(token, "callee-a", proof, "Set", "inst", request, now - std::chrono::minutes(5)).error_message(),
             Catch::Contains("from this node's clock"));
  CHECK_FALSE(check(token, "callee-a", proof, "Set", "inst", request, now + kProofWindow + std::chrono::seconds(2)).ok());
  CHECK_FALSE(check(token, "callee-a", proof, "Set", "inst", request, now - kProofWindow - std::chrono::seconds(2)).ok());
  CHECK(check(token, "callee-a", proof, "Set", "inst", request, now + kProofWindow - std::chrono::seconds(2)).ok());
  CHECK(check(token, "callee-a", proof, "Set", "inst", request, now - kProofWindow + std::chrono::seconds(2)).ok());
  CHECK_THAT(check("another token of the right length!!", "callee-a", proof, "Set", "inst", request, now).error_message(),
             Catch::Contains("does not match"));
  CHECK_THAT(check(token, "callee-a", "v2 garbage", "Set", "inst", request, now).error_message(),
             Catch::Contains("malformed"));
  CHECK(check("", "callee-a", "", "Set", "", request, now).ok());  // no token configured
}

// The review's replay: a proof captured on its way to one daemon, sent to another of the same
// cluster, is refused there; the node it names cannot be changed on the way.
TEST_CASE("token proof: bound to the daemon process it was made for, and to the node it names", "[proof]") {
  const std::string token = "0123456789abcdef0123456789abcdef-cluster";
  peer::AddRequest request;
  request.set_job("0.job");
  request.set_key("incarnations");
  request.set_delta(1);
  const auto now = std::chrono::system_clock::now();
  const std::string proof = make_proof(token, "Add", ProofScope{"callee-a", "node1:1", "inst"}, request);
  CHECK_THAT(check(token, "callee-b", proof, "Add", "inst", request, now).error_message(),
             Catch::Contains("made for another gradsyncd"));
  CHECK_THAT(check(token, "", proof, "Add", "inst", request, now).error_message(), Catch::Contains("does not match"));
  CHECK(check(token, "callee-a", proof, "Add", "inst", request, now).ok());
  std::string forged = proof;
  forged.replace(forged.find("node1:1"), 7, "node2:1");
  CHECK_THAT(check(token, "callee-a", forged, "Add", "inst", request, now).error_message(),
             Catch::Contains("does not match"));
  // Only a Ping is made for any callee: it is how a caller learns the callee's id.
  peer::PingRequest ping;
  const std::string any = make_proof(token, "Ping", ProofScope{"", "node1:1", ""}, ping);
  CHECK(check(token, "callee-b", any, "Ping", "", ping, now).ok());
  const std::string set_for_any = make_proof(token, "Add", ProofScope{"", "node1:1", "inst"}, request);
  CHECK_FALSE(check(token, "callee-a", set_for_any, "Add", "inst", request, now).ok());
  // A proof of the first kind (gradsyncd before 0.2.4) is refused, saying so.
  CHECK_THAT(check(token, "callee-a", "v1 1 0123456789abcdef0123456789abcdef 00", "Add", "inst", request, now)
                 .error_message(),
             Catch::Contains("before 0.2.4"));
}

}  // namespace gradsync
