// Local limits (issue 10, item 3): what one user, client or job may hold in the daemon. Each
// limit, when hit, refuses the offending request with an error naming the limit and its
// setting; the daemon and the other clients carry on. Setup work (channels, segments, large
// registrations) runs off the io thread, and the daemon's memory comes back after it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/src/connection.h"
#include "shared/memfd.h"
#include "shared/version.h"
#include "tests/integration/harness.h"
#include "tests/integration/raw_protocol.h"
#include "tests/integration/users.h"

namespace gradsync::test {
namespace {

// The control protocol by hand on a RawSocket, so that requests can be pipelined.
class RawClient {
 public:
  explicit RawClient(const std::string& socket) : socket_(socket) {}

  control::Reply hello() {
    control::Request request;
    request.mutable_hello()->set_protocol_version(kProtocolVersion);
    return call(std::move(request));
  }
  control::Reply join(const std::string& job, int world, int rank, uint32_t timeout_ms = 0) {
    control::Request request;
    auto* j = request.mutable_join();
    j->set_job_id(job);
    j->set_rank(rank);
    j->set_local_rank(rank);
    j->set_world_size(world);
    j->set_local_world_size(world);
    j->set_timeout_ms(timeout_ms);
    return call(std::move(request));
  }
  // A sealed memfd of `bytes` as a segment; the memory stays mapped here.
  control::Reply segment(size_t bytes) {
    memory_.push_back(std::make_unique<MappedMemfd>(MappedMemfd::create("test", bytes)));
    memory_.back()->seal(kSizeSeals);
    control::Request request;
    request.mutable_segment()->set_kind(control::HOST_MEMFD);
    request.mutable_segment()->set_bytes(bytes);
    request.set_fd_count(1);
    request.set_id(++id_);
    socket_.send(frame_of(request), {memory_.back()->fd().get()});
    return socket_.read_reply();
  }
  // A segment of `bytes` that is a sealed memfd nobody here maps: sparse, it costs no memory.
  control::Reply sparse_segment(uint64_t bytes) {
    const UniqueFd fd(::memfd_create("gradsync-sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(fd.valid());
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0);
    REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, kSizeSeals) == 0);
    control::Request request;
    request.mutable_segment()->set_kind(control::HOST_MEMFD);
    request.mutable_segment()->set_bytes(bytes);
    request.set_fd_count(1);
    request.set_id(++id_);
    socket_.send(frame_of(request), {fd.get()});
    return socket_.read_reply();
  }
  // `count` float32 tensors of one element each, back to back in segment `segment_id`.
  static control::Request registration(uint32_t set_id, uint32_t segment_id, size_t count) {
    control::Request request;
    auto* r = request.mutable_register_();
    r->set_set_id(set_id);
    r->mutable_tensors()->Reserve(static_cast<int>(count));
    for (size_t i = 0; i < count; ++i) {
      auto* t = r->add_tensors();
      t->set_dtype(control::FLOAT32);
      t->set_numel(1);
      t->set_segment_id(segment_id);
      t->set_offset(i * 4);
    }
    return request;
  }
  void send(control::Request request) {
    request.set_id(++id_);
    socket_.send(frame_of(request));
  }
  control::Reply call(control::Request request) {
    send(std::move(request));
    return socket_.read_reply();
  }
  RawSocket& socket() { return socket_; }
  // The memory of the last segment() made.
  std::byte* last_segment_memory() { return memory_.back()->data(); }

