#include "shared/socket_names.h"

namespace gradsync {
namespace {

constexpr char kAdminSuffix[] = ".admin";

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string admin_socket_for(const std::string& control_socket) {
  return name_of(control_socket) == "gradsync.sock" ? folder_of(control_socket) + "/admin.sock"
                                                    : control_socket + kAdminSuffix;
}

std::string control_socket_for(const std::string& admin_socket) {
  if (name_of(admin_socket) == "admin.sock") return folder_of(admin_socket) + "/gradsync.sock";
  const size_t suffix = sizeof kAdminSuffix - 1;
  if (admin_socket.size() > suffix && admin_socket.compare(admin_socket.size() - suffix, suffix, kAdminSuffix) == 0) {
    return admin_socket.substr(0, admin_socket.size() - suffix);
  }
  return "";
}

bool is_http2_server_start(std::span<const std::byte, 4> first) {
  // An HTTP/2 frame header starts with a 24-bit big-endian length and a type; a server's first
  // frame is SETTINGS (type 4), a few dozen bytes long.
  return first[0] == std::byte{0} && first[1] == std::byte{0} && first[3] == std::byte{4};
}

bool is_http2_client_start(std::span<const std::byte, 4> first) {
  return first[0] == std::byte{'P'} && first[1] == std::byte{'R'} && first[2] == std::byte{'I'} &&
         first[3] == std::byte{' '};
}

}  // namespace gradsync
