// Trust boundaries of the per-step path, played by a hostile local user: memory passed as
// sealed memfds cannot be shrunk under the daemon, a client can only read its completions, no
// rank can reach another rank's rings, jobs of different users never mix, and a client hands
// its memory only to a daemon it trusts.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "client/tools/process.h"
#include "shared/unique_fd.h"
#include "tests/integration/harness.h"
#include "tests/integration/users.h"
#include "tests/integration/raw_protocol.h"
#include "tests/integration/values.h"

namespace gradsync::test {
namespace {

// One verified step: every rank fills rank + 1, the sum is world * (world + 1) / 2.
bool sum_step(Client& client, const TensorSet& set, int rank, int world) {
  const auto values = set.tensor(0).as<float>();
  for (auto& v : values) v = static_cast<float>(rank + 1);
  if (!client.allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(10))) return false;
  const float expected = static_cast<float>(world * (world + 1) / 2);
  for (float v : values) {
    if (v != expected) return false;
  }
  return true;
}

// Submits operation `seq`, a sum allreduce of the set with every bucket ready, on a raw
// client's ring, and rings its doorbell.
void submit_sum(RawJoin& joined, uint64_t seq) {
  RingWriter<SubmitRing> ring(&joined.channel.client()->submit);
  SubmitEntry entry;
  entry.kind = static_cast<uint32_t>(SubmitKind::kOp);
  entry.op_seq = seq;
  entry.op = static_cast<uint32_t>(OpKind::kAllreduce);
  entry.reduce_op = static_cast<uint32_t>(WireReduceOp::kSum);
  entry.flags = kSubmitAllReady;
  REQUIRE(ring.try_push(entry));
  joined.channel.doorbell_page()->doorbell.notify();
}

}  // namespace

TEST_CASE("trust: a client that truncates its memfds or rings cannot crash the daemon, other jobs keep verifying",
          "[integration][trust]") {
  TestDaemon daemon;
  // A bystander job verifies steps for as long as the attack lasts.
  const std::string bystander_job = unique_job("bystander");
  ClientGroup bystander(2, [&](int rank) {
    auto client = join(daemon.socket(), bystander_job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 4096, "dp"}}), {});
    for (int step = 0; step < 200; ++step) {
      if (!sum_step(*client, set, rank, 2)) return fail("bystander step " + std::to_string(step) + " was wrong");
    }
    return kOk;
  });
  Connection raw(daemon.socket(), std::nullopt);
  RawJoin joined = raw_join(raw, unique_job("truncate"), 1);
  RawSegment segment = raw_segment(raw, 1 << 20);
  control::Request reg;
  auto* tensor = reg.mutable_register_()->add_tensors();
  tensor->set_dtype(control::FLOAT32);
  tensor->set_numel((1 << 20) / 4);
  tensor->set_segment_id(segment.id);
  raw.call(reg, std::chrono::seconds(10));

  // Every descriptor the client holds is sealed against resizing, whatever it tries.
  const std::vector<std::pair<const char*, int>> fds = {{"tensor memfd", segment.memory.fd().get()},
                                                        {"doorbell", joined.fds[kJoinFdDoorbell].get()},
                                                        {"client rings", joined.fds[kJoinFdClientRings].get()},
                                                        {"daemon rings", joined.fds[kJoinFdDaemonRings].get()}};
  for (const auto& [what, fd] : fds) {
    CAPTURE(what);
    CHECK(::ftruncate(fd, 0) == -1);
    CHECK(errno == EPERM);
    CHECK(::ftruncate(fd, 1 << 30) == -1);
    CHECK(::fcntl(fd, F_GET_SEALS) & F_SEAL_SEAL);  // and the seals cannot be taken off
  }
  // The daemon still reduces this client's memory (it would have died of SIGBUS on a shrunk
  // mapping), and the bystander job verified every step meanwhile.
  submit_sum(joined, 1);
  const DaemonRings* rings = joined.channel.daemon();
  for (int i = 0; i < 500 && rings->completion.tail.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(rings->completion.tail.load() == 1);
  CHECK(rings->completion.entries[0].op_seq == 1);
  CHECK(rings->completion.entries[0].code == 0);
  for (int status : bystander.wait_all()) CHECK(exit_code(status) == kOk);
  CHECK(daemon.running());
}

