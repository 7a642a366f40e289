#include "shared/host_port.h"

namespace gradsync {

std::string HostPort::text() const { return host_text() + ":" + std::to_string(port); }

bool parse_host_port(std::string_view text, HostPort* out, std::string* why) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    *why = "it has no port (HOST:PORT)";
    return false;
  }
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  if (host.empty()) {
    *why = "it has no host (HOST:PORT; 0.0.0.0 or [::] for every address)";
    return false;
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos) {
    *why = "the port '" + std::string(port) + "' is not a number from 0 to 65535";
    return false;
  }
  const unsigned long number = std::stoul(std::string(port));
  if (number > 65535) {
    *why = "port " + std::string(port) + " is above 65535";
    return false;
  }
  const bool bracketed = host.front() == '[';
  if (bracketed) {
    if (host == "[]") {
      *why = "its brackets hold no IPv6 address";
      return false;
    }
    if (host.back() != ']') {
      *why = "the IPv6 address '" + std::string(host) + "' is not closed by ']'";
      return false;
    }
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    *why = "its host holds a ':' (an IPv6 address goes in brackets, [::1]:PORT, and no scheme such as ipv4: may lead it)";
    return false;
  }
  out->host = std::string(host);
  out->port = static_cast<uint16_t>(number);
  out->bracketed = bracketed;
  return true;
}

}  // namespace gradsync
