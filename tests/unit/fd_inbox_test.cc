// Matching descriptors to the frames they were sent with, by stream offset.
#include <unistd.h>

#include <catch2/catch.hpp>

#include "daemon/control/fd_inbox.h"

namespace gradsync {
namespace {

std::vector<UniqueFd> fds(int count) {
  std::vector<UniqueFd> out;
  for (int i = 0; i < count; ++i) out.emplace_back(::dup(0));
  return out;
}

}  // namespace

TEST_CASE("fd inbox: a batch belongs to the frame whose bytes it arrived with", "[fds]") {
  FdInbox inbox;
  inbox.add(30, fds(1));   // arrived with bytes of frame [20, 40)
  inbox.add(45, fds(2));   // frame [40, 60)
  std::vector<UniqueFd> got;
  REQUIRE(inbox.take(0, 20, 0, "Hello", &got).ok());
  CHECK(got.empty());
  REQUIRE(inbox.take(20, 40, 1, "Segment", &got).ok());
  CHECK(got.size() == 1);
  REQUIRE(inbox.take(40, 60, 2, "Segment", &got).ok());
  CHECK(got.size() == 2);
  CHECK(inbox.size() == 0);
}

TEST_CASE("fd inbox: descriptors no frame declares are refused", "[fds]") {
  FdInbox inbox;
  inbox.add(10, fds(1));
  std::vector<UniqueFd> got;
  const Status status = inbox.take(0, 20, 0, "Join", &got);
  CHECK(status.code() == ErrorCode::kProtocol);
  CHECK_THAT(status.message(), Catch::Contains("the Join request declares 0 file descriptor(s), but 1 were sent"));
  CHECK(got.empty());
}

TEST_CASE("fd inbox: a frame naming descriptors that were not sent with it is refused", "[fds]") {
  FdInbox inbox;
  inbox.add(50, fds(1));  // belongs to a later frame
  std::vector<UniqueFd> got;
  const Status status = inbox.take(0, 20, 1, "Segment", &got);
  CHECK(status.code() == ErrorCode::kProtocol);
  CHECK_THAT(status.message(), Catch::Contains("names 1 file descriptor(s), but 0 were sent"));
  CHECK(inbox.size() == 1);
}

}  // namespace gradsync