// A memfd sealed against growing but not shrinking could be cut under the daemon's mapping
// after registration (SIGBUS in the daemon at the next step). It must be refused at once; if it
// were accepted, the attack goes on and the daemon must survive it.
TEST_CASE("trust: a memfd that may still shrink is refused, and shrinking it cannot crash the daemon",
          "[integration][trust]") {
  TestDaemon daemon;
  Connection raw(daemon.socket(), std::nullopt);
  RawJoin joined = raw_join(raw, unique_job("shrinkable"), 1);
  constexpr size_t kBytes = 1 << 20;
  MappedMemfd memory = MappedMemfd::create("test", kBytes);
  memory.seal(F_SEAL_GROW | F_SEAL_SEAL);  // everything but F_SEAL_SHRINK
  control::Request announce;
  announce.mutable_segment()->set_kind(control::HOST_MEMFD);
  announce.mutable_segment()->set_bytes(kBytes);
  const int fd = memory.fd().get();
  bool accepted = false;
  uint32_t id = 0;
  try {
    id = raw.call(announce, std::chrono::seconds(5), std::span<const int>(&fd, 1)).segment().segment_id();
    accepted = true;
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
  }
  CHECK_FALSE(accepted);
  if (accepted) {
    control::Request reg;
    auto* tensor = reg.mutable_register_()->add_tensors();
    tensor->set_dtype(control::FLOAT32);
    tensor->set_numel(kBytes / 4);
    tensor->set_segment_id(id);
    raw.call(reg, std::chrono::seconds(10));
    REQUIRE(::ftruncate(fd, 0) == 0);  // the seal that would stop this is missing
    submit_sum(joined, 1);
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  CHECK(daemon.running());
  check_still_serving(daemon);
}

TEST_CASE("trust: a client can map its completion ring read-only and in no other way", "[integration][trust]") {
  TestDaemon daemon;
  Connection raw(daemon.socket(), std::nullopt);
  RawJoin joined = raw_join(raw, unique_job("readonly"), 1);
  const int fd = joined.fds[kJoinFdDaemonRings].get();
  // A writable shared mapping is refused.
  errno = 0;
  CHECK(::mmap(nullptr, kDaemonRingsBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
  CHECK(errno == EPERM);
  // A read-only mapping cannot be made writable.
  void* mapping = ::mmap(nullptr, kDaemonRingsBytes, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(mapping != MAP_FAILED);
  CHECK(::mprotect(mapping, kDaemonRingsBytes, PROT_READ | PROT_WRITE) == -1);
  ::munmap(mapping, kDaemonRingsBytes);
  // Nor does write() get through, on the descriptor or on a fresh one from /proc.
  const char byte = 1;
  CHECK(::pwrite(fd, &byte, 1, 0) == -1);
  const int reopened = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR);
  if (reopened >= 0) {
    CHECK(::pwrite(reopened, &byte, 1, 0) == -1);
    CHECK(::mmap(nullptr, kDaemonRingsBytes, PROT_READ | PROT_WRITE, MAP_SHARED, reopened, 0) == MAP_FAILED);
    ::close(reopened);
  }
  // The client's own ring memory is writable, as it must be.
  void* own = ::mmap(nullptr, kClientRingsBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                     joined.fds[kJoinFdClientRings].get(), 0);
  CHECK(own != MAP_FAILED);
  if (own != MAP_FAILED) ::munmap(own, kClientRingsBytes);
}

TEST_CASE("trust: a rank that forges completions everywhere it can write cannot make another rank succeed",
          "[integration][trust]") {
  TestDaemon daemon({"--timeout-ms", "1500"});
  const std::string job = unique_job("forge");
  // Rank 1 is hostile: it joins, registers, and then writes success entries for operations
  // 1..20 over every byte of memory the daemon gave it, instead of taking part.
  Connection raw(daemon.socket(), std::nullopt);
  ClientGroup honest(1, [&](int) {
    auto client = join(daemon.socket(), job, 0, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 16, "dp"}}), {});
    int forged = 0;
    for (int step = 0; step < 20; ++step) {
      try {
        if (sum_step(*client, set, 0, 2)) return fail("step " + std::to_string(step) + " succeeded without rank 1");
        forged++;  // reported success, with wrong values
      } catch (const Error& e) {
        if (step == 0 && std::string(e.what()).find("rank 1") == std::string::npos) {
          return fail(std::string("the failure does not name rank 1: ") + e.what());
        }
      }
    }
    return forged == 0 ? kOk : fail(std::to_string(forged) + " steps reported success with wrong values");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  RawJoin joined = raw_join(raw, job, 2, 1);
  RawSegment segment = raw_segment(raw, 64);
  control::Request reg;
  auto* tensor = reg.mutable_register_()->add_tensors();
  tensor->set_dtype(control::FLOAT32);
  tensor->set_numel(16);
  tensor->set_segment_id(segment.id);
  raw.call(reg, std::chrono::seconds(10));
  CompletionEntry forged;
  for (auto* region : {joined.channel.doorbell.data(), joined.channel.client_rings.data()}) {
    const size_t bytes = region == joined.channel.doorbell.data() ? kDoorbellBytes : kClientRingsBytes;
    for (size_t offset = 0; offset + sizeof(forged) <= bytes; offset += sizeof(forged)) {
      forged.op_seq = 1 + (offset / sizeof(forged)) % 20;
      std::memcpy(region + offset, &forged, sizeof(forged));
    }
  }
  joined.channel.doorbell_page()->doorbell.notify();
  for (int status : honest.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
  CHECK(daemon.running());
}

TEST_CASE("trust: another user's process joining a job id in use gets its own job, both verify",
          "[integration][trust]") {
  const TestUser user = test_user();
  TestDaemon daemon({"--allow-uid", "0", "--allow-uid", std::to_string(user.uid)});
  REQUIRE(::chmod(std::filesystem::path(daemon.socket()).parent_path().c_str(), 0755) == 0);
  const std::string job = unique_job("shared-id");
  // Root's rank 0 waits for its rank 1; the other user takes ranks 0 and 1 of "the same" id.
  Latch others_done;
  ClientGroup root_ranks(2, [&](int rank) {
    if (rank == 1 && !others_done.wait(std::chrono::seconds(30))) return fail("the other user never finished");
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 64, "dp"}}), {});
    for (int step = 0; step < 5; ++step) {
      if (!sum_step(*client, set, rank, 2)) return fail("root's job computed a wrong sum");
    }
    return kOk;
  });
  ClientGroup other_ranks(2, [&](int rank) {
    if (!become(user)) return fail(std::string("cannot become the test user: ") + std::strerror(errno));
    // The daemon runs as root, whose channel memory this user could never open by name.
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 64, "dp"}}), {});
    for (int step = 0; step < 5; ++step) {
      if (!sum_step(*client, set, rank, 2)) return fail("the other user's job computed a wrong sum");
    }
    return kOk;
  });
  for (int status : other_ranks.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
  others_done.open();
  for (int status : root_ranks.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
  const std::string log = daemon.log();
  CHECK_THAT(log, Catch::Contains("job=" + job + " uid=0"));
  CHECK_THAT(log, Catch::Contains("job=" + job + " uid=" + std::to_string(user.uid)));
}

namespace {

// In a child that becomes `user`: connects to `socket` and says whether the daemon refused it
// as a user it does not allow (kOk), let it in (kAdmitted), or failed otherwise.
constexpr int kAdmitted = 3;
int connect_as(const TestUser& user, const std::string& socket) {
  if (!become(user)) return fail(std::string("cannot become the test user: ") + std::strerror(errno));
  try {
    auto client = Client::connect(ConnectOptions{socket});
    return kAdmitted;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kPermissionDenied &&
        e.status().message().find("is not allowed to use this daemon") != std::string::npos) {
      return kOk;
    }
    return fail(std::string("refused, but not by the daemon's allow-list: ") + e.what());
  }
}

// In a child that becomes `user`: connects to `socket`, which the socket's mode keeps `user`
// out of, and says whether the error named the cause and the setting (kOk).
int connect_refused_by_mode(const TestUser& user, const std::string& socket) {
  if (!become(user)) return fail(std::string("cannot become the test user: ") + std::strerror(errno));
  try {
    auto client = Client::connect(ConnectOptions{socket});
    return kAdmitted;
  } catch (const Error& e) {
    const std::string& message = e.status().message();
    if (e.code() == ErrorCode::kPermissionDenied && message.find("allow-uid") != std::string::npos &&
        message.find("permission denied for uid " + std::to_string(user.uid)) != std::string::npos &&
        message.find("is the daemon running") == std::string::npos) {
      return kOk;
    }
    return fail(std::string("refused, but the error does not say why and what to set: ") + e.what());
  }
}

}  // namespace

