// The client's completion bookkeeping, driven by a test that plays the daemon's side of the
// rings in memory of its own.
#include <catch2/catch.hpp>
#include <cstring>
#include <new>
#include <optional>

#include "client/src/completions.h"

namespace gradsync {
namespace {

struct FakeDaemon {
  FakeDaemon() : channel(std::make_shared<JobChannel>()) {
    doorbell = MappedMemfd::create("test", kDoorbellBytes);
    client = MappedMemfd::create("test", kClientRingsBytes);
    daemon = MappedMemfd::create("test", kDaemonRingsBytes);
    new (doorbell.data()) DoorbellPage();
    new (client.data()) ClientRings();
    rings = new (daemon.data()) DaemonRings();
    channel->doorbell = doorbell.release_mapping();
    channel->client_rings = client.release_mapping();
    channel->daemon_rings = daemon.release_mapping();
    writer.emplace(&rings->completion, &channel->client()->completion_cursor);
  }
  void complete(uint64_t seq, const Status& status) {
    CompletionEntry entry;
    entry.op_seq = seq;
    entry.code = static_cast<uint32_t>(status.code());
    entry.message_length = static_cast<uint32_t>(std::min(status.message().size(), kCompletionMessageBytes));
    std::memcpy(entry.message, status.message().data(), entry.message_length);
    REQUIRE(writer->try_push(entry));
  }
  void publish(const Status& status) {
    std::memcpy(rings->failure_message, status.message().data(), status.message().size());
    rings->failure_length = static_cast<uint32_t>(status.message().size());
    rings->failure_code.store(static_cast<uint32_t>(status.code()));
  }

  MappedMemfd doorbell, client, daemon;
  std::shared_ptr<JobChannel> channel;
  DaemonRings* rings = nullptr;
  std::optional<RingWriter<CompletionRing>> writer;
};

}  // namespace

TEST_CASE("completions: a failed operation stays failed however many operations follow", "[completions]") {
  FakeDaemon daemon;
  Completions completions(daemon.channel, [] { return Status(); });
  completions.expect(1);
  completions.expect(2);
  daemon.complete(1, Status());
  const Status failure = Status::peer_lost("job j: rank 3 (client pid 42) disconnected");
  daemon.publish(failure);
  daemon.complete(2, failure);
  Status status;
  REQUIRE(completions.poll(2, &status));
  CHECK(status.code() == ErrorCode::kPeerLost);
  // Far more operations than any table of outcomes would keep, all failed by the sticky error.
  for (uint64_t seq = 3; seq < 3 + (1 << 17); ++seq) completions.expect(seq);
  REQUIRE(completions.poll(2, &status));
  CHECK(status.code() == ErrorCode::kPeerLost);
  CHECK(status.message() == failure.message());
  REQUIRE(completions.poll(1, &status));
  CHECK(status.ok());
  REQUIRE(completions.poll(100'000, &status));
  CHECK(status.code() == ErrorCode::kPeerLost);
}

TEST_CASE("completions: a failure longer than a ring entry reaches the client whole", "[completions]") {
  FakeDaemon daemon;
  Completions completions(daemon.channel, [] { return Status(); });
  completions.expect(1);
  const Status failure = Status::peer_lost("job j: node 2 (ranks 4-5, gradsyncd at 10.0.0.3:29590) is gone (its daemon does not answer) (" +
                                           std::string(600, 'x') + ") end");
  daemon.publish(failure);
  daemon.complete(1, failure);
  Status status;
  REQUIRE(completions.poll(1, &status));
  CHECK(status.message() == failure.message());
}

TEST_CASE("completions: a completion posted before the failure counts as a success", "[completions]") {
  FakeDaemon daemon;
  Completions completions(daemon.channel, [] { return Status(); });
  completions.expect(1);
  completions.expect(2);
  daemon.complete(1, Status());
  daemon.publish(Status::aborted("gradsyncd is shutting down"));
  Status status;
  REQUIRE(completions.poll(1, &status));
  CHECK(status.ok());
  REQUIRE(completions.poll(2, &status));
  CHECK(status.code() == ErrorCode::kAborted);
}

TEST_CASE("completions: a daemon that went away fails the pending operations, naming it", "[completions]") {
  FakeDaemon daemon;
  bool gone = false;
  Completions completions(daemon.channel, [&] { return gone ? Status::peer_lost("gradsyncd at /x went away") : Status(); });
  completions.expect(1);
  gone = true;
  Status status;
  CHECK(completions.wait(1, std::chrono::steady_clock::now() + std::chrono::seconds(5), &status));
  CHECK(status.code() == ErrorCode::kPeerLost);
  CHECK(status.message() == "gradsyncd at /x went away");
}

}  // namespace gradsync
