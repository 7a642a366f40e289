#include "daemon/engine/gloo/address_scrub.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <cstring>

namespace gradsync::gloo_engine {
namespace {

// The layout of gloo::transport::tcp::Address::Impl (gloo/transport/tcp/address.h), which is
// what Address::bytes() copies out.
struct TcpAddress {
  sockaddr_storage ss;
  ssize_t seq;
};

}  // namespace

size_t tcp_address_bytes() { return sizeof(TcpAddress); }

bool scrub_tcp_addresses(std::vector<char>* value) {
  constexpr size_t kSize = sizeof(TcpAddress);
  if (value->empty() || value->size() % kSize != 0) return false;
  // Every entry must be an address of a family we know before anything is touched.
  for (size_t at = 0; at < value->size(); at += kSize) {
    sa_family_t family = 0;
    std::memcpy(&family, value->data() + at + offsetof(sockaddr_storage, ss_family), sizeof(family));
    if (family != AF_INET && family != AF_INET6) return false;
  }
  for (size_t at = 0; at < value->size(); at += kSize) {
    char* entry = value->data() + at;
    sa_family_t family = 0;
    std::memcpy(&family, entry + offsetof(sockaddr_storage, ss_family), sizeof(family));
    // sockaddr_in's sin_zero is unused too.
    const size_t used = family == AF_INET ? offsetof(sockaddr_in, sin_zero) : sizeof(sockaddr_in6);
    std::memset(entry + used, 0, sizeof(sockaddr_storage) - used);
    // Between the structure's two fields there is no padding (static_assert below), so the
    // sequence number is all that follows.
  }
  return true;
}

static_assert(offsetof(TcpAddress, seq) == sizeof(sockaddr_storage), "tcp::Address::Impl has padding");
static_assert(sizeof(TcpAddress) == sizeof(sockaddr_storage) + sizeof(ssize_t), "tcp::Address::Impl has padding");

}  // namespace gradsync::gloo_engine