// A user the socket's mode keeps out hears that it is not allowed, and which setting allows
// it: not "Permission denied (is the daemon running?)", which sent a newcomer looking for a
// daemon that was running.
TEST_CASE("trust: a user the socket keeps out is told it is not allowed and which setting allows it",
          "[integration][trust]") {
  const TestUser user = test_user();
  TestDaemon daemon;
  open_socket_folder(daemon);
  ClientGroup other(1, [&](int) { return connect_refused_by_mode(user, daemon.socket()); });
  CHECK(exit_code(other.wait_all(std::chrono::seconds(30)).at(0)) == kOk);
}

// The daemon's own check, not the socket's mode, decides who may connect: an operator who
// widens the socket to 0666 (or a mode bug) must not let every local user in.
TEST_CASE("trust: a socket widened to 0666 admits no user the daemon does not allow", "[integration][trust]") {
  const TestUser user = test_user();
  const auto attempt = [&](const TestDaemon& daemon) {
    open_socket_folder(daemon);
    REQUIRE(::chmod(daemon.socket().c_str(), 0666) == 0);
    ClientGroup other(1, [&](int) { return connect_as(user, daemon.socket()); });
    const auto statuses = other.wait_all(std::chrono::seconds(30));
    return exit_code(statuses.at(0));
  };
  SECTION("the default allow-list: the daemon's user and root") {
    TestDaemon daemon;
    CHECK(attempt(daemon) == kOk);
  }
  SECTION("a list that does not name the user") {
    TestDaemon daemon({"--allow-uid", "0"});
    CHECK(attempt(daemon) == kOk);
  }
  SECTION("a list that names the user: admitted, so the refusals above were the daemon's") {
    TestDaemon daemon({"--allow-uid", "0", "--allow-uid", std::to_string(user.uid)});
    CHECK(attempt(daemon) == kAdmitted);
  }
}

