// The control socket's frame reader (shared/framing.h): whatever bytes arrive, in whatever
// chunks, the decoder yields the same frames as from the whole stream at once, never a payload
// over its limit, and once it fails it stays failed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shared/framing.h"

namespace {

constexpr uint32_t kMaxBytes = 1 << 16;  // small, so that oversized frames are reachable

// Every payload the decoder yields from `stream` fed in chunks of `chunk` bytes, and whether it
// failed.
std::vector<std::string> decode(std::span<const std::byte> stream, size_t chunk, bool* failed, bool* finished) {
  gradsync::FrameDecoder decoder(kMaxBytes);
  std::vector<std::string> payloads;
  *failed = false;
  for (size_t at = 0; at < stream.size() && !*failed; at += chunk) {
    decoder.feed(stream.subspan(at, std::min(chunk, stream.size() - at)));
    for (;;) {
      std::optional<std::string> payload;
      if (!decoder.next(&payload).ok()) {
        *failed = true;
        // Sticky: the stream cannot be resynchronized.
        std::optional<std::string> again;
        if (decoder.next(&again).ok() || again) std::abort();
        break;
      }
      if (!payload) break;
      if (payload->size() > kMaxBytes) std::abort();
      payloads.push_back(std::move(*payload));
    }
  }
  *finished = !*failed && decoder.finish().ok();
  return payloads;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t chunk = static_cast<size_t>(data[0]) + 1;  // the first byte picks the chunking
  const auto stream = std::as_bytes(std::span<const uint8_t>(data + 1, size - 1));
  bool failed_whole = false, failed_chunked = false, finished_whole = false, finished_chunked = false;
  const auto whole = decode(stream, stream.size() + 1, &failed_whole, &finished_whole);
  const auto chunked = decode(stream, chunk, &failed_chunked, &finished_chunked);
  if (whole != chunked || failed_whole != failed_chunked || finished_whole != finished_chunked) std::abort();
  size_t consumed = 0;
  for (const auto& payload : whole) consumed += gradsync::kFrameHeaderBytes + payload.size();
  if (consumed > stream.size()) std::abort();
  return 0;
}
