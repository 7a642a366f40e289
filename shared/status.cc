#include "shared/status.h"

namespace gradsync {
namespace {

std::string where_of(const std::source_location& loc) {
  std::string_view file = loc.file_name();
  // Keep the path relative to the repository: strip everything up to the first known folder.
  for (std::string_view top : {"daemon/", "client/", "shared/", "tests/", "proto/"}) {
    if (auto pos = file.rfind(top); pos != std::string_view::npos) {
      file = file.substr(pos);
      break;
    }
  }
  return std::string(file) + ":" + std::to_string(loc.line());
}

}  // namespace

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "Ok";
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kNotSupported: return "NotSupported";
    case ErrorCode::kLayoutMismatch: return "LayoutMismatch";
    case ErrorCode::kTimeout: return "Timeout";
    case ErrorCode::kPeerLost: return "PeerLost";
    case ErrorCode::kProtocol: return "Protocol";
    case ErrorCode::kPermissionDenied: return "PermissionDenied";
    case ErrorCode::kAborted: return "Aborted";
    case ErrorCode::kInternal: return "Internal";
    case ErrorCode::kNotFound: return "NotFound";
    case ErrorCode::kAlreadyExists: return "AlreadyExists";
    case ErrorCode::kResourceExhausted: return "ResourceExhausted";
  }
  return "Unknown";
}

#define GRADSYNC_STATUS_FACTORY(fn, code)                           \
  Status Status::fn(std::string msg, std::source_location loc) {   \
    return Status(ErrorCode::code, std::move(msg), where_of(loc)); \
  }
GRADSYNC_STATUS_FACTORY(invalid_argument, kInvalidArgument)
GRADSYNC_STATUS_FACTORY(not_supported, kNotSupported)
GRADSYNC_STATUS_FACTORY(layout_mismatch, kLayoutMismatch)
GRADSYNC_STATUS_FACTORY(timeout, kTimeout)
GRADSYNC_STATUS_FACTORY(peer_lost, kPeerLost)
GRADSYNC_STATUS_FACTORY(protocol, kProtocol)
GRADSYNC_STATUS_FACTORY(permission_denied, kPermissionDenied)
GRADSYNC_STATUS_FACTORY(aborted, kAborted)
GRADSYNC_STATUS_FACTORY(internal, kInternal)
GRADSYNC_STATUS_FACTORY(not_found, kNotFound)
GRADSYNC_STATUS_FACTORY(already_exists, kAlreadyExists)
GRADSYNC_STATUS_FACTORY(resource_exhausted, kResourceExhausted)
#undef GRADSYNC_STATUS_FACTORY

std::string Status::to_string() const {
  if (ok()) return "Ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

std::string current_exception_text() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace gradsync
