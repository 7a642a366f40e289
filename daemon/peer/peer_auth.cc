#include "daemon/peer/peer_auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>

#include "daemon/util/secret_file.h"

namespace gradsync {

std::string PeerAuth::make_secret() {
  std::string secret(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()), static_cast<int>(secret.size())) != 1) {
    throw Error(Status::internal("cannot draw random bytes for the peer instance secret"));
  }
  return secret;
}

std::string PeerAuth::instance_for(const std::string& rendezvous, const std::string& job) const {
  const std::string message = rendezvous + '\n' + job;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), instance_secret.data(), static_cast<int>(instance_secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (unsigned int i = 0; i < 16 && i < length; ++i) {
    id += kHex[mac[i] >> 4];
    id += kHex[mac[i] & 15];
  }
  return id;
}

Status PeerAuth::load(const std::string& token_file, const std::string& cert_file, const std::string& key_file,
                      const std::string& ca_file, PeerAuth* out) {
  PeerAuth auth;
  auth.instance_secret = make_secret();
  if (!token_file.empty()) {
    // Checked as every secret file is (util/secret_file.h).
    if (Status s = read_secret_file(token_file, "--peer-token-file", 4096, &auth.token); !s.ok()) return s;
    if (auth.token.size() < 16) {
      return Status::invalid_argument("--peer-token-file: '" + token_file +
                                      "' holds fewer than 16 bytes; make one with: openssl rand -hex 32");
    }
    // It travels as gRPC metadata, which takes printable ASCII only.
    const bool printable = std::all_of(auth.token.begin(), auth.token.end(),
                                       [](char c) { return c >= 0x21 && c <= 0x7e; });
    if (!printable || auth.token.size() > 4096) {
      return Status::invalid_argument("--peer-token-file: '" + token_file +
                                      "' must hold one word of printable ASCII, at most 4096 bytes (openssl rand "
                                      "-hex 32 makes one)");
    }
  }
  const int tls_given = !cert_file.empty() + !key_file.empty() + !ca_file.empty();
  if (tls_given != 0 && tls_given != 3) {
    return Status::invalid_argument("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together");
  }
  if (tls_given == 3) {
    if (Status s = read_config_file(cert_file, "--peer-tls-cert", &auth.tls_cert); !s.ok()) return s;
    if (Status s = read_config_file(key_file, "--peer-tls-key", &auth.tls_key); !s.ok()) return s;
    if (Status s = read_config_file(ca_file, "--peer-tls-ca", &auth.tls_ca); !s.ok()) return s;
    for (const auto& [text, flag] : {std::pair{&auth.tls_cert, "--peer-tls-cert"}, {&auth.tls_key, "--peer-tls-key"},
                                     {&auth.tls_ca, "--peer-tls-ca"}}) {
      if (text->find("-----BEGIN ") == std::string::npos) {
        return Status::invalid_argument(std::string(flag) + ": not a PEM file");
      }
    }
  }
  *out = std::move(auth);
  return Status();
}

std::shared_ptr<grpc::ChannelCredentials> PeerAuth::channel_credentials() const {
  if (!tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = tls_ca;
  ssl.pem_private_key = tls_key;
  ssl.pem_cert_chain = tls_cert;
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::ServerCredentials> PeerAuth::server_credentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = tls_ca;
  ssl.pem_key_cert_pairs.push_back({tls_key, tls_cert});
  return grpc::SslServerCredentials(ssl);
}


}  // namespace gradsync
