// The client's pool of released sets' outputs (client/src/output_pool.h), host and device alike:
// a later set takes the smallest kept output that holds it on its own device, never another
// device's, and each kept output serves one set at a time.
#include "client/src/output_pool.h"

#include <catch2/catch.hpp>

namespace gradsync {
namespace {

struct FakeSegment {
  int id;
};

}  // namespace

TEST_CASE("client output pool: the smallest kept output that fits, on the same device, once", "[unit][client]") {
  FakeSegment big{1}, small{2}, other_gpu{3}, host{4};
  OutputPool<FakeSegment> pool;
  pool.give(&big, 0, 4 << 20);
  pool.give(&small, 0, 1 << 20);
  pool.give(&other_gpu, 1, 1 << 20);
  pool.give(&host, -1, 8 << 20);
  pool.give(nullptr, 0, 1 << 30);  // a set without that output gives nothing
  CHECK(pool.size() == 4);

  CHECK(pool.take(0, 16 << 20) == nullptr);  // none on GPU 0 holds it: the caller makes one
  CHECK(pool.take(0, 512 << 10) == &small);  // the smallest that fits, not the first given
  CHECK(pool.take(0, 512 << 10) == &big);    // taken ones are out of the pool
  CHECK(pool.take(0, 1) == nullptr);         // GPU 1's and the host's are not GPU 0's
  CHECK(pool.take(1, 1 << 20) == &other_gpu);  // exactly its size fits
  CHECK(pool.take(-1, 2 << 20) == &host);
  CHECK(pool.size() == 0);

  pool.give(&small, 0, 1 << 20);  // released again by a later set
  CHECK(pool.take(0, 1 << 20) == &small);
}

}  // namespace gradsync
