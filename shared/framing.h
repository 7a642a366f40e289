// Control-socket framing: every control message is one frame, a 4-byte little-endian payload
// length followed by that many bytes of a serialized protobuf message (proto/control.proto).
// Frames are bounded so that a hostile or broken peer cannot make the other side allocate
// without limit. Only control messages travel this way; the per-step path uses shared rings.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "shared/status.h"

namespace gradsync {

inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr uint32_t kMaxFrameBytes = 16u << 20;  // a registration of ~500k tensors
// A decoder keeps at most this much buffer between frames; a larger frame's memory is given
// back once the frame is handed out, not held for the life of the connection.
inline constexpr size_t kDecoderKeepBytes = 1u << 20;

std::array<std::byte, kFrameHeaderBytes> encode_frame_header(uint32_t payload_bytes);

// The payload length from a header; a kProtocol error naming both sizes when it exceeds
// max_bytes ("frame of 20000000 bytes exceeds the 16777216-byte limit"), or, when the bytes are
// HTTP/2's (socket_names.h), one that starts with kSpeaksGrpcServer or kSpeaksGrpcClient.
inline constexpr char kSpeaksGrpcServer[] = "the other end speaks HTTP/2";
inline constexpr char kSpeaksGrpcClient[] = "this end was spoken to in HTTP/2";
Status decode_frame_header(std::span<const std::byte, kFrameHeaderBytes> header, uint32_t max_bytes,
                           uint32_t* payload_bytes);

// Header + payload in one buffer, ready to write. Fails if payload exceeds kMaxFrameBytes.
std::string encode_frame(std::string_view payload);

// Incremental decoder for a byte stream (the client's blocking reader and the tests).
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_bytes = kMaxFrameBytes) : max_bytes_(max_bytes) {}

  // Appends received bytes.
  void feed(std::span<const std::byte> bytes);

  // The next complete payload, nullopt when more bytes are needed. Once it returns an error
  // (oversized frame) the decoder stays failed: the stream cannot be resynchronized.
  Status next(std::optional<std::string>* payload);

  // Call at end of stream: ok when no partial frame is buffered, otherwise a kProtocol error
  // "truncated frame: expected N payload bytes, got M before end of stream".
  Status finish() const;

  // Drops whatever is buffered and frees the buffer (the connection is closing); returns the
  // bytes the buffer held, so that the caller can hand a large amount back to the system.
  size_t release();

  // The payload length the next frame's header announces, once its four bytes are in (the
  // frame itself may still be arriving); nullopt before that.
  std::optional<uint32_t> announced_bytes() const;

  // The bytes the buffer holds now, used or not.
  size_t held_bytes() const { return buffer_.capacity(); }

 private:
  uint32_t max_bytes_;
  std::string buffer_;
  size_t consumed_ = 0;  // bytes at the front of buffer_ already handed out
  Status failed_;
};

}  // namespace gradsync