 private:
  RawSocket socket_;
  uint64_t id_ = 0;
  std::vector<std::unique_ptr<MappedMemfd>> memory_;
};

std::string error_of(const control::Reply& reply) { return reply.has_error() ? reply.error().message() : ""; }

// check_still_serving() once what a client gave back has been noticed (a closed connection is
// seen by the daemon a moment later): retried for up to 5 s while refused for `setting`.
void eventually_serving(const TestDaemon& daemon, const std::string& setting) {
  for (int attempt = 0;; ++attempt) {
    try {
      check_still_serving(daemon);
      return;
    } catch (const Error& e) {
      INFO(e.what());
      REQUIRE_THAT(e.status().message(), Catch::Contains(setting));
      REQUIRE(attempt < 100);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}


}  // namespace

TEST_CASE("limits: a user's connections are bounded, the refused one is told the setting, the rest carry on",
          "[integration][limits]") {
  TestDaemon daemon({"--max-connections-per-user", "3"});
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawClient>(daemon.socket()));
    REQUIRE(error_of(held.back()->hello()).empty());
  }
  RawClient fourth(daemon.socket());
  const std::string refused = error_of(fourth.socket().read_reply());
  CHECK_THAT(refused, Catch::Contains("limit reached") && Catch::Contains("3 connections") &&
                          Catch::Contains("gradsyncd --max-connections-per-user 3"));
  held.pop_back();  // one goes; its place is free once the daemon has noticed
  bool served = false;
  for (int attempt = 0; attempt < 50 && !served; ++attempt) {
    RawClient again(daemon.socket());
    served = error_of(again.hello()).empty();
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(served);
  held.clear();
  eventually_serving(daemon, "--max-connections-per-user");
  CHECK(daemon.running());
}

TEST_CASE("limits: jobs are bounded per user and in all", "[integration][limits]") {
  SECTION("per user") {
    TestDaemon daemon({"--max-jobs-per-user", "2"});
    RawClient a(daemon.socket()), b(daemon.socket()), c(daemon.socket());
    for (RawClient* client : {&a, &b, &c}) client->hello();
    const std::string two = unique_job("two");
    REQUIRE(error_of(a.join(unique_job("one"), 1, 0)).empty());
    REQUIRE(error_of(b.join(two, 2, 0)).empty());
    const std::string refused = error_of(c.join(unique_job("three"), 1, 0));
    CHECK_THAT(refused, Catch::Contains("already holds 2 jobs") && Catch::Contains("gradsyncd --max-jobs-per-user 2"));
    // Joining a job that exists is not a new job.
    RawClient d(daemon.socket());
    d.hello();
    CHECK(error_of(d.join(two, 2, 1)).empty());
  }
  SECTION("in all") {
    TestDaemon daemon({"--max-jobs", "2"});
    RawClient a(daemon.socket()), b(daemon.socket()), c(daemon.socket());
    for (RawClient* client : {&a, &b, &c}) client->hello();
    REQUIRE(error_of(a.join(unique_job("one"), 1, 0)).empty());
    REQUIRE(error_of(b.join(unique_job("two"), 1, 0)).empty());
    CHECK_THAT(error_of(c.join(unique_job("three"), 1, 0)),
               Catch::Contains("already has 2 jobs") && Catch::Contains("gradsyncd --max-jobs 2"));
  }
}

TEST_CASE("limits: a failed job whose member stays still counts against the job limits, and that member is "
          "disconnected after --connection-timeout-ms",
          "[integration][limits]") {
  TestDaemon daemon({"--max-jobs-per-user", "2", "--connection-timeout-ms", "1000"});
  const std::string x = unique_job("x");
  auto a = std::make_unique<RawClient>(daemon.socket());
  a->hello();
  REQUIRE(error_of(a->join(x, 2, 0)).empty());
  {
    RawClient b(daemon.socket());
    b.hello();
    REQUIRE(error_of(b.join(x, 2, 1)).empty());
  }  // b leaves: x fails; a stays in it
  // A new incarnation of x forms beside the failed one, which a keeps alive: two jobs.
  RawClient c(daemon.socket());
  c.hello();
  control::Reply joined;
  for (int attempt = 0; attempt < 50; ++attempt) {
    joined = c.join(x, 2, 0);
    if (error_of(joined).empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(error_of(joined).empty());
  RawClient d(daemon.socket());
  d.hello();
  CHECK_THAT(error_of(d.join(unique_job("y"), 1, 0)),
             Catch::Contains("already holds 2 jobs") && Catch::Contains("--max-jobs-per-user 2"));
  // a neither leaves nor re-joins: the daemon closes it, telling it why, and the failed job goes.
  const control::Reply notice = a->socket().read_reply(std::chrono::seconds(15));
  CHECK_THAT(error_of(notice), Catch::Contains("the job failed and the client neither left nor joined again"));
  a.reset();
  bool formed = false;
  for (int attempt = 0; attempt < 100 && !formed; ++attempt) {
    RawClient e(daemon.socket());
    e.hello();
    formed = error_of(e.join(unique_job("z"), 1, 0)).empty();
    if (!formed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(formed);
}

TEST_CASE("limits: a large request before joining is refused before it is parsed, or even buffered",
          "[integration][limits]") {
  TestDaemon daemon;
  RawClient client(daemon.socket());
  client.hello();
  // Only the header and a few bytes are sent: the refusal comes without the rest (sending it
  // all would race with the daemon closing the connection).
  const std::string frame = frame_of(RawClient::registration(1, 1, 100'000));
  client.socket().send(frame.substr(0, 100));
  const std::string reply = client.socket().read_to_end();
  CHECK_THAT(first_error(reply), Catch::Contains("a request of " + std::to_string(frame.size() - kFrameHeaderBytes) +
                                                 " bytes before joining a job"));
  check_still_serving(daemon);
}

TEST_CASE("limits: a user's registrations waiting for their barrier are bounded", "[integration][limits]") {
  TestDaemon daemon({"--max-pending-registrations-per-user", "2"});
  auto owner = std::make_unique<RawClient>(daemon.socket());
  RawClient& client = *owner;
  client.hello();
  // Rank 1 never joins: every set waits for it (up to the 20 s job timeout).
  REQUIRE(error_of(client.join(unique_job("waiting"), 2, 0, 20'000)).empty());
  const uint32_t segment = client.segment(4096).segment().segment_id();
  // Three registrations in a row, without waiting: the first two wait, the third is refused.
  for (uint32_t set = 1; set <= 3; ++set) client.send(RawClient::registration(set, segment, 4));
  const control::Reply reply = client.socket().read_reply();
  CHECK(reply.id() == 6);  // hello 1, join 2, segment 3, sets 1 to 3: 4 to 6
  CHECK_THAT(error_of(reply), Catch::Contains("2 tensor-set registrations waiting") &&
                                   Catch::Contains("gradsyncd --max-pending-registrations-per-user 2"));
  // The user's other clients are refused too while the two wait; once they are gone (their
  // client left, failing them), registering works again.
  owner.reset();
  eventually_serving(daemon, "--max-pending-registrations-per-user");
}

namespace {

// The machine's physical memory, as gradsyncd reads it for its byte budgets' defaults.
uint64_t physical_memory() {
  return std::max<uint64_t>(static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)),
                            uint64_t{1} << 30);
}

// In a child that becomes the test user: joins a job, registers, and verifies a few sums.
int victim_runs(const std::string& socket, const std::string& job) {
  if (!become(test_user())) return fail("cannot become the test user");
  auto client = join(socket, job, 0, 1);
  const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 4096}}), {});
  for (int step = 0; step < 5; ++step) {
    for (float& v : set.tensor(0).as<float>()) v = 3.0f;
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(10))) {
      return fail("the victim's step timed out");
    }
    for (float v : set.tensor(0).as<float>()) {
      if (v != 3.0f) return fail("the victim's sum was wrong");
    }
  }
  return kOk;
}

}  // namespace

// The outside review's attack: 76 empty sealed memfds took 128 TiB of the daemon's address
// space at almost no memory, and every later join by any user failed. With the default budgets
// (from this machine's memory) no segment may be larger than the physical memory, nor one
// user's together; another user joins and runs meanwhile.
TEST_CASE("limits: sparse memfds cannot take the daemon's address space, another user still joins and runs",
          "[integration][limits][budget]") {
  const std::string user = std::to_string(test_user().uid);
  TestDaemon daemon({"--allow-uid", "0", "--allow-uid", user});
  open_socket_folder(daemon);
  const uint64_t physical = physical_memory();
  auto owner = std::make_unique<RawClient>(daemon.socket());
  RawClient& attacker = *owner;
  attacker.hello();
  REQUIRE(error_of(attacker.join(unique_job("sparse"), 1, 0)).empty());
  constexpr uint64_t kHuge = uint64_t{17} << 39;  // 8.5 TiB each: 76 of them pass 128 TiB... twice
  int refused_size = 0;
  for (int i = 0; i < 76; ++i) {
    const std::string error = error_of(attacker.sparse_segment(kHuge));
    if (error.find("gradsyncd --max-segment-bytes " + std::to_string(physical)) != std::string::npos) ++refused_size;
  }
  CHECK(refused_size == 76);
  // At the largest size allowed: one fits this user's budget, the next does not.
  CHECK(error_of(attacker.sparse_segment(physical)).empty());
  const std::string over = error_of(attacker.sparse_segment(physical));
  CHECK_THAT(over, Catch::Contains("gradsyncd --max-bytes-per-user " + std::to_string(physical)) &&
                       Catch::Contains("uid 0's segments and registrations already take"));
  // Another user joins and runs while the attacker holds what it got.
  ClientGroup victim(1, [&](int) { return victim_runs(daemon.socket(), unique_job("victim")); });
  for (int s : victim.wait_all(std::chrono::seconds(60))) CHECK(exit_code(s) == kOk);
  CHECK(daemon.running());
  // A client that goes gives its bytes back: the same user may take the largest size again.
  owner.reset();
  RawClient again(daemon.socket());
  again.hello();
  bool taken = false;
  for (int attempt = 0; attempt < 100 && !taken; ++attempt) {
    taken = error_of(again.sparse_segment(physical)).empty();
    if (!taken) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(taken);
}

// Registrations waiting for their barrier hold the daemon's memory (their tables): they count
// against the same byte budget as segments, 64 bytes a tensor.
TEST_CASE("limits: waiting million-tensor registrations are charged to the user's byte budget",
          "[integration][limits][budget]") {
  const std::string user = std::to_string(test_user().uid);
  constexpr uint64_t kTensors = 1'000'000;
  constexpr uint64_t kSegment = kTensors * 4;
  // The segment and 8 registrations fit; the 9th does not.
  const uint64_t budget = kSegment + 8 * kTensors * 64;  // 64 bytes a waiting tensor
  TestDaemon daemon({"--allow-uid", "0", "--allow-uid", user, "--max-bytes-per-user", std::to_string(budget),
                     "--max-tensors-per-client", "40000000", "--max-pending-registrations-per-user", "64"});
  open_socket_folder(daemon);
  RawClient attacker(daemon.socket());
  attacker.hello();
  // Rank 1 never joins: every set waits for it.
  REQUIRE(error_of(attacker.join(unique_job("pending"), 2, 0, 60'000)).empty());
  const uint32_t segment = attacker.segment(kSegment).segment().segment_id();
  const control::Request one = RawClient::registration(1, segment, kTensors);
  for (uint32_t set = 1; set <= 32; ++set) {
    control::Request request = one;
    request.mutable_register_()->set_set_id(set);
    attacker.send(std::move(request));
  }
  // The first 8 wait (no reply); the other 24 are refused, each naming the limit.
  int refused = 0;
  for (int i = 0; i < 24; ++i) {
    const control::Reply reply = attacker.socket().read_reply(std::chrono::seconds(60));
    INFO(error_of(reply));
    CHECK(reply.id() == static_cast<uint64_t>(3 + 9 + i));  // hello 1, join 2, segment 3; sets 9 to 32
    if (error_of(reply).find("registering 1000000 tensors: limit reached") != std::string::npos &&
        error_of(reply).find("gradsyncd --max-bytes-per-user " + std::to_string(budget)) != std::string::npos) {
      ++refused;
    }
  }
  CHECK(refused == 24);
  ClientGroup victim(1, [&](int) { return victim_runs(daemon.socket(), unique_job("victim")); });
  for (int s : victim.wait_all(std::chrono::seconds(60))) CHECK(exit_code(s) == kOk);
  CHECK(daemon.running());
}

TEST_CASE("limits: a set whose reply would not fit in a frame is refused before it is committed, and the daemon "
          "serves on", "[integration][limits]") {
  // A million one-element tensors, each its own bucket (a cap of 1 byte): the request is about
  // 12 MB, within the 16 MiB frame; the reply, which names every bucket's tensors, would be
  // about 17 MB. The daemon once committed the set and then, failing to encode the reply,
  // let the exception end its io thread: it exited, and every job on the node with it.
  constexpr uint64_t kTensors = 1'000'000;
  TestDaemon daemon;
  RawClient client(daemon.socket());
  client.hello();
  REQUIRE(error_of(client.join(unique_job("big-reply"), 1, 0)).empty());
  const uint32_t segment = client.segment(kTensors * 4).segment().segment_id();
  control::Request request = RawClient::registration(1, segment, kTensors);
  request.mutable_register_()->set_has_bucket_cap(true);
  request.mutable_register_()->set_bucket_cap_bytes(1);
  const control::Reply refused = client.call(std::move(request));
  CHECK_THAT(error_of(refused), Catch::Contains("over the control protocol's frame limit of 16777216") &&
                                    Catch::Contains("raise bucket_cap"));
  // The same tensors in 25 MiB buckets fit, on the same connection.
  const control::Reply registered = client.call(RawClient::registration(2, segment, kTensors));
  CHECK(error_of(registered).empty());
  CHECK(registered.register_().buckets_size() == 1);
  CHECK(daemon.running());
  check_still_serving(daemon);
}

namespace {

// Sends `frames` without ever reading, without blocking: as far as the daemon reads them within
// `patience` of the last progress. Returns how many whole frames went out.
size_t send_unread(int fd, const std::vector<std::string>& frames, std::chrono::milliseconds patience) {
  std::string pending;
  size_t next = 0, sent_whole = 0;
  auto progressed = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - progressed < patience) {
    if (pending.empty()) {
      if (next == frames.size()) break;
      pending = frames[next++];
    }
    const ssize_t n = ::send(fd, pending.data(), pending.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      pending.erase(0, static_cast<size_t>(n));
      if (pending.empty()) ++sent_whole;
      progressed = std::chrono::steady_clock::now();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return sent_whole;
}

control::Request numbered(control::Request request, uint64_t id) {
  request.set_id(id);
  return request;
}

}  // namespace

TEST_CASE("limits: a client that does not read its replies is no longer read: repeated joins pin no descriptors, "
          "others are served, and its closing frees its session", "[integration][limits]") {
  // Each Join reply carries three memfds (the job's rings, about 330 KiB). A connection that
  // sent 7,000 Joins and read nothing once held 20,000 descriptors and 2.2 GB in the daemon's
  // queue, until other users' joins failed for want of descriptors.
  TestDaemon daemon({"--connection-timeout-ms", "2000"});
  check_still_serving(daemon);
  const size_t before = open_fd_count(daemon.pid());
  {
    RawSocket attacker(daemon.socket());
    control::Request hello;
    hello.mutable_hello()->set_protocol_version(kProtocolVersion);
    std::vector<std::string> frames = {frame_of(numbered(hello, 1))};
    for (uint64_t i = 0; i < 3000; ++i) {
      control::Request join;
      auto* j = join.mutable_join();
      j->set_job_id(unique_job("pin"));
      j->set_world_size(1);
      j->set_local_world_size(1);
      frames.push_back(frame_of(numbered(join, i + 2)));
    }
    const size_t sent = send_unread(attacker.fd(), frames, std::chrono::seconds(2));
    INFO(sent << " frames sent");
    const size_t held = open_fd_count(daemon.pid());
    INFO("the daemon holds " << held << " descriptors, " << before << " before");
    CHECK(held < before + 64);
    check_still_serving(daemon);  // another client joins and reduces meanwhile
  }
  // A connection that is not joined and sends Hellos it never reads: the daemon stops reading
  // it, closes it at the idle bound, and after a 2 s linger for the replies it never takes lets
  // the session go. (This check passed before the linger too, for a reason not found: it does
  // not show that the linger is needed.)
  {
    RawSocket idle(daemon.socket());
    control::Request hello;
    hello.mutable_hello()->set_protocol_version(kProtocolVersion);
    std::vector<std::string> frames;
    for (uint64_t i = 0; i < 20000; ++i) frames.push_back(frame_of(numbered(hello, i + 1)));
    send_unread(idle.fd(), frames, std::chrono::seconds(1));
    bool freed = false;
    for (int i = 0; i < 100 && !freed; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      freed = open_fd_count(daemon.pid()) <= before;
    }
    INFO("the daemon holds " << open_fd_count(daemon.pid()) << " descriptors, " << before << " before");
    CHECK(freed);  // while this side still holds its end, unread
  }
  CHECK(daemon.running());
}

TEST_CASE("limits: refused requests and refused connections are logged a line a second, not one each",
          "[integration][limits]") {
  // Empty frames are refused requests; a connection that wrote them as fast as it could once
  // wrote 1.6 million log lines in 5 s. Connections over the user's limit likewise.
  TestDaemon daemon({"--max-connections-per-user", "2"});
  const auto count = [&](const std::string& what) {
    const std::string log = daemon.log();
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  {
    RawSocket flood(daemon.socket());
    const std::string empty(kFrameHeaderBytes, '\0');  // a frame of 0 bytes: no request type
    std::vector<std::string> frames(20000, empty);
    const size_t sent = send_unread(flood.fd(), frames, std::chrono::seconds(2));
    INFO(sent << " empty frames sent");
    CHECK(sent > 1000);
  }
  std::vector<std::unique_ptr<RawSocket>> refused;
  for (int i = 0; i < 200; ++i) refused.push_back(std::make_unique<RawSocket>(daemon.socket()));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  INFO(daemon.log().substr(0, 3000));
  CHECK(count("request refused") <= 10);
  CHECK(count("request refused") >= 1);
  CHECK(count("--max-connections-per-user") <= 10);
  CHECK(count("--max-connections-per-user") >= 1);
  refused.clear();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the daemon sees them all go
  check_still_serving(daemon);
}

TEST_CASE("limits: a set's mask is charged to the user's byte budget while the set lives", "[integration][limits]") {
  // One segment of a million indices served as the mask of any number of sets, each copied into
  // the daemon (about 16 bytes an index), charged to nobody: a few requests took the daemon
  // to gigabytes. Now each costs 32 bytes an index against --max-bytes-per-user until released.
  constexpr uint64_t kIndices = 1 << 20;
  constexpr uint64_t kSegment = kIndices * 8;
  constexpr uint64_t kMaskCharge = kIndices * 32;
  const uint64_t budget = kSegment + 3 * kMaskCharge + kMaskCharge / 2;  // three masks fit, not four
  TestDaemon daemon({"--max-bytes-per-user", std::to_string(budget)});
  RawClient client(daemon.socket());
  client.hello();
  REQUIRE(error_of(client.join(unique_job("masks"), 1, 0)).empty());
  const uint32_t segment = client.segment(kSegment).segment().segment_id();
  auto* indices = reinterpret_cast<uint64_t*>(client.last_segment_memory());
  for (uint64_t i = 0; i < kIndices; ++i) indices[i] = i;
  const auto masked = [&](uint32_t set_id) {
    control::Request request;
    auto* r = request.mutable_register_();
    r->set_set_id(set_id);
    auto* t = r->add_tensors();  // one uint8 tensor over the whole segment, the mask over it too
    t->set_dtype(control::UINT8);
    t->set_numel(kSegment);
    t->set_segment_id(segment);
    t->set_offset(0);
    r->set_has_mask(true);
    r->set_mask_segment_id(segment);
    r->set_mask_offset(0);
    r->set_mask_count(kIndices);
    return client.call(std::move(request));
  };
  for (uint32_t set = 1; set <= 3; ++set) {
    INFO("set " << set);
    CHECK(error_of(masked(set)).empty());
  }
  // A second registration of an id in use is refused, and leaves the first one's charge alone
  // (it once released it, so that set 4 then fit).
  CHECK_FALSE(error_of(masked(3)).empty());
  CHECK_THAT(error_of(masked(4)), Catch::Contains("registering set 4's mask of 1048576 indices") &&
                                      Catch::Contains("--max-bytes-per-user " + std::to_string(budget)));
  // A released set gives its charge back.
  control::Request release;
  release.mutable_release()->set_set_id(1);
  CHECK(error_of(client.call(std::move(release))).empty());
  CHECK(error_of(masked(5)).empty());
  check_still_serving(daemon);
}

TEST_CASE("limits: segments are bounded per client and per user", "[integration][limits]") {
  TestDaemon daemon({"--max-segments-per-client", "3", "--max-segments-per-user", "5"});
  auto a = std::make_unique<RawClient>(daemon.socket());
  a->hello();
  for (int i = 0; i < 3; ++i) REQUIRE(error_of(a->segment(4096)).empty());
  CHECK_THAT(error_of(a->segment(4096)),
             Catch::Contains("already announced 3 memory segments") && Catch::Contains("--max-segments-per-client 3"));
  RawClient b(daemon.socket());
  b.hello();
  for (int i = 0; i < 2; ++i) REQUIRE(error_of(b.segment(4096)).empty());
  CHECK_THAT(error_of(b.segment(4096)),
             Catch::Contains("already holds 5 memory segments") && Catch::Contains("--max-segments-per-user 5"));
  // A client that goes gives its segments back.
  a.reset();
  bool taken = false;
  for (int attempt = 0; attempt < 50 && !taken; ++attempt) {
    taken = error_of(b.segment(4096)).empty();
    if (!taken) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(taken);
  CHECK(daemon.running());
}

TEST_CASE("free: a freed segment gives its count and bytes back, and unknown, freed and in-use segments are refused by "
          "name",
          "[integration][limits][free]") {
  // Budget for two segments of 1 MiB at once; ten rounds of two only fit if each free gives
  // back both the count and the bytes.
  TestDaemon daemon({"--max-segments-per-client", "2", "--max-bytes-per-user", std::to_string(2u << 20)});
  RawClient client(daemon.socket());
  client.hello();
  const auto free_segment = [&](uint32_t id) {
    control::Request request;
    request.mutable_free_segment()->set_segment_id(id);
    return client.call(std::move(request));
  };
  for (int round = 0; round < 10; ++round) {
    INFO("round " << round);
    const control::Reply first = client.segment(1u << 20), second = client.segment(1u << 20);
    REQUIRE(error_of(first).empty());
    REQUIRE(error_of(second).empty());
    CHECK_THAT(error_of(client.segment(4096)), Catch::Contains("--max-segments-per-client 2"));
    CHECK(error_of(free_segment(first.segment().segment_id())).empty());
    CHECK(error_of(free_segment(second.segment().segment_id())).empty());
    CHECK_THAT(error_of(free_segment(first.segment().segment_id())),
               Catch::Contains("free: segment " + std::to_string(first.segment().segment_id()) +
                               " is not one of this client's"));
  }
  CHECK_THAT(error_of(free_segment(999)), Catch::Contains("free: segment 999 is not one of this client's"));
  // A set waiting for its barrier (rank 1 never joins) holds its segment: refused, naming why.
  REQUIRE(error_of(client.join(unique_job("free-raw"), 2, 0, 60'000)).empty());
  const uint32_t held = client.segment(4096).segment().segment_id();
  client.send(RawClient::registration(1, held, 1));
  CHECK_THAT(error_of(free_segment(held)), Catch::Contains("free: segment " + std::to_string(held) +
                                                           " is still used by a set of this client's"));
  check_still_serving(daemon);
}

TEST_CASE("limits: registered tensors are bounded per client", "[integration][limits]") {
  TestDaemon daemon({"--max-tensors-per-client", "10"});
  RawClient client(daemon.socket());
  client.hello();
  REQUIRE(error_of(client.join(unique_job("tensors"), 1, 0)).empty());
  const uint32_t segment = client.segment(4096).segment().segment_id();
  CHECK_THAT(error_of(client.call(RawClient::registration(1, segment, 11))),
             Catch::Contains("would register 11 tensors") && Catch::Contains("--max-tensors-per-client 10"));
  const control::Reply registered = client.call(RawClient::registration(2, segment, 10));
  CHECK(error_of(registered).empty());
  CHECK(registered.id() == 5);  // answered by the barrier, to the request that asked (hello 1 ... set 1 is 4)
  CHECK_THAT(error_of(client.call(RawClient::registration(3, segment, 1))),
             Catch::Contains("--max-tensors-per-client 10"));
  check_still_serving(daemon);
}

TEST_CASE("release: a set not registered, or still being registered, is refused by name", "[integration][release]") {
  TestDaemon daemon;
  RawClient client(daemon.socket());
  client.hello();
  control::Request release;
  release.mutable_release()->set_set_id(0);
  CHECK_THAT(error_of(client.call(release)), Catch::Contains("join a job before releasing a set"));
  // Rank 1 never joins: set 1's registration waits for it.
  REQUIRE(error_of(client.join(unique_job("release-raw"), 2, 0, 60'000)).empty());
  const uint32_t segment = client.segment(4096).segment().segment_id();
  client.send(RawClient::registration(1, segment, 1));
  release.mutable_release()->set_set_id(1);
  CHECK_THAT(error_of(client.call(release)), Catch::Contains("set 1 of job") && Catch::Contains("still being registered"));
  release.mutable_release()->set_set_id(7);
  CHECK_THAT(error_of(client.call(release)), Catch::Contains("set 7 is not registered in job"));
  check_still_serving(daemon);
}

TEST_CASE("release: a released set's id is never registered again", "[integration][release]") {
  // Per-set state (an executor's tables, other nodes' layout records) is keyed by the id; a
  // hostile client alone on its node could otherwise hand a new set another's state.
  TestDaemon daemon;
  RawClient client(daemon.socket());
  client.hello();
  REQUIRE(error_of(client.join(unique_job("release-again"), 1, 0)).empty());
  const uint32_t segment = client.segment(4096).segment().segment_id();
  REQUIRE(error_of(client.call(RawClient::registration(0, segment, 2))).empty());
  control::Request release;
  release.mutable_release()->set_set_id(0);
  REQUIRE(error_of(client.call(release)).empty());
  CHECK_THAT(error_of(client.call(RawClient::registration(0, segment, 2))),
             Catch::Contains("set 0 was released in job") && Catch::Contains("not registered again"));
  CHECK(error_of(client.call(RawClient::registration(1, segment, 2))).empty());
  check_still_serving(daemon);
}

TEST_CASE("limits: the local world size is bounded, and a job's memory grows with the ranks that join, not the "
          "declared size",
          "[integration][limits]") {
  SECTION("bounded") {
    TestDaemon daemon({"--max-local-world-size", "8"});
    RawClient client(daemon.socket());
    client.hello();
    CHECK_THAT(error_of(client.join(unique_job("wide"), 9, 0)),
               Catch::Contains("local world size 9") && Catch::Contains("gradsyncd --max-local-world-size 8"));
    CHECK(error_of(client.join(unique_job("narrow"), 8, 0)).empty());
  }
  SECTION("memory") {
    TestDaemon daemon({"--max-local-world-size", "1024"});
    check_still_serving(daemon);
    const long baseline = rss_kib(daemon.pid());
    std::vector<std::unique_ptr<RawClient>> clients;
    for (int j = 0; j < 8; ++j) {
      clients.push_back(std::make_unique<RawClient>(daemon.socket()));
      clients.back()->hello();
      REQUIRE(error_of(clients.back()->join(unique_job("declared-1024"), 1024, 0)).empty());
    }
    const long joined = rss_kib(daemon.pid());
    INFO("RSS KiB: baseline " << baseline << ", 8 jobs of local world size 1024, one rank each " << joined);
    // One client's rings are about 330 KiB: 8 of them, not 8 x 1024.
    CHECK(mapped_memfds(daemon.pid(), "client-rings") == 8);
    CHECK(joined - baseline < 32 * 1024);
  }
}

// The daemon's RSS once it is back within `slack` KiB of `baseline`, or after 30 s (what a
// client gave back is noticed a moment later, and under load the retirement takes a while).
long settled_rss(TestDaemon& daemon, long baseline, long slack = 8 * 1024) {
  long rss = 0;
  for (int attempt = 0; attempt < 600; ++attempt) {
    rss = rss_kib(daemon.pid());
    if (rss - baseline < slack) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return rss;
}

TEST_CASE("limits: a large request's buffers are not kept, while its client stays or after it died mid-frame",
          "[integration][limits]") {
  TestDaemon daemon;
  check_still_serving(daemon);
  const long baseline = rss_kib(daemon.pid());
  const std::string frame = frame_of(RawClient::registration(1, 1, 1'000'000));
  INFO("frame of " << frame.size() << " bytes; RSS KiB baseline " << baseline);
  // A 12 MB registration refused after parsing (its segment was never given): the client
  // stays connected, and its session does not keep the 12 MB it read the frame into.
  RawClient stays(daemon.socket());
  stays.hello();
  REQUIRE(error_of(stays.join(unique_job("stays"), 1, 0)).empty());
  stays.socket().send(frame);
  const control::Reply refused = stays.socket().read_reply(std::chrono::seconds(60));
  REQUIRE_THAT(error_of(refused), Catch::Contains("segment 1"));
  const long while_connected = settled_rss(daemon, baseline);
  INFO("RSS KiB while the client that sent it stays connected: " << while_connected);
  CHECK(while_connected - baseline < 8 * 1024);
  // One over the per-client tensor limit is refused before it is checked; its decoded request
  // (~100 MB of small blocks) is freed off the io thread and handed back to the system too.
  stays.socket().send(frame_of(RawClient::registration(1, 1, 1'100'000)));
  REQUIRE_THAT(error_of(stays.socket().read_reply(std::chrono::seconds(60))),
               Catch::Contains("max-tensors-per-client"));
  const long after_limit = settled_rss(daemon, baseline);
  INFO("RSS KiB after a registration over the tensor limit: " << after_limit);
  CHECK(after_limit - baseline < 8 * 1024);
  // A client that dies with all but the last byte of a 12 MB frame sent: the session ends as
  // a truncated frame, and what it buffered goes back to the system.
  // Its job has a second rank that stays, so no job's retirement hands memory back on the
  // session's behalf.
  const std::string job = unique_job("dies");
  RawClient partner(daemon.socket());
  partner.hello();
  REQUIRE(error_of(partner.join(job, 2, 1)).empty());
  {
    RawClient dies(daemon.socket());
    dies.hello();
    REQUIRE(error_of(dies.join(job, 2, 0)).empty());
    dies.socket().send(frame.substr(0, frame.size() - 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the daemon buffer it
  }
  const long after_death = settled_rss(daemon, baseline);
  INFO("RSS KiB after a client died mid-frame: " << after_death);
  CHECK(after_death - baseline < 8 * 1024);
  std::printf("daemon RSS: baseline %ld KiB; a 12 MB request refused, its client connected: %ld KiB; one over the "
              "tensor limit: %ld KiB; a client died mid-frame: %ld KiB\n",
              baseline, while_connected, after_limit, after_death);
  check_still_serving(daemon);
}

TEST_CASE("limits: a registration of a million tensors is checked off the io thread, and the memory comes back",
          "[integration][limits]") {
  TestDaemon daemon;
  check_still_serving(daemon);
  const long baseline = rss_kib(daemon.pid());
  constexpr size_t kTensors = 1'000'000;
  const std::string frame_text = frame_of(RawClient::registration(1, 1, kTensors));
  INFO("registration frame: " << frame_text.size() << " bytes");
  long peak = 0;
  {
    RawClient big(daemon.socket());
    big.hello();
    REQUIRE(error_of(big.join(unique_job("million"), 1, 0)).empty());
    REQUIRE(big.segment(kTensors * 4).segment().segment_id() == 1);
    const auto sent_at = std::chrono::steady_clock::now();
    big.send(RawClient::registration(1, 1, kTensors));
    // Meanwhile another client joins another job: the io thread serves it at once.
    const auto join_started = std::chrono::steady_clock::now();
    RawClient other(daemon.socket());
    other.hello();
    REQUIRE(error_of(other.join(unique_job("meanwhile"), 1, 0)).empty());
    const auto joined = std::chrono::steady_clock::now();
    const bool big_answered_first = big.socket().readable();
    const control::Reply reply = big.socket().read_reply(std::chrono::seconds(60));
    const auto registered = std::chrono::steady_clock::now();
    peak = rss_kib(daemon.pid());
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    INFO("another client's hello + join took " << ms(joined - join_started) << " ms; the registration took "
                                               << ms(registered - sent_at) << " ms");
    REQUIRE(error_of(reply).empty());
    CHECK(reply.id() == 4);  // hello, join, segment, then this registration
    CHECK(reply.register_().buckets_size() > 0);
    CHECK_FALSE(big_answered_first);
    std::printf("million-tensor registration: %.1f ms; another client's hello + join meanwhile: %.1f ms\n",
                ms(registered - sent_at), ms(joined - join_started));
  }
  // The job ended with its client: its tables are freed and handed back to the system.
  const auto settled = [&] {
    long rss = 0;
    for (int attempt = 0; attempt < 600; ++attempt) {  // up to 30 s: the job's retirement, under load
      rss = rss_kib(daemon.pid());
      if (rss - baseline < 8 * 1024) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return rss;
  };
  const long after = settled();
  // Once more: what stays behind does not add up.
  {
    RawClient again(daemon.socket());
    again.hello();
    REQUIRE(error_of(again.join(unique_job("million-again"), 1, 0)).empty());
    REQUIRE(again.segment(kTensors * 4).segment().segment_id() == 1);
    REQUIRE(error_of(again.call(RawClient::registration(1, 1, kTensors))).empty());
  }
  const long after_again = settled();
  std::printf("daemon RSS: baseline %ld KiB, after the registration %ld KiB, after the job ended %ld KiB, after a "
              "second one %ld KiB\n",
              baseline, peak, after, after_again);
  INFO("RSS KiB: baseline " << baseline << ", registered " << peak << ", after " << after << ", after a second "
                            << after_again);
  // All of it comes back, each time (gradsyncd keeps one malloc arena: with one per thread,
  // about one run in three kept ~60 MiB of a decoded request in a setup thread's arena).
  CHECK(after - baseline < 8 * 1024);
  CHECK(after_again - baseline < 8 * 1024);
  check_still_serving(daemon);
}

}  // namespace gradsync::test

