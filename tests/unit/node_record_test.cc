#include "daemon/job/node_record.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "shared/version.h"

namespace gradsync {
namespace {

TEST_CASE("node record: this daemon's record round-trips and states its protocol and version", "[node_record]") {
  const NodeRecord mine = NodeRecord::mine(8, "10.0.0.2:29590");
  const std::string text = mine.encode();
  CHECK(text == "8 10.0.0.2:29590 " + std::to_string(kCrossNodeProtocol) + " " + kGradsyncVersion);
  const auto back = NodeRecord::parse(text);
  REQUIRE(back);
  CHECK(back->local_world_size == 8);
  CHECK(back->address == "10.0.0.2:29590");
  CHECK(back->protocol == kCrossNodeProtocol);
  CHECK(back->version == kGradsyncVersion);
  CHECK(back->describe_version() ==
        "gradsyncd " + std::string(kGradsyncVersion) + " (cross-node protocol " + std::to_string(kCrossNodeProtocol) + ")");
  CHECK(NodeRecord::parse("2 [::1]:29590 7 1.0.0-rc1+abc")->version == "1.0.0-rc1+abc");
}

TEST_CASE("node record: a record from before the protocol was stated reads as protocol 0", "[node_record]") {
  const auto old = NodeRecord::parse("2 127.0.0.1:29590");
  REQUIRE(old);
  CHECK(old->protocol == 0);
  CHECK(old->local_world_size == 2);
  CHECK(old->describe_version() == "a gradsyncd older than 0.2.1 (cross-node protocol not stated)");
}

TEST_CASE("node record: a record of another protocol is read for its protocol and version only", "[node_record]") {
  // A later protocol may change the first two fields and add more after the fourth.
  const auto later = NodeRecord::parse("any-shape 10.0.0.2:1 99 1.0.0 and more fields");
  REQUIRE(later);
  CHECK(later->protocol == 99);
  CHECK(later->version == "1.0.0");
  CHECK(later->address == "10.0.0.2:1");
  CHECK(later->describe_version() == "gradsyncd 1.0.0 (cross-node protocol 99)");
  CHECK(NodeRecord::parse("x \x1b[2J 99 1.0.0")->address == "(unreadable)");
  // Its protocol and version must still be readable.
  CHECK_FALSE(NodeRecord::parse("2 10.0.0.2:1 seven 1.0.0"));
  CHECK_FALSE(NodeRecord::parse("2 10.0.0.2:1 99 \x1b[2J"));
}

TEST_CASE("node record: anything a gradsyncd would not write is refused", "[node_record]") {
  const std::string p = " " + std::to_string(kCrossNodeProtocol) + " ";  // this protocol
  for (const std::string& bad : std::vector<std::string>{
           "",                                   // nothing
           "2",                                  // no address
           "2 127.0.0.1:1 1",                    // a protocol without a version
           "2 127.0.0.1:1" + p + "0.2.1 extra",  // a fifth field, of this protocol
           "0 127.0.0.1:1" + p + "0.2.1",              // no ranks
           "-1 127.0.0.1:1" + p + "0.2.1",             // a sign
           "99999999999 127.0.0.1:1" + p + "0.2.1",    // out of range
           "0 127.0.0.1:1",                      // no ranks, before 0.2.1
           "2 host\x07:1",                       // a control character, before 0.2.1
           "2 127.0.0.1:1 0 0.2.1",              // protocol 0 is "not stated", never written
           "2 127.0.0.1:1 -1 0.2.1",             // a sign
           "2 127.0.0.1:1 4294967296 0.2.1",     // past 32 bits
           "2 127.0.0.1:1" + p + "\x1b[31mred",        // a terminal escape in the version
           "2 127.0.0.1:1" + p + "caf\xc3\xa9",        // non-ASCII in the version
           "2 127.0.0.1:1" + p + std::string(33, '1'),  // a version past 32 bytes
           "2 host\x07:1" + p + "0.2.1",               // a control character in the address
           "2 " + std::string(301, 'h') + p + "0.2.1",  // an address past 300 bytes
           "2  127.0.0.1:1" + p + "0.2.1",             // an empty field
           "2 127.0.0.1:1" + p + "0.2.1 ",             // a trailing space
           "2 127.0.0.1:1\n1 0.2.1",             // a newline
       }) {
    INFO(bad);
    CHECK_FALSE(NodeRecord::parse(bad));
  }
}

}  // namespace
}  // namespace gradsync
