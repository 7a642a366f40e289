// The Chrome trace JSON DumpTrace returns: names that come from clients are escaped, and the
// events say what the tracks and slices are.
#include <catch2/catch.hpp>

#include "daemon/admin/chrome_trace.h"

namespace gradsync::admin {

TEST_CASE("chrome trace: client-chosen names cannot break the JSON", "[admin]") {
  CHECK(json_string("plain") == "\"plain\"");
  CHECK(json_string("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(json_string(std::string("new\nline\x01\x7f\xff", 11)) == "\"new\\u000aline\\u0001\\u007f\\u00ff\"");
  // Valid UTF-8 passes through; broken, overlong or surrogate sequences are escaped byte by byte.
  CHECK(json_string("gr\xc3\xbc\xc3\x9f" "e \xe2\x82\xac") == "\"gr\xc3\xbc\xc3\x9f" "e \xe2\x82\xac\"");
  CHECK(json_string("\xc3") == "\"\\u00c3\"");
  CHECK(json_string("\xc0\xaf") == "\"\\u00c0\\u00af\"");
  CHECK(json_string("\xed\xa0\x80") == "\"\\u00ed\\u00a0\\u0080\"");
}

TEST_CASE("chrome trace: an operation, each rank's readiness and the bucket's execution", "[admin]") {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  JobTrace job;
  job.job.id = "job\"x";
  job.job.uid = 7;
  job.job.local_world_size = 2;
  OpTrace op;
  op.seq = 3;
  op.kind = "allreduce(sum) on set 0";
  op.started = t0;
  op.finished = t0 + std::chrono::milliseconds(5);
  BucketTrace bucket;
  bucket.index = 0;
  bucket.group = "dp";
  bucket.bytes = 64;
  bucket.ready = {t0 + std::chrono::milliseconds(1), t0 + std::chrono::milliseconds(3)};
  bucket.launched = t0 + std::chrono::milliseconds(3);
  bucket.landed = t0 + std::chrono::milliseconds(5);
  bucket.parts.reported = true;
  bucket.parts.cross_node = true;
  bucket.parts.peers = std::chrono::milliseconds(1);
  op.buckets.push_back(bucket);
  job.operations.push_back(op);
  const std::string json = chrome_trace_json({job});
  CHECK_THAT(json, Catch::StartsWith("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["));
  CHECK_THAT(json, Catch::Contains("\"name\":\"job job\\\"x (uid 7, node 0 of 1)\""));
  CHECK_THAT(json, Catch::Contains("{\"ph\":\"X\",\"pid\":1,\"tid\":0,\"name\":\"op 3 allreduce(sum) on set 0\","
                                   "\"ts\":0.000,\"dur\":5000.000"));
  // Rank 1 made the bucket ready 3 ms in: the straggler's slice is the long one.
  CHECK_THAT(json, Catch::Contains("\"tid\":1,\"name\":\"bucket 0 ready\",\"ts\":0.000,\"dur\":1000.000"));
  CHECK_THAT(json, Catch::Contains("\"tid\":2,\"name\":\"bucket 0 ready\",\"ts\":0.000,\"dur\":3000.000"));
  CHECK_THAT(json, Catch::Contains("\"name\":\"bucket 0 (dp)\",\"ts\":3000.000,\"dur\":2000.000"));
  CHECK_THAT(json, Catch::Contains("\"waiting_for_peers_us\":1000.000"));
  CHECK_THAT(json, Catch::Contains("\"name\":\"waiting for peers\",\"ts\":3000.000,\"dur\":1000.000"));
}

}  // namespace gradsync::admin
