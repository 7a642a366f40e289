// The one error type of gradsync. Foreign errors (errno, Boost, protobuf) are translated into a
// Status once, at the boundary where they arise; everything above passes Status or Error along.
//
// Which errors a job survives: kInvalidArgument, kNotSupported and kNotFound raised by a control
// request are answered to that client only, and the job goes on. Anything raised on the per-step
// path (a bad ring entry, a mismatch, a timeout, a lost peer) ends the job: the first such error
// sticks and every pending and later operation of the job fails with it.
#pragma once

#include <cstdint>
#include <exception>
#include <source_location>
#include <string>
#include <string_view>

namespace gradsync {

// Values are part of the wire format (control replies and completion entries).
enum class ErrorCode : uint32_t {
  kOk = 0,
  kInvalidArgument = 1,   // a request that names something wrong; the message says what
  kNotSupported = 2,      // valid, but needs a piece gradsync does not have yet
  kLayoutMismatch = 3,    // ranks registered or submitted different things
  kTimeout = 4,           // a bounded wait ran out
  kPeerLost = 5,          // a client or daemon disconnected or died
  kProtocol = 6,          // malformed frame or ring entry
  kPermissionDenied = 7,  // the peer is not allowed to do this
  kAborted = 8,           // the job failed earlier (or is stopping); this operation never ran. A
                          // registration in a failed job carries the failure's own code where
                          // that says why (kPeerLost, kTimeout, kLayoutMismatch), this one else
  kInternal = 9,          // a bug or an OS resource failure
  kNotFound = 10,
  kAlreadyExists = 11,
  kResourceExhausted = 12,
};

std::string_view error_code_name(ErrorCode code);

// LevelDB-style value: ok, or a code plus a message that names the job, rank or client and the
// cause. `where` records the file:line that created it, for logs.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message, std::string where = {})
      : code_(code), message_(std::move(message)), where_(std::move(where)) {}

  static Status ok_status() { return {}; }
  static Status invalid_argument(std::string msg, std::source_location loc = std::source_location::current());
  static Status not_supported(std::string msg, std::source_location loc = std::source_location::current());
  static Status layout_mismatch(std::string msg, std::source_location loc = std::source_location::current());
  static Status timeout(std::string msg, std::source_location loc = std::source_location::current());
  static Status peer_lost(std::string msg, std::source_location loc = std::source_location::current());
  static Status protocol(std::string msg, std::source_location loc = std::source_location::current());
  static Status permission_denied(std::string msg, std::source_location loc = std::source_location::current());
  static Status aborted(std::string msg, std::source_location loc = std::source_location::current());
  static Status internal(std::string msg, std::source_location loc = std::source_location::current());
  static Status not_found(std::string msg, std::source_location loc = std::source_location::current());
  static Status already_exists(std::string msg, std::source_location loc = std::source_location::current());
  static Status resource_exhausted(std::string msg, std::source_location loc = std::source_location::current());

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& where() const { return where_; }

  // "LayoutMismatch: <message>", for logs and exception text.
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
  std::string where_;
};

// The exception form of a non-ok Status, thrown by the client library and inside the daemon
// where unwinding is the clearest control flow (request validation).
class Error : public std::exception {
 public:
  explicit Error(Status status) : status_(std::move(status)), text_(status_.to_string()) {}
  const Status& status() const { return status_; }
  ErrorCode code() const { return status_.code(); }
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  Status status_;
  std::string text_;
};

// Throws Error(status) unless status is ok.
inline void throw_if_error(const Status& status) {
  if (!status.ok()) throw Error(status);
}

// What the exception being handled says (its what(), or "unknown exception"); call only inside
// a catch block.
std::string current_exception_text();

}  // namespace gradsync
