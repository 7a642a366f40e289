// Removes shared-memory names that a crashed process left behind. Every gradsync name carries
// its creator's pid ("gradsync-<tag>-<pid>-<counter>-<random>"); a name whose creator is gone and
// that belongs to this daemon's user can only be litter, because names are removed as soon as
// both sides have mapped them. Run once at daemon start.
#pragma once

#include <cstddef>
#include <string>

namespace gradsync {

// Returns how many names were removed. `directory` is /dev/shm outside tests.
size_t sweep_stale_segments(const std::string& directory = "/dev/shm");

}  // namespace gradsync
