#include "shared/framing.h"

#include "shared/socket_names.h"

namespace gradsync {
namespace {

// The header is little-endian on the wire whatever the host order, so it is assembled byte by
// byte rather than memcpy'd from a uint32_t.
uint32_t read_le32(const std::byte* bytes) {
  return std::to_integer<uint32_t>(bytes[0]) | std::to_integer<uint32_t>(bytes[1]) << 8 |
         std::to_integer<uint32_t>(bytes[2]) << 16 | std::to_integer<uint32_t>(bytes[3]) << 24;
}

// The header starting at `offset`; the caller has checked that all four bytes are there.
std::span<const std::byte, kFrameHeaderBytes> header_at(const std::string& buffer, size_t offset) {
  return std::span<const std::byte, kFrameHeaderBytes>(reinterpret_cast<const std::byte*>(buffer.data()) + offset,
                                                       kFrameHeaderBytes);
}

}  // namespace

std::array<std::byte, kFrameHeaderBytes> encode_frame_header(uint32_t payload_bytes) {
  return {std::byte(payload_bytes & 0xff), std::byte((payload_bytes >> 8) & 0xff),
          std::byte((payload_bytes >> 16) & 0xff), std::byte((payload_bytes >> 24) & 0xff)};
}

Status decode_frame_header(std::span<const std::byte, kFrameHeaderBytes> header, uint32_t max_bytes,
                           uint32_t* payload_bytes) {
  const uint32_t size = read_le32(header.data());
  if (size > max_bytes && is_http2_server_start(header)) {
    return Status::protocol(std::string(kSpeaksGrpcServer) + ": it is a gRPC server, as gradsyncd's admin socket is, not "
                            "gradsyncd's control socket");
  }
  if (size > max_bytes && is_http2_client_start(header)) {
    return Status::protocol(std::string(kSpeaksGrpcClient) + ": it is a gRPC client, as gradsyncctl is; this is "
                            "gradsyncd's control socket, for trainers, not its admin socket");
  }
  if (size > max_bytes) {
    return Status::protocol("frame of " + std::to_string(size) + " bytes exceeds the " +
                            std::to_string(max_bytes) + "-byte limit");
  }
  *payload_bytes = size;
  return Status::ok_status();
}

std::string encode_frame(std::string_view payload) {
  if (payload.size() > kMaxFrameBytes) {
    throw Error(Status::invalid_argument("cannot send a frame of " + std::to_string(payload.size()) +
                                         " bytes: it exceeds the " + std::to_string(kMaxFrameBytes) +
                                         "-byte limit"));
  }
  const auto header = encode_frame_header(static_cast<uint32_t>(payload.size()));
  std::string frame;
  frame.reserve(kFrameHeaderBytes + payload.size());
  frame.append(reinterpret_cast<const char*>(header.data()), header.size());
  frame.append(payload);
  return frame;
}

void FrameDecoder::feed(std::span<const std::byte> bytes) {
  // After a failure the stream cannot be resynchronized, so whatever follows is dropped rather
  // than buffered without limit.
  if (!failed_.ok()) return;
  // Frames handed out are dropped from the front here, once per read rather than once per
  // frame: a read of many small frames (a flood of them) is then linear, not quadratic.
  if (consumed_ > 0) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
    if (buffer_.capacity() > kDecoderKeepBytes && buffer_.size() <= kDecoderKeepBytes) buffer_.shrink_to_fit();
  }
  buffer_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Status FrameDecoder::next(std::optional<std::string>* payload) {
  payload->reset();
  if (!failed_.ok()) return failed_;
  const size_t left = buffer_.size() - consumed_;
  if (left < kFrameHeaderBytes) return Status::ok_status();

  uint32_t size = 0;
  Status status = decode_frame_header(header_at(buffer_, consumed_), max_bytes_, &size);
  if (!status.ok()) {
    failed_ = std::move(status);
    buffer_.clear();
    buffer_.shrink_to_fit();
    consumed_ = 0;
    return failed_;
  }
  if (left - kFrameHeaderBytes < size) return Status::ok_status();

  payload->emplace(buffer_, consumed_ + kFrameHeaderBytes, size);
  consumed_ += kFrameHeaderBytes + size;
  if (consumed_ == buffer_.size()) {  // the usual case: everything read was handed out
    buffer_.clear();
    consumed_ = 0;
    if (buffer_.capacity() > kDecoderKeepBytes) buffer_.shrink_to_fit();
  } else if (consumed_ > kDecoderKeepBytes) {
    // A large frame was taken with the start of another behind it: its buffer goes back now,
    // not at the next read (a large frame comes alone; small ones are dropped per read).
    buffer_.erase(0, consumed_);
    consumed_ = 0;
    if (buffer_.capacity() > kDecoderKeepBytes && buffer_.size() <= kDecoderKeepBytes) buffer_.shrink_to_fit();
  }
  return Status::ok_status();
}

std::optional<uint32_t> FrameDecoder::announced_bytes() const {
  if (!failed_.ok() || buffer_.size() - consumed_ < kFrameHeaderBytes) return std::nullopt;
  return read_le32(reinterpret_cast<const std::byte*>(buffer_.data() + consumed_));
}

size_t FrameDecoder::release() {
  const size_t held = buffer_.capacity();
  std::string().swap(buffer_);
  consumed_ = 0;
  return held;
}

Status FrameDecoder::finish() const {
  if (!failed_.ok()) return failed_;
  // Complete frames that next() has not handed out yet are not an error; only a frame cut off
  // by the end of the stream is. Walk past the complete ones to the last, possibly partial, one.
  size_t offset = consumed_;
  while (offset < buffer_.size()) {
    const size_t left = buffer_.size() - offset;
    if (left < kFrameHeaderBytes) {
      return Status::protocol("truncated frame header: got " + std::to_string(left) + " of " +
                              std::to_string(kFrameHeaderBytes) + " bytes before end of stream");
    }
    uint32_t size = 0;
    Status status = decode_frame_header(header_at(buffer_, offset), max_bytes_, &size);
    if (!status.ok()) return status;
    const size_t got = left - kFrameHeaderBytes;
    if (got < size) {
      return Status::protocol("truncated frame: expected " + std::to_string(size) + " payload bytes, got " +
                              std::to_string(got) + " before end of stream");
    }
    offset += kFrameHeaderBytes + size;
  }
  return Status::ok_status();
}

}  // namespace gradsync
