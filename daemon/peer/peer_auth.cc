#include "daemon/peer/peer_auth.h"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace gradsync {
namespace {

Status read_file(const std::string& path, const char* flag, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return Status::invalid_argument(std::string(flag) + ": cannot read '" + path + "'");
  *out = text.str();
  return Status();
}

// Equal, in a time that does not say where they differ.
bool same(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() != expected.size() ? 1 : 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>((i < given.size() ? given[i] : 0) ^ expected[i]);
  }
  return diff == 0;
}

}  // namespace

Status PeerAuth::load(const std::string& token_file, const std::string& cert_file, const std::string& key_file,
                      const std::string& ca_file, PeerAuth* out) {
  PeerAuth auth;
  if (!token_file.empty()) {
    struct stat st {};
    if (::stat(token_file.c_str(), &st) != 0) {
      return Status::invalid_argument("--peer-token-file: cannot read '" + token_file + "'");
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
      return Status::invalid_argument("--peer-token-file: '" + token_file +
                                      "' can be read by other users (chmod 600 it)");
    }
    if (Status s = read_file(token_file, "--peer-token-file", &auth.token); !s.ok()) return s;
    while (!auth.token.empty() && std::isspace(static_cast<unsigned char>(auth.token.back()))) auth.token.pop_back();
    if (auth.token.size() < 16) {
      return Status::invalid_argument("--peer-token-file: '" + token_file +
                                      "' holds fewer than 16 bytes; make one with: openssl rand -hex 32");
    }
    if (auth.token.find_first_of("\r\n") != std::string::npos || auth.token.size() > 4096) {
      return Status::invalid_argument("--peer-token-file: '" + token_file + "' must hold one line of at most 4096 bytes");
    }
  }
  const int tls_given = !cert_file.empty() + !key_file.empty() + !ca_file.empty();
  if (tls_given != 0 && tls_given != 3) {
    return Status::invalid_argument("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together");
  }
  if (tls_given == 3) {
    if (Status s = read_file(cert_file, "--peer-tls-cert", &auth.tls_cert); !s.ok()) return s;
    if (Status s = read_file(key_file, "--peer-tls-key", &auth.tls_key); !s.ok()) return s;
    if (Status s = read_file(ca_file, "--peer-tls-ca", &auth.tls_ca); !s.ok()) return s;
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

grpc::Status PeerAuth::check(const grpc::ServerContextBase& context) const {
  if (token.empty()) return grpc::Status::OK;  // TLS alone, or nothing (loopback only)
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kTokenKey);
  if (it == metadata.end() || !same(std::string(it->second.data(), it->second.size()), token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the peer service refused the call: it carries no or a wrong cluster token "
                        "(--peer-token-file must hold the same token on every node)");
  }
  return grpc::Status::OK;
}

}  // namespace gradsync
