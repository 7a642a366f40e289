// The cluster token's proofs (daemon/peer/token_proof.h): the token itself never travels; a
// proof is good once, for its method, instance and request, within the clock window.
#include <catch2/catch.hpp>

#include "daemon/peer/token_proof.h"
#include "proto/peer.pb.h"

namespace gradsync {

TEST_CASE("token proof: good once, for exactly its call, within the window, the token never in it", "[proof]") {
  const std::string token = "0123456789abcdef0123456789abcdef-cluster";
  peer::SetRequest request;
  request.set_job("0.job");
  request.set_key("g0/node/1");
  request.set_value("2 node1:29590");
  const std::string proof = make_proof(token, "Set", "inst", request);
  CHECK(proof.find(token) == std::string::npos);
  const auto now = std::chrono::system_clock::now();

  ProofChecker checker(token);
  CHECK(checker.check_value(proof, "Set", "inst", request, now).ok());
  CHECK_THAT(checker.check_value(proof, "Set", "inst", request, now).error_message(), Catch::Contains("replays"));

  ProofChecker fresh(token);
  peer::SetRequest changed = request;
  changed.set_value("2 evil:1");
  CHECK_THAT(fresh.check_value(proof, "Set", "inst", changed, now).error_message(), Catch::Contains("does not match"));
  CHECK_FALSE(fresh.check_value(proof, "Add", "inst", request, now).ok());
  CHECK_FALSE(fresh.check_value(proof, "Set", "other", request, now).ok());
  // The window holds both ways: a proof too old, and one from too far ahead of this clock
  // (a sender whose clock runs fast), each refused; just inside either edge, accepted.
  CHECK_THAT(fresh.check_value(proof, "Set", "inst", request, now + std::chrono::minutes(5)).error_message(),
             Catch::Contains("from this node's clock"));
  CHECK_THAT(fresh.check_value(proof, "Set", "inst", request, now - std::chrono::minutes(5)).error_message(),
             Catch::Contains("from this node's clock"));
  CHECK_FALSE(fresh.check_value(proof, "Set", "inst", request, now + kProofWindow + std::chrono::seconds(2)).ok());
  CHECK_FALSE(fresh.check_value(proof, "Set", "inst", request, now - kProofWindow - std::chrono::seconds(2)).ok());
  CHECK(ProofChecker(token).check_value(proof, "Set", "inst", request, now + kProofWindow - std::chrono::seconds(2)).ok());
  CHECK(ProofChecker(token).check_value(proof, "Set", "inst", request, now - kProofWindow + std::chrono::seconds(2)).ok());
  CHECK_THAT(ProofChecker("another token of the right length!!").check_value(proof, "Set", "inst", request, now)
                 .error_message(),
             Catch::Contains("does not match"));
  CHECK_THAT(fresh.check_value("v1 garbage", "Set", "inst", request, now).error_message(), Catch::Contains("malformed"));
  CHECK(fresh.check_value(proof, "Set", "inst", request, now).ok());  // still unused there
  CHECK(ProofChecker("").check_value("", "Set", "", request, now).ok());  // no token configured
}

}  // namespace gradsync
