// The cluster token never leaves the daemon. Each peer call carries a proof made with it
// instead: an HMAC-SHA256, keyed by the token, of the method, the time, a random nonce, the
// caller's instance id for the job (key_scope.h) and the request itself. The service checks the
// proof, that the time is within kWindow of its own clock, and that the nonce is new.
//
// So a host that is not in the cluster but is handed a call (a trainer's user can name any
// rendezvous address) learns no token: it can at most replay that one call, once, within the
// window, to a real daemon, and that call was about the trainer's own job, under an instance
// id that names the daemon at the impostor's address, not at the real one.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include <google/protobuf/message.h>

namespace gradsync {

inline constexpr char kProofKey[] = "gradsync-peer-proof";
// How far a caller's clock may be from the service's (the nodes' clocks must agree, e.g. NTP).
inline constexpr std::chrono::seconds kProofWindow{120};

// The metadata value for a call: "v1 <unix ms> <nonce> <mac>".
std::string make_proof(const std::string& token, std::string_view method, const std::string& instance,
                       const google::protobuf::Message& request);

// The service side, with its replay cache. Thread-safe.
class ProofChecker {
 public:
  explicit ProofChecker(std::string token) : token_(std::move(token)) {}

  // OK when no token is configured, or the call's proof is good and new; UNAUTHENTICATED
  // naming what is wrong otherwise.
  grpc::Status check(const grpc::ServerContextBase& context, std::string_view method, const std::string& instance,
                     const google::protobuf::Message& request);
  // The same, on the metadata value itself (tests), at `now`.
  grpc::Status check_value(std::string_view value, std::string_view method, const std::string& instance,
                           const google::protobuf::Message& request, std::chrono::system_clock::time_point now);

 private:
  std::string token_;
  std::mutex mutex_;
  std::map<std::string, std::chrono::system_clock::time_point> seen_;  // nonce -> when it may go; guarded
};

}  // namespace gradsync
