// Gloo TCP addresses leave the daemon without the uninitialised bytes Gloo copies into them
// (daemon/engine/gloo/address_scrub.h), and read back as the same address.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <gloo/transport/tcp/address.h>

#include "daemon/engine/gloo/address_scrub.h"

namespace gradsync::gloo_engine {
namespace {

// What getsockname() leaves in a structure nobody cleared: the address, then stack garbage.
std::vector<char> dirty_address(int family, uint16_t port, gloo::transport::tcp::sequence_number_t seq) {
  sockaddr_storage ss;
  std::memset(&ss, 0xAB, sizeof(ss));
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &in->sin_addr);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    in6->sin6_flowinfo = 0;
    in6->sin6_scope_id = 0;
    ::inet_pton(AF_INET6, "::1", &in6->sin6_addr);
  }
  return gloo::transport::tcp::Address(ss, seq).bytes();
}

size_t count_byte(const std::vector<char>& bytes, unsigned char b) {
  size_t n = 0;
  for (char c : bytes) n += static_cast<unsigned char>(c) == b;
  return n;
}

}  // namespace

TEST_CASE("gloo addresses: the bytes a family does not use are zeroed, the address reads back the same",
          "[gloo]") {
  std::vector<char> value = dirty_address(AF_INET, 40123, 7);
  const std::vector<char> second = dirty_address(AF_INET6, 40124, 9);
  value.insert(value.end(), second.begin(), second.end());
  REQUIRE(value.size() == 2 * tcp_address_bytes());
  REQUIRE(count_byte(value, 0xAB) > 200);  // what Gloo would have published
  const std::string before4 = gloo::transport::tcp::Address(std::vector<char>(value.begin(), value.begin() + tcp_address_bytes())).str();
  const std::string before6 = gloo::transport::tcp::Address(second).str();

  REQUIRE(scrub_tcp_addresses(&value));
  CHECK(count_byte(value, 0xAB) == 0);
  const gloo::transport::tcp::Address v4(std::vector<char>(value.begin(), value.begin() + tcp_address_bytes()));
  const gloo::transport::tcp::Address v6(std::vector<char>(value.begin() + tcp_address_bytes(), value.end()));
  CHECK(v4.str() == before4);
  CHECK(v6.str() == before6);
  CHECK(v4.getSeq() == 7);
  CHECK(v6.getSeq() == 9);
}

TEST_CASE("gloo addresses: a value that is not a list of TCP addresses is left alone", "[gloo]") {
  std::vector<char> hostname{'n', 'o', 'd', 'e', '-', '1'};
  const auto copy = hostname;
  CHECK_FALSE(scrub_tcp_addresses(&hostname));
  CHECK(hostname == copy);
  std::vector<char> unknown(tcp_address_bytes(), static_cast<char>(0xAB));  // no known family
  CHECK_FALSE(scrub_tcp_addresses(&unknown));
  CHECK(count_byte(unknown, 0xAB) == unknown.size());
}

}  // namespace gradsync::gloo_engine
