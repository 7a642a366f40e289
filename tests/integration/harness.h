// Helpers for the integration tests: a real gradsyncd (the binary CMake built) on a private
// socket, and client processes forked from the test, each running a scenario function with the
// real client library. A child reports failure through its exit code and stderr; the parent
// checks the codes. Every child is killed and reaped when its ClientGroup goes away.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/tools/process.h"
#include "gradsync/client.h"

namespace gradsync::test {

// A gradsyncd for one test, with its log in a file the test can read.
class TestDaemon {
 public:
  // Starts gradsyncd with `args` (plus --socket).
  explicit TestDaemon(std::vector<std::string> args = {});
  ~TestDaemon();

  const std::string& socket() const { return process_->socket_path(); }
  pid_t pid() { return process_->process().pid(); }
  bool running() { return process_->process().wait_for(std::chrono::milliseconds(0)) == -1; }
  ChildProcess& process() { return process_->process(); }
  int terminate() { return process_->terminate(); }

  // The daemon's log so far.
  std::string log() const;

 private:
  std::string log_path_;
  std::unique_ptr<DaemonProcess> process_;
};

// Connects and joins a single-node job of `world` ranks as `rank`; timeout 0 is the daemon's.
std::unique_ptr<Client> join(const std::string& socket, const std::string& job, int rank, int world,
                             std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// Several daemons on loopback, as nodes of multi-node jobs: each with its own control socket
// and peer port. Node 0's peer service is the rendezvous.
class TestCluster {
 public:
  TestCluster(int nodes, std::vector<std::string> args = {});
  TestDaemon& node(int n) { return *daemons_.at(static_cast<size_t>(n)); }
  const std::string& rendezvous() const { return rendezvous_; }
  const std::string& token_path() const { return token_.path(); }  // the nodes' --peer-token-file
  // Replaces node n's daemon with a fresh one (after it was killed), with `extra` flags added.
  void restart(int n, const std::vector<std::string>& extra = {});

 private:
  std::vector<std::string> args_;
  ClusterToken token_;  // every node's --peer-token-file
  std::vector<std::unique_ptr<TestDaemon>> daemons_;
  std::string rendezvous_;
};

// Connects to `socket` and joins as `rank` of a job with `local` ranks per node.
std::unique_ptr<Client> join_nodes(const std::string& socket, const std::string& job, int rank, int world, int local,
                                   const std::string& rendezvous, std::vector<GroupSpec> groups = {});

// Exit codes of a scenario function.
inline constexpr int kOk = 0;
inline constexpr int kFailed = 1;       // a check failed (details on stderr)
inline constexpr int kThrew = 2;        // an Error escaped

class ClientGroup {
 public:
  // Forks `count` processes; process r runs body(r) and exits with its return value (kThrew if
  // it throws).
  ClientGroup(int count, const std::function<int(int rank)>& body);
  ~ClientGroup();

  pid_t pid(int rank) const { return pids_[static_cast<size_t>(rank)]; }
  void signal(int rank, int signo) const;

  // Waits for every process, at most `timeout` in total; a process still running then is
  // killed and reported as -1.
  std::vector<int> wait_all(std::chrono::milliseconds timeout = std::chrono::seconds(60));

  // Waits for one process.
  int wait(int rank, std::chrono::milliseconds timeout = std::chrono::seconds(60));

 private:
  std::vector<pid_t> pids_;
  std::vector<int> statuses_;
  std::vector<bool> reaped_;
};

// One-shot notification between processes (a forked child and the test), through a pipe made
// before fork: the synchronization tests use instead of sleeps.
class Latch {
 public:
  Latch();
  ~Latch();
  Latch(const Latch&) = delete;
  Latch& operator=(const Latch&) = delete;
  void open() const;
  // True once open() was called (in any process), false after `timeout`.
  bool wait(std::chrono::milliseconds timeout) const;

 private:
  int fds_[2] = {-1, -1};
};

// Whether the other end has closed the connection `fd` (EOF or reset), reading past whatever
// it sent first (a gRPC server sends its settings at once). Never blocks.
bool closed_by_other_end(int fd);

// Exit code of a wait status, -1 for anything but a normal exit.
int exit_code(int status);

// Prints a failed check from a child and returns kFailed, for `return fail(...)`.
int fail(const std::string& what);

// A unique job id per test run.
std::string unique_job(const std::string& prefix);

// A shell command's exit status (-1 unless it exited) and its stdout and stderr together.
struct CommandRun {
  int code = -1;
  std::string output;
};
CommandRun run_command(const std::string& command);

// The daemon's admin socket: beside its control socket (gradsyncd's default for --admin).
std::string admin_socket(const TestDaemon& daemon);

// gradsyncctl with `args` (a shell fragment) against the daemon's admin socket, as the user
// with uid `user` when given.
CommandRun gradsyncctl(const TestDaemon& daemon, const std::string& args, const std::string& user = {});

// Open file descriptors, /dev/shm entries and gradsync memory, to check that nothing leaks.
size_t open_fd_count(pid_t pid);
std::vector<std::string> shm_entries_containing(const std::string& text);
// Mappings of gradsync memfds whose name starts with `tag` ("tensor", "client-rings", ""
// for all) in the process.
size_t mapped_memfds(pid_t pid, const std::string& tag = "");
// Descriptors of gradsync memfds the process holds open.
size_t open_memfds(pid_t pid);

// The process's resident memory (VmRSS), in KiB; -1 if it cannot be read.
long rss_kib(pid_t pid);

// The daemon still serves a one-client job from a new connection: joins, registers and
// allreduces (CHECKs on the result).
void check_still_serving(const TestDaemon& daemon);

}  // namespace gradsync::test
