// The settings of a running job that an operator may change (SetConfig): the bucket cap of its
// host sets and its two bounds. Each field is optional: a change names only what it changes.
// A change takes effect at an operation sequence number that every node of the job agrees on
// (config_channel.h), so buckets never differ between nodes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace gradsync {

struct JobSettings {
  std::optional<uint64_t> bucket_cap;  // bytes; 0: one bucket per (group, dtype)
  std::optional<std::chrono::milliseconds> timeout;
  std::optional<std::chrono::milliseconds> execution_timeout;

  bool empty() const { return !bucket_cap && !timeout && !execution_timeout; }
  // Takes every field `later` sets.
  void merge(const JobSettings& later);
  // "bucket cap 1048576 bytes, timeout 5000 ms"
  std::string describe() const;
  // Bounds every node checks alike: a timeout is from 1 ms to a day.
  static constexpr std::chrono::milliseconds kMaxBound = std::chrono::hours(24);
  // What is out of range, empty when nothing is.
  std::string invalid() const;
  // A short text form for the rendezvous store, and back; decode is false on anything else,
  // and on values out of range.
  std::string encode() const;
  static bool decode(const std::string& text, JobSettings* out);
};

}  // namespace gradsync
