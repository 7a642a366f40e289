// Control-socket framing: the encoder and the incremental decoder, fed the way a socket reader
// would feed it (whole frames, single bytes, several frames at once, a stream cut short).
#include "shared/framing.h"

#include <catch2/catch.hpp>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gradsync {
namespace {

std::span<const std::byte> bytes_of(std::string_view text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

// Runs next() until it reports that more bytes are needed, collecting the payloads; REQUIREs
// that every call succeeds.
std::vector<std::string> drain(FrameDecoder& decoder) {
  std::vector<std::string> payloads;
  for (;;) {
    std::optional<std::string> payload;
    const Status status = decoder.next(&payload);
    REQUIRE(status.ok());
    if (!payload) return payloads;
    payloads.push_back(std::move(*payload));
  }
}

// A header announcing `size` payload bytes, whatever the limit.
std::string header_of(uint32_t size) {
  const auto header = encode_frame_header(size);
  return std::string(reinterpret_cast<const char*>(header.data()), header.size());
}

TEST_CASE("frame header is four little-endian bytes", "[framing]") {
  const auto header = encode_frame_header(0x04030201u);
  CHECK(header[0] == std::byte{0x01});
  CHECK(header[1] == std::byte{0x02});
  CHECK(header[2] == std::byte{0x03});
  CHECK(header[3] == std::byte{0x04});

  uint32_t size = 0;
  REQUIRE(decode_frame_header(header, 0xffffffffu, &size).ok());
  CHECK(size == 0x04030201u);
}

TEST_CASE("encoded frame round-trips through the decoder", "[framing]") {
  using namespace std::string_literals;
  const std::string payload = "registration\0with\xff"s + "odd bytes";  // embedded NUL and high byte
  REQUIRE(payload.size() == 27);
  const std::string frame = encode_frame(payload);
  REQUIRE(frame.size() == kFrameHeaderBytes + payload.size());

  FrameDecoder decoder;
  decoder.feed(bytes_of(frame));
  const auto payloads = drain(decoder);
  REQUIRE(payloads.size() == 1);
  CHECK(payloads[0] == payload);
  CHECK(decoder.finish().ok());
}

TEST_CASE("decoder reassembles a frame fed one byte at a time", "[framing]") {
  const std::string payload(1000, 'x');
  const std::string frame = encode_frame(payload);

  FrameDecoder decoder;
  std::vector<std::string> payloads;
  for (size_t i = 0; i < frame.size(); ++i) {
    decoder.feed(bytes_of(std::string_view(frame).substr(i, 1)));
    auto got = drain(decoder);
    // Nothing may come out before the last byte has arrived.
    if (i + 1 < frame.size()) REQUIRE(got.empty());
    payloads.insert(payloads.end(), got.begin(), got.end());
  }
  REQUIRE(payloads.size() == 1);
  CHECK(payloads[0] == payload);
  CHECK(decoder.finish().ok());
}

TEST_CASE("decoder splits several frames delivered in one feed", "[framing]") {
  const std::vector<std::string> sent = {"first", "", std::string(70000, 'b'), "last"};
  std::string stream;
  for (const auto& payload : sent) stream += encode_frame(payload);

  FrameDecoder decoder;
  decoder.feed(bytes_of(stream));
  CHECK(drain(decoder) == sent);
  CHECK(decoder.finish().ok());
}

TEST_CASE("zero-length frame decodes to an empty payload", "[framing]") {
  const std::string frame = encode_frame("");
  REQUIRE(frame.size() == kFrameHeaderBytes);

  FrameDecoder decoder;
  decoder.feed(bytes_of(frame));
  std::optional<std::string> payload;
  REQUIRE(decoder.next(&payload).ok());
  REQUIRE(payload.has_value());
  CHECK(payload->empty());
  CHECK(decoder.finish().ok());
}

TEST_CASE("decode_frame_header rejects a size over the limit, naming both sizes", "[framing]") {
  const auto header = encode_frame_header(20000000);
  uint32_t size = 0;
  const Status status = decode_frame_header(header, kMaxFrameBytes, &size);
  REQUIRE(status.code() == ErrorCode::kProtocol);
  CHECK_THAT(status.message(), Catch::Contains("20000000") && Catch::Contains("16777216"));

  // Exactly at the limit is allowed.
  REQUIRE(decode_frame_header(encode_frame_header(kMaxFrameBytes), kMaxFrameBytes, &size).ok());
  CHECK(size == kMaxFrameBytes);
}

TEST_CASE("decoder rejects an oversized frame header", "[framing]") {
  FrameDecoder decoder(100);
  decoder.feed(bytes_of(header_of(101)));
  std::optional<std::string> payload;
  const Status status = decoder.next(&payload);
  REQUIRE(status.code() == ErrorCode::kProtocol);
  CHECK_THAT(status.message(), Catch::Contains("101") && Catch::Contains("100"));
  CHECK_FALSE(payload.has_value());
}

TEST_CASE("decoder stays failed after an oversized header", "[framing]") {
  FrameDecoder decoder(100);
  decoder.feed(bytes_of(header_of(5000)));
  std::optional<std::string> payload;
  const Status first = decoder.next(&payload);
  REQUIRE(first.code() == ErrorCode::kProtocol);

  // A well-formed frame afterwards cannot resynchronize the stream.
  decoder.feed(bytes_of(encode_frame("valid")));
  const Status again = decoder.next(&payload);
  CHECK(again.code() == ErrorCode::kProtocol);
  CHECK(again.message() == first.message());
  CHECK_FALSE(payload.has_value());
  CHECK(decoder.finish().code() == ErrorCode::kProtocol);
}

TEST_CASE("finish reports a truncated payload with expected and received sizes", "[framing]") {
  const std::string frame = encode_frame(std::string(10, 'p'));
  FrameDecoder decoder;
  decoder.feed(bytes_of(std::string_view(frame).substr(0, kFrameHeaderBytes + 3)));
  CHECK(drain(decoder).empty());

  const Status status = decoder.finish();
  REQUIRE(status.code() == ErrorCode::kProtocol);
  CHECK_THAT(status.message(), Catch::Contains("truncated frame: expected 10 payload bytes, got 3"));
}

TEST_CASE("finish reports a truncated header", "[framing]") {
  FrameDecoder decoder;
  decoder.feed(bytes_of(header_of(10).substr(0, 2)));
  CHECK(drain(decoder).empty());

  const Status status = decoder.finish();
  REQUIRE(status.code() == ErrorCode::kProtocol);
  CHECK_THAT(status.message(), Catch::Contains("truncated frame header: got 2 of 4 bytes"));
}

TEST_CASE("finish looks past complete frames not yet taken to a truncated one", "[framing]") {
  FrameDecoder decoder;
  decoder.feed(bytes_of(encode_frame("complete") + encode_frame("cut short").substr(0, 6)));

  const Status status = decoder.finish();
  REQUIRE(status.code() == ErrorCode::kProtocol);
  CHECK_THAT(status.message(), Catch::Contains("expected 9 payload bytes, got 2"));
}

TEST_CASE("finish is ok on an empty stream", "[framing]") {
  FrameDecoder decoder;
  CHECK(decoder.finish().ok());
}

TEST_CASE("a large frame's buffer is given back once the frame is taken, release frees the rest", "[framing]") {
  FrameDecoder decoder;
  const std::string big(4u << 20, 'b');
  decoder.feed(bytes_of(encode_frame(big) + encode_frame("next").substr(0, 6)));
  REQUIRE(decoder.held_bytes() >= big.size());
  std::optional<std::string> payload;
  REQUIRE(decoder.next(&payload).ok());
  REQUIRE(payload);
  CHECK(*payload == big);
  CHECK(decoder.held_bytes() <= kDecoderKeepBytes);
  // The partial frame behind it survives the shrink.
  decoder.feed(bytes_of(encode_frame("next").substr(6)));
  REQUIRE(decoder.next(&payload).ok());
  REQUIRE(payload);
  CHECK(*payload == "next");
  // A small frame's buffer is kept: no reallocation per frame.
  decoder.feed(bytes_of(encode_frame(std::string(100'000, 's'))));
  REQUIRE(decoder.next(&payload).ok());
  CHECK(decoder.held_bytes() >= 100'000);
  // release() frees a partial frame (a connection closing mid-frame).
  decoder.feed(bytes_of(encode_frame(big).substr(0, big.size() / 2)));
  CHECK(decoder.release() >= big.size() / 2);
  CHECK(decoder.held_bytes() < 100);
  CHECK(decoder.finish().ok());
}

TEST_CASE("announced_bytes reads the next frame's header before its payload is in", "[framing]") {
  FrameDecoder decoder;
  CHECK_FALSE(decoder.announced_bytes());
  const std::string frame = encode_frame(std::string(70'000, 'a'));
  decoder.feed(bytes_of(frame.substr(0, 3)));
  CHECK_FALSE(decoder.announced_bytes());  // three of the header's four bytes
  decoder.feed(bytes_of(frame.substr(3, 10)));
  REQUIRE(decoder.announced_bytes());
  CHECK(*decoder.announced_bytes() == 70'000);
  // An oversized announcement fails the decoder; nothing is announced after that.
  FrameDecoder failed;
  failed.feed(bytes_of(header_of(kMaxFrameBytes + 1)));
  std::optional<std::string> payload;
  CHECK_FALSE(failed.next(&payload).ok());
  CHECK_FALSE(failed.announced_bytes());
}

TEST_CASE("encode_frame refuses a payload over the limit", "[framing]") {
  const std::string payload(size_t{kMaxFrameBytes} + 1, 'z');
  try {
    (void)encode_frame(payload);
    FAIL("encode_frame accepted an oversized payload");
  } catch (const Error& error) {
    CHECK(error.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(error.status().message(), Catch::Contains(std::to_string(kMaxFrameBytes + 1)));
  }
  // Exactly at the limit is allowed.
  CHECK(encode_frame(std::string(kMaxFrameBytes, 'z')).size() == kFrameHeaderBytes + kMaxFrameBytes);
}

TEST_CASE("many frames in one read are handed out in order from an offset, a partial one completed by the next read",
          "[framing]") {
  // The decoder once moved the rest of the buffer to the front after every frame: a read of
  // thousands of small frames (a flood) cost the io thread quadratic time. Now it hands them out
  // from an offset and drops what it handed out once per read.
  FrameDecoder decoder;
  std::string stream;
  for (int i = 0; i < 10'000; ++i) stream += encode_frame("frame " + std::to_string(i));
  const std::string tail = encode_frame("the last, cut in two");
  decoder.feed(bytes_of(stream + tail.substr(0, 7)));
  std::optional<std::string> payload;
  for (int i = 0; i < 10'000; ++i) {
    REQUIRE(decoder.next(&payload).ok());
    REQUIRE(payload);
    REQUIRE(*payload == "frame " + std::to_string(i));
  }
  REQUIRE(decoder.next(&payload).ok());
  CHECK_FALSE(payload);
  CHECK(decoder.announced_bytes() == std::optional<uint32_t>(20));
  CHECK_FALSE(decoder.finish().ok());  // the cut frame, not the ones handed out
  decoder.feed(bytes_of(tail.substr(7)));
  REQUIRE(decoder.next(&payload).ok());
  REQUIRE(payload);
  CHECK(*payload == "the last, cut in two");
  CHECK(decoder.finish().ok());
}

}  // namespace
}  // namespace gradsync
