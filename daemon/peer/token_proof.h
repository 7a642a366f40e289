// The cluster token never leaves the daemon. Each peer call carries a proof made with it
// instead: an HMAC-SHA256, keyed by the token, of the method, the time, a random nonce, the
// callee's service id, the calling node's name, the caller's instance id for the job
// (key_scope.h) and the request itself. The service checks the proof, that it was made for
// this daemon process (its service id), that the time is within kWindow of its own clock, and
// that the nonce is new.
//
// The service id is random per daemon process and is what Ping answers; a Ping's proof is
// made for any callee (service id empty), since it changes nothing and is how a caller learns
// the id. So a host that is not in the cluster but is handed a call (a trainer's user can name
// any rendezvous address) learns no token, and cannot replay the call to a real daemon: the
// proof names the impostor's service id, not the real one's.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <string>
#include <string_view>

#include <google/protobuf/message.h>
#include "shared/mutex.h"

namespace gradsync {

inline constexpr char kProofKey[] = "gradsync-peer-proof";
// How every refusal of a call's authentication begins (UNAUTHENTICATED), by which a caller
// tells it from a refusal of what the call asked.
inline constexpr char kProofRefusal[] = "the peer service refused the call";
// How far a caller's clock may be from the service's (the nodes' clocks must agree, e.g. NTP).
inline constexpr std::chrono::seconds kProofWindow{120};

// What a proof binds beyond the method and the request.
struct ProofScope {
  std::string callee;    // the callee's service id; empty only for Ping
  std::string node;      // the calling node's name (its advertised peer address), at most 256 bytes
  std::string instance;  // the caller's instance id for the call's job; empty for calls about none
};

// The metadata value for a call: "v2 <unix ms> <nonce> <node> <mac>" (node "-" when empty).
std::string make_proof(const std::string& token, std::string_view method, const ProofScope& scope,
                       const google::protobuf::Message& request);

// The service side, with its replay cache. Thread-safe.
class ProofChecker {
 public:
  // `service_id`: this daemon process's (what Ping answers).
  ProofChecker(std::string token, std::string service_id)
      : token_(std::move(token)), service_id_(std::move(service_id)) {}

  // OK when no token is configured, or the call's proof is good and new; UNAUTHENTICATED
  // naming what is wrong otherwise. *node gets the node the proof names ("" without one).
  grpc::Status check(const grpc::ServerContextBase& context, std::string_view method, const std::string& instance,
                     const google::protobuf::Message& request, std::string* node);
  // The same, on the metadata value itself (tests), at `now`.
  grpc::Status check_value(std::string_view value, std::string_view method, const std::string& instance,
                           const google::protobuf::Message& request, std::chrono::system_clock::time_point now,
                           std::string* node);

  const std::string& service_id() const { return service_id_; }

 private:
  std::string token_;
  std::string service_id_;
  Mutex mutex_;
  std::map<std::string, std::chrono::system_clock::time_point> seen_ GS_GUARDED_BY(mutex_);  // nonce -> when it may go
};

}  // namespace gradsync
