// HOST:PORT, the one parser of every TCP address gradsync takes (shared/host_port.h): what it
// accepts, what each refusal says, and the wildcard and bracket handling its users rely on.
#include "shared/host_port.h"

#include <catch2/catch.hpp>

namespace gradsync {

TEST_CASE("host port: names, IPv4 and bracketed IPv6 addresses with a numeric port", "[host_port]") {
  std::string why;
  HostPort a;
  REQUIRE(parse_host_port("127.0.0.1:29590", &a, &why));
  CHECK(a.host == "127.0.0.1");
  CHECK(a.port == 29590);
  CHECK_FALSE(a.bracketed);
  CHECK(a.text() == "127.0.0.1:29590");
  CHECK_FALSE(a.wildcard());
  REQUIRE(parse_host_port("[::1]:0", &a, &why));
  CHECK(a.host == "::1");
  CHECK(a.port == 0);
  CHECK(a.bracketed);
  CHECK(a.host_text() == "[::1]");
  CHECK(a.text() == "[::1]:0");
  REQUIRE(parse_host_port("node-7.example:65535", &a, &why));
  CHECK(a.port == 65535);
  for (const char* any : {"0.0.0.0:1", "[::]:1", "*:1"}) {
    REQUIRE(parse_host_port(any, &a, &why));
    CHECK(a.wildcard());
  }
}

TEST_CASE("host port: what is refused, and why", "[host_port]") {
  const auto refusal = [](const char* text) {
    HostPort out;
    std::string why;
    CHECK_FALSE(parse_host_port(text, &out, &why));
    return why;
  };
  CHECK(refusal("9464") == "it has no port (HOST:PORT)");
  CHECK_THAT(refusal(":9464"), Catch::StartsWith("it has no host"));
  CHECK(refusal("host:") == "the port '' is not a number from 0 to 65535");
  CHECK(refusal("host:http") == "the port 'http' is not a number from 0 to 65535");
  CHECK(refusal("host:-1") == "the port '-1' is not a number from 0 to 65535");
  CHECK(refusal("host:123456") == "the port '123456' is not a number from 0 to 65535");
  CHECK(refusal("host:70000") == "port 70000 is above 65535");
  CHECK_THAT(refusal("::1:80"), Catch::StartsWith("its host holds a ':'"));
  CHECK_THAT(refusal("ipv4:127.0.0.1:80"), Catch::Contains("no scheme such as ipv4:"));
  CHECK_THAT(refusal("unix-abstract:x:1"), Catch::StartsWith("its host holds a ':'"));
  CHECK(refusal("[::1:80") == "the IPv6 address '[::1' is not closed by ']'");
  CHECK(refusal("[]:80") == "its brackets hold no IPv6 address");
  CHECK(refusal("[::1]x:80") == "the IPv6 address '[::1]x' is not closed by ']'");
}

}  // namespace gradsync