TEST_CASE("trust: a client refuses a daemon of another user unless told to trust that uid", "[integration][trust]") {
  const TestUser user = test_user();
  char pattern[] = "/tmp/gradsync-other-XXXXXX";
  REQUIRE(::mkdtemp(pattern));
  const std::string directory = pattern;
  REQUIRE(::chown(directory.c_str(), user.uid, user.gid) == 0);
  const std::string socket = directory + "/gradsync.sock";
  // The daemon runs as the test user and lets root in.
  ChildProcess daemon({"/usr/bin/setpriv", "--reuid", std::to_string(user.uid), "--regid", std::to_string(user.gid),
                       "--clear-groups", GRADSYNCD_BINARY, "--socket", socket, "--peer-listen", "127.0.0.1:0",
                       "--allow-uid", "0"});
  for (int i = 0; i < 200 && !std::filesystem::exists(socket); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  REQUIRE(std::filesystem::exists(socket));
  try {
    Client::connect(ConnectOptions{socket});
    FAIL("a daemon of another user was trusted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kPermissionDenied);
    CHECK_THAT(e.status().message(), Catch::Contains("runs as uid " + std::to_string(user.uid)));
    CHECK_THAT(e.status().message(), Catch::Contains("GRADSYNC_DAEMON_UID"));
  }
  ConnectOptions trusting{socket};
  trusting.daemon_uid = user.uid;
  auto client = Client::connect(trusting);
  client->join(JoinOptions{unique_job("trusted"), 0, 1, 0, 1});
  const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 8, "dp"}}), {});
  CHECK(sum_step(*client, set, 0, 1));
  client.reset();
  daemon.signal(SIGTERM);
  CHECK(exited_ok(daemon.wait_for(std::chrono::seconds(10))));
  std::filesystem::remove_all(directory);
}

}  // namespace gradsync::test

