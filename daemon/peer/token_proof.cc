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
                const std::string& instance, const google::protobuf::Message& request) {
  std::string message = "gradsync-peer-v1\n";
  message.append(method).append("\n").append(millis).append("\n").append(nonce).append("\n");
  message.append(instance).append("\n").append(serialized(request));
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
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the peer service refused the call: " + why);
}

}  // namespace

std::string make_proof(const std::string& token, std::string_view method, const std::string& instance,
                       const google::protobuf::Message& request) {
  unsigned char random[16];
  if (RAND_bytes(random, sizeof random) != 1) return {};  // refused by the service as malformed
  const std::string nonce = hex(random, sizeof random);
  const std::string millis = std::to_string(unix_ms(std::chrono::system_clock::now()));
  return "v1 " + millis + " " + nonce + " " + mac(token, method, millis, nonce, instance, request);
}

grpc::Status ProofChecker::check(const grpc::ServerContextBase& context, std::string_view method,
                                 const std::string& instance, const google::protobuf::Message& request) {
  if (token_.empty()) return grpc::Status::OK;  // TLS alone, or nothing (loopback only)
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kProofKey);
  if (it == metadata.end()) {
    return refused("it carries no proof of the cluster token (--peer-token-file must be given to every node's "
                   "gradsyncd, of the same cross-node protocol)");
  }
  return check_value(std::string_view(it->second.data(), it->second.size()), method, instance, request,
                     std::chrono::system_clock::now());
}

grpc::Status ProofChecker::check_value(std::string_view value, std::string_view method, const std::string& instance,
                                       const google::protobuf::Message& request,
                                       std::chrono::system_clock::time_point now) {
  if (token_.empty()) return grpc::Status::OK;
  std::istringstream in{std::string(value)};
  std::string version, millis, nonce, given;
  in >> version >> millis >> nonce >> given;
  int64_t when = 0;
  try {
    when = std::stoll(millis);
  } catch (const std::exception&) {
    when = -1;
  }
  if (version != "v1" || when < 0 || nonce.size() != 32 || given.size() != 64) {
    return refused("its proof of the cluster token is malformed");
  }
  const std::string expected = mac(token_, method, millis, nonce, instance, request);
  if (CRYPTO_memcmp(expected.data(), given.data(), expected.size()) != 0) {
    return refused("its proof does not match this node's cluster token (--peer-token-file must hold the same token "
                   "on every node)");
  }
  const int64_t skew = unix_ms(now) - when;
  const int64_t window = std::chrono::duration_cast<std::chrono::milliseconds>(kProofWindow).count();
  if (skew > window || skew < -window) {
    return refused("its time is " + std::to_string(skew / 1000) + " s from this node's clock (at most " +
                   std::to_string(window / 1000) + " s: keep the nodes' clocks in sync, e.g. with NTP)");
  }
  std::lock_guard lock(mutex_);
  if (seen_.size() >= kMaxSeen / 2) {
    for (auto s = seen_.begin(); s != seen_.end();) s = s->second < now ? seen_.erase(s) : std::next(s);
  }
  if (seen_.size() >= kMaxSeen) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "the peer service is answering too many calls");
  }
  const auto [at, fresh] = seen_.emplace(nonce, now + 2 * kProofWindow);
  if (!fresh) return refused("it replays an earlier call");
  return grpc::Status::OK;
}

}  // namespace gradsync
