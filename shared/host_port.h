// HOST:PORT, the one way gradsync reads a TCP address (--peer-listen, --admin, --metrics, the
// listeners, gradsyncctl): a host name or IPv4 address, or an IPv6 address in brackets
// ("[::1]:29590"), a colon, and a numeric port from 0 to 65535. No gRPC scheme (ipv4:,
// unix-abstract:, vsock:), which would slip past the checks made on a host.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gradsync {

struct HostPort {
  std::string host;        // without the brackets
  uint16_t port = 0;
  bool bracketed = false;  // written as [IPv6]

  // As written: "host:port", "[v6]:port".
  std::string text() const;
  // The host as written, with the brackets of an IPv6 address.
  std::string host_text() const { return bracketed ? "[" + host + "]" : host; }
  // 0.0.0.0, ::, * (every address of this machine).
  bool wildcard() const { return host == "0.0.0.0" || host == "::" || host == "*"; }
};

// Parses `text` into *out. On failure returns false and sets *why to what is wrong, in words
// that follow "not 'TEXT': " ("it has no port", "port 70000 is above 65535", ...).
bool parse_host_port(std::string_view text, HostPort* out, std::string* why);

}  // namespace gradsync
