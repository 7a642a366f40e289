#include "daemon/peer/token_proof.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <sstream>
#include <vector>

namespace gradsync {
namespace {

constexpr size_t kMaxSeen = 1u << 20;  // nonces remembered at once; only valid proofs are remembered

std::string hex(const unsigned char* data, size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    out += kHex[data[i] >> 4];
    out += kHex[data[i] & 15];
  }
  return out;
}

std::string serialized(const google::protobuf::Message& request) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    request.SerializeToCodedStream(&coded);
  }
  return bytes;
}

std::string mac(const std::string& token, std::string_view method, std::string_view millis, std::string_view nonce,
                const ProofScope& scope, const google::protobuf::Message& request) {
  std::string message = "gradsync-peer-v2\n";
  message.append(method).append("\n").append(millis).append("\n").append(nonce).append("\n");
  message.append(scope.callee).append("\n").append(scope.node).append("\n");
  message.append(scope.instance).append("\n").append(serialized(request));
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), out, &length);
  return hex(out, length);
}

int64_t unix_ms(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

grpc::Status refused(const std::string& why) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(kProofRefusal) + ": " + why);
}

// A node name as a proof carries it: printable ASCII without spaces, at most 256 bytes.
bool valid_node(std::string_view node) {
  if (node.size() > 256) return false;
  for (char c : node) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

std::string make_proof(const std::string& token, std::string_view method, const ProofScope& scope,
                       const google::protobuf::Message& request) {
  unsigned char random[16];
  if (RAND_bytes(random, sizeof random) != 1) return {};  // refused by the service as malformed
  const std::string nonce = hex(random, sizeof random);
  const std::string millis = std::to_string(unix_ms(std::chrono::system_clock::now()));
  const std::string node = scope.node.empty() || !valid_node(scope.node) ? "-" : scope.node;
  ProofScope bound = scope;
  bound.node = node == "-" ? "" : node;
  return "v2 " + millis + " " + nonce + " " + node + " " + mac(token, method, millis, nonce, bound, request);
}

grpc::Status ProofChecker::check(const grpc::ServerContextBase& context, std::string_view method,
                                 const std::string& instance, const google::protobuf::Message& request,
                                 std::string* node) {
  node->clear();
  if (token_.empty()) return grpc::Status::OK;  // TLS alone, or nothing (loopback only)
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kProofKey);
  if (it == metadata.end()) {
    return refused("it carries no proof of the cluster token (--peer-token-file must be given to every node's "
                   "gradsyncd, of the same cross-node protocol)");
  }
  return check_value(std::string_view(it->second.data(), it->second.size()), method, instance, request,
                     std::chrono::system_clock::now(), node);
}

grpc::Status ProofChecker::check_value(std::string_view value, std::string_view method, const std::string& instance,
                                       const google::protobuf::Message& request,
                                       std::chrono::system_clock::time_point now, std::string* node) {
  node->clear();
  if (token_.empty()) return grpc::Status::OK;
  std::istringstream in{std::string(value)};
  std::string version, millis, nonce, named, given;
  in >> version >> millis >> nonce >> named >> given;
  int64_t when = 0;
  try {
    when = std::stoll(millis);
  } catch (const std::exception&) {
    when = -1;
  }
  if (version == "v1") {
    return refused("its proof is of the first kind (gradsyncd before 0.2.4), not bound to the callee: every node "
                   "must run a gradsyncd of the same cross-node protocol");
  }
  if (version != "v2" || when < 0 || nonce.size() != 32 || given.size() != 64 || named.empty() || !valid_node(named)) {
    return refused("its proof of the cluster token is malformed");
  }
  ProofScope scope{method == "Ping" ? std::string() : service_id_, named == "-" ? std::string() : named, instance};
  const std::string expected = mac(token_, method, millis, nonce, scope, request);
  if (CRYPTO_memcmp(expected.data(), given.data(), expected.size()) != 0) {
    return refused("its proof does not match this node's cluster token, or was made for another gradsyncd "
                   "(--peer-token-file must hold the same token on every node; a proof is bound to the daemon "
                   "process it is sent to)");
  }
  const int64_t skew = unix_ms(now) - when;
  const int64_t window = std::chrono::duration_cast<std::chrono::milliseconds>(kProofWindow).count();
  if (skew > window || skew < -window) {
    return refused("its time is " + std::to_string(skew / 1000) + " s from this node's clock (at most " +
                   std::to_string(window / 1000) + " s: keep the nodes' clocks in sync, e.g. with NTP)");
  }
  MutexLock lock(mutex_);
  if (seen_.size() >= kMaxSeen / 2) {
    for (auto s = seen_.begin(); s != seen_.end();) s = s->second < now ? seen_.erase(s) : std::next(s);
  }
  if (seen_.size() >= kMaxSeen) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "the peer service is answering too many calls");
  }
  const auto [at, fresh] = seen_.emplace(nonce, now + 2 * kProofWindow);
  if (!fresh) return refused("it replays an earlier call");
  *node = scope.node;
  return grpc::Status::OK;
}

}  // namespace gradsync