namespace gradsync::test {

namespace {

// Waits (up to 20 s: a loaded machine) until every path exists, such as a daemon's sockets.
bool wait_for_paths(const std::vector<std::string>& paths) {
  const auto all = [&] {
    return std::all_of(paths.begin(), paths.end(), [](const std::string& p) { return std::filesystem::exists(p); });
  };
  for (int i = 0; i < 800 && !all(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  return all();
}

// A gradsyncd serving `socket` (no admin socket), once the socket is there.
ChildProcess serving_at(const std::string& socket) {
  ChildProcess daemon({GRADSYNCD_BINARY, "--socket", socket, "--admin", "none", "--peer-listen", "127.0.0.1:0"});
  REQUIRE(wait_for_paths({socket}));
  return daemon;
}

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  return address;
}

// A connect to `path`: 0, or the errno.
int connect_error(const std::string& path) {
  const UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const sockaddr_un address = unix_address(path);
  return ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0 ? 0 : errno;
}

}  // namespace

TEST_CASE("trust: gradsyncd refuses socket folders another user could write or swap, and creates missing ones 0755",
          "[integration][trust]") {
  const TestUser user = test_user();
  const TempFolder scratch("gradsync-folders-XXXXXX");  // removed however the test case ends
  const std::string base = scratch.path();  // root's, 0700
  REQUIRE(::chmod(base.c_str(), 0755) == 0);
  // Each of these must be refused: bounded, so that one that starts fails instead of hanging.
  const auto start = [&](const std::string& socket, const std::string& admin = {}) {
    return run_command("timeout -k 5 30 " + std::string(GRADSYNCD_BINARY) + " --socket " + socket +
                       " --peer-listen 127.0.0.1:0" + (admin.empty() ? " --admin none" : " --admin " + admin) + " 2>&1");
  };
  // A folder the other user owns: they could replace the socket (or squat it before the daemon).
  const std::string theirs = base + "/theirs";
  REQUIRE(::mkdir(theirs.c_str(), 0755) == 0);
  REQUIRE(::chown(theirs.c_str(), user.uid, user.gid) == 0);
  CommandRun run = start(theirs + "/gradsync.sock");
  INFO(run.output);
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("folder " + theirs + " belongs to uid " + std::to_string(user.uid)));
  // A folder of root's that everybody may write.
  const std::string open = base + "/open";
  REQUIRE(::mkdir(open.c_str(), 0755) == 0);
  REQUIRE(::chmod(open.c_str(), 0777) == 0);
  run = start(open + "/gradsync.sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("folder " + open + " (mode 0777) can be written by other users"));
  // /tmp itself (sticky, but the socket's own folder must be gradsyncd's alone).
  run = start("/tmp/gradsync-direct-" + std::to_string(::getpid()) + ".sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("folder /tmp (mode 1777) can be written by other users"));
  // A path with ".." is refused before anything is made: what it names depends on symlinks.
  run = start(base + "/up/../gradsync.sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("a path with '..' in it is refused"));
  CHECK_FALSE(std::filesystem::exists(base + "/up"));
  // Nothing is made under such a folder (the other user could swap what was made).
  run = start(theirs + "/new/gradsync.sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("folder " + theirs + " belongs to uid " + std::to_string(user.uid)));
  CHECK_FALSE(std::filesystem::exists(theirs + "/new"));
  // Root's folder inside the other user's: they could rename it away and put their own there.
  const std::string nested = theirs + "/inner";
  REQUIRE(::mkdir(nested.c_str(), 0755) == 0);
  run = start(nested + "/gradsync.sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("belongs to uid " + std::to_string(user.uid)));
  // A symlink on the way is as good as its owner, and the folders it leads to must pass too.
  const std::string target = base + "/target";
  REQUIRE(::mkdir(target.c_str(), 0755) == 0);
  const std::string their_link = base + "/their-link";
  REQUIRE(::symlink(target.c_str(), their_link.c_str()) == 0);
  REQUIRE(::lchown(their_link.c_str(), user.uid, user.gid) == 0);
  run = start(their_link + "/gradsync.sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains(their_link + " is a symlink of uid " + std::to_string(user.uid)));
  // Root's link to root's folder inside the other user's, who could swap that folder.
  const std::string to_nested = base + "/to-nested";
  REQUIRE(::symlink(nested.c_str(), to_nested.c_str()) == 0);
  run = start(to_nested + "/gradsync.sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("folder " + theirs + " belongs to uid " + std::to_string(user.uid)));
  // A link reached through a link is held to the same rule.
  const std::string chain = base + "/chain";
  REQUIRE(::symlink(their_link.c_str(), chain.c_str()) == 0);
  run = start(chain + "/gradsync.sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains(their_link + " is a symlink of uid " + std::to_string(user.uid)));
  // The admin socket is held to the same rule.
  run = start(base + "/ok/gradsync.sock", "unix:" + open + "/admin.sock");
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("admin socket " + open + "/admin.sock: folder " + open));
  // The control socket's folder it had made for that start is gone with it.
  CHECK_FALSE(std::filesystem::exists(base + "/ok"));
  // A folder that does not exist is created, gradsyncd's and 0755 (whatever the umask), and serves.
  const std::string fresh = base + "/made/by/gradsyncd";
  const mode_t umask_before = ::umask(0077);  // the unit's UMask
  ChildProcess daemon({GRADSYNCD_BINARY, "--socket", fresh + "/gradsync.sock", "--peer-listen", "127.0.0.1:0"});
  ::umask(umask_before);
  // The admin socket is bound after the control socket: wait for both.
  REQUIRE(wait_for_paths({fresh + "/gradsync.sock", fresh + "/admin.sock"}));
  struct stat info {};
  REQUIRE(::stat(fresh.c_str(), &info) == 0);
  CHECK((info.st_mode & 07777) == 0755);
  CHECK(info.st_uid == ::geteuid());
  REQUIRE(::stat((fresh + "/gradsync.sock").c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);
  REQUIRE(::stat((fresh + "/admin.sock").c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);
  daemon.signal(SIGTERM);
  CHECK(exit_code(daemon.wait_for(std::chrono::seconds(10))) == 0);
  // Stopping removes the sockets and every folder it made, and nothing above them.
  CHECK_FALSE(std::filesystem::exists(base + "/made"));
  CHECK(std::filesystem::exists(base));
  // Through a symlink of root's to a safe folder (as /var/run leads to /run), it serves.
  const std::string our_link = base + "/our-link";
  REQUIRE(::symlink(target.c_str(), our_link.c_str()) == 0);
  ChildProcess linked = serving_at(our_link + "/gradsync.sock");
  linked.signal(SIGTERM);
  CHECK(exit_code(linked.wait_for(std::chrono::seconds(10))) == 0);
  CHECK_FALSE(std::filesystem::exists(target + "/gradsync.sock"));
}

TEST_CASE("trust: a stopping gradsyncd leaves a folder it made that holds a file, and a newcomer's socket",
          "[integration][trust]") {
  const TempFolder scratch("gradsync-folders-XXXXXX");  // removed however the test case ends
  const std::string base = scratch.path();
  // A folder it made that holds something else at the end is left, with what it holds.
  const std::string kept = base + "/kept/here";
  ChildProcess second = serving_at(kept + "/gradsync.sock");
  std::ofstream(kept + "/notes.txt") << "an operator's file\n";
  second.signal(SIGTERM);
  CHECK(exit_code(second.wait_for(std::chrono::seconds(10))) == 0);
  CHECK(std::filesystem::exists(kept + "/notes.txt"));
  CHECK_FALSE(std::filesystem::exists(kept + "/gradsync.sock"));
  // A stopping daemon removes its own socket and folder, not those of a daemon that took the
  // path meanwhile (its socket no longer answered, so the newcomer replaced it as stale).
  const std::string taken = base + "/taken";
  ChildProcess stopping = serving_at(taken + "/gradsync.sock");
  REQUIRE(::unlink((taken + "/gradsync.sock").c_str()) == 0);
  const UniqueFd newcomer(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(newcomer);
  const sockaddr_un address = unix_address(taken + "/gradsync.sock");
  REQUIRE(::bind(newcomer.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(newcomer.get(), 1) == 0);
  stopping.signal(SIGTERM);
  CHECK(exit_code(stopping.wait_for(std::chrono::seconds(10))) == 0);
  CHECK(std::filesystem::is_socket(taken + "/gradsync.sock"));
}

TEST_CASE("trust: a stopping gradsyncd removes its socket's name while the socket still listens",
          "[integration][trust]") {
  // Else a daemon starting on the path would find a socket that refuses, take it for stale and
  // replace it while this one could still remove it. A connect that refused while the name was
  // still there shows the wrong order (one that found the name just before it went and the
  // socket just after it closed does not count: the name was gone already).
  // The connects run from before the signal, so some land while it stops; a stop too quick for
  // any is run again (up to 10 times), and one that none saw fails the test rather than pass.
  const TempFolder scratch("gradsync-order-XXXXXX");  // removed however the test case ends
  const std::string base = scratch.path();
  const std::string order = base + "/order/gradsync.sock";
  int refusals = 0, during = 0, attempts = 0;
  while (during == 0 && attempts < 10) {
    ++attempts;
    ChildProcess daemon = serving_at(order);
    std::atomic<bool> signalled{false}, exited{false};
    std::atomic<int> seen{0}, refused{0};
    std::thread connects([&] {
      while (!exited.load()) {
        const bool stopping = signalled.load();
        const bool refused_now = connect_error(order) == ECONNREFUSED && std::filesystem::exists(order);
        if (stopping && !exited.load()) {
          ++seen;
          if (refused_now) ++refused;
        }
        std::this_thread::yield();
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the loop is running
    signalled.store(true);
    daemon.signal(SIGTERM);
    const int status = daemon.wait_for(std::chrono::seconds(20));
    exited.store(true);
    connects.join();
    CHECK(exited_ok(status));
    during += seen.load();
    refusals += refused.load();
  }
  INFO(during << " connects while it stopped, in " << attempts << " stops");
  CHECK(during > 0);
  CHECK(refusals == 0);
  CHECK_FALSE(std::filesystem::exists(order));
}

}  // namespace gradsync::test
