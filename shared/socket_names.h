// gradsyncd's two Unix sockets, and telling them apart when a program is pointed at the wrong
// one. The control socket (trainers, framing.h) and the admin socket (gradsyncctl, gRPC over
// HTTP/2) sit side by side: for a control socket named gradsync.sock the admin socket is
// admin.sock in the same folder (/run/gradsync/), for any other name it is "<socket>.admin".
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace gradsync {

std::string admin_socket_for(const std::string& control_socket);
// The inverse, for an admin socket path named by that rule; empty for any other name.
std::string control_socket_for(const std::string& admin_socket);

// What a control-protocol reader can tell from the first 4 bytes it read, when they are no
// frame header of its own: a gRPC server's first HTTP/2 frame (SETTINGS), or the HTTP/2
// client preface ("PRI * HTTP/2.0") that gRPC clients such as gradsyncctl open with.
bool is_http2_server_start(std::span<const std::byte, 4> first);
bool is_http2_client_start(std::span<const std::byte, 4> first);

}  // namespace gradsync
