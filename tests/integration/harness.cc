#include "tests/integration/harness.h"

#include <cstdio>
#include <cerrno>
#include <cstdlib>

#include <arpa/inet.h>
#include <poll.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace gradsync::test {

TestDaemon::TestDaemon(std::vector<std::string> args) {
  char pattern[] = "/tmp/gradsync-log-XXXXXX";
  const int fd = ::mkstemp(pattern);
  if (fd >= 0) ::close(fd);
  log_path_ = pattern;
  // Many daemons run at once in tests: each takes a free peer port unless the test picks one.
  if (std::find(args.begin(), args.end(), "--peer-listen") == args.end()) {
    args.insert(args.begin(), {"--peer-listen", "127.0.0.1:0"});
  }
  args.insert(args.begin(), {"--log-level", "debug"});
  // $GRADSYNCD_BINARY points the tests at a gradsyncd elsewhere than the build tree (the GPU
  // bundle on a lent machine).
  const char* binary = std::getenv("GRADSYNCD_BINARY");
  if (binary && *binary) std::fprintf(stderr, "harness: gradsyncd from $GRADSYNCD_BINARY: %s\n", binary);
  try {
    process_ = std::make_unique<DaemonProcess>(
        DaemonProcess::Options{binary && *binary ? binary : GRADSYNCD_BINARY, std::move(args), log_path_});
  } catch (const Error& e) {
    // The destructor will not run: say why from the daemon's own log, then remove it.
    std::string tail = log();
    if (tail.size() > 2000) tail = "..." + tail.substr(tail.size() - 2000);
    ::unlink(log_path_.c_str());
    throw Error(Status(e.status().code(), e.status().message() + "; its log:\n" + tail));
  }
  // Its socket exists a moment before it logs that it is ready (every socket listening), and
  // tests read that line's settings: wait for it (a loaded machine widens the gap).
  for (int i = 0; i < 800 && running() && log().find(" ready (") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

TestDaemon::~TestDaemon() {
  process_.reset();
  ::unlink(log_path_.c_str());
}

std::string TestDaemon::log() const {
  std::ifstream file(log_path_);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

TestCluster::TestCluster(int nodes, std::vector<std::string> args) : args_(std::move(args)) {
  args_.insert(args_.end(), {"--peer-token-file", token_.path()});
  const int port = free_loopback_port();
  rendezvous_ = "127.0.0.1:" + std::to_string(port);
  for (int n = 0; n < nodes; ++n) {
    std::vector<std::string> node_args = args_;
    node_args.insert(node_args.end(), {"--peer-listen", n == 0 ? rendezvous_ : "127.0.0.1:0"});
    daemons_.push_back(std::make_unique<TestDaemon>(node_args));
  }
}

void TestCluster::restart(int n, const std::vector<std::string>& extra) {
  std::vector<std::string> node_args = args_;
  node_args.insert(node_args.end(), extra.begin(), extra.end());
  node_args.insert(node_args.end(), {"--peer-listen", n == 0 ? rendezvous_ : "127.0.0.1:0"});
  // The old one goes first: node 0's successor listens on the same (rendezvous) port.
  daemons_.at(static_cast<size_t>(n)).reset();
  daemons_.at(static_cast<size_t>(n)) = std::make_unique<TestDaemon>(node_args);
}

std::unique_ptr<Client> join_nodes(const std::string& socket, const std::string& job, int rank, int world, int local,
                                   const std::string& rendezvous, std::vector<GroupSpec> groups) {
  auto client = Client::connect(ConnectOptions{socket, "test rank " + std::to_string(rank)});
  JoinOptions options{job, rank, world, rank % local, local};
  options.rendezvous = rendezvous;
  options.groups = std::move(groups);
  client->join(options);
  return client;
}

std::unique_ptr<Client> join(const std::string& socket, const std::string& job, int rank, int world,
                             std::chrono::milliseconds timeout) {
  auto client = Client::connect(ConnectOptions{socket, "test rank " + std::to_string(rank)});
  client->join(JoinOptions{job, rank, world, rank, world, timeout});
  return client;
}

ClientGroup::ClientGroup(int count, const std::function<int(int rank)>& body) {
  std::fflush(nullptr);
  for (int r = 0; r < count; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = kThrew;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "client rank %d: uncaught: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids_.push_back(pid);
  }
  statuses_.assign(pids_.size(), -1);
  reaped_.assign(pids_.size(), false);
}

ClientGroup::~ClientGroup() {
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (reaped_[r] || pids_[r] <= 0) continue;
    ::kill(pids_[r], SIGKILL);
    ::kill(pids_[r], SIGCONT);
    ::waitpid(pids_[r], nullptr, 0);
  }
}

void ClientGroup::signal(int rank, int signo) const { ::kill(pids_[static_cast<size_t>(rank)], signo); }

int ClientGroup::wait(int rank, std::chrono::milliseconds timeout) {
  const size_t r = static_cast<size_t>(rank);
  if (reaped_[r]) return statuses_[r];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(pids_[r], &status, WNOHANG) == pids_[r]) {
      reaped_[r] = true;
      statuses_[r] = status;
      return status;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pids_[r], SIGKILL);
      ::kill(pids_[r], SIGCONT);
      ::waitpid(pids_[r], nullptr, 0);
      reaped_[r] = true;
      statuses_[r] = -1;
      std::fprintf(stderr, "client rank %d did not finish in time and was killed\n", rank);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::vector<int> ClientGroup::wait_all(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> result;
  for (size_t r = 0; r < pids_.size(); ++r) {
    const auto left = std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                  deadline - std::chrono::steady_clock::now()));
    result.push_back(wait(static_cast<int>(r), left));
  }
  return result;
}

bool closed_by_other_end(int fd) {
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET || errno == EPIPE;
  }
}

int exit_code(int status) { return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

int fail(const std::string& what) {
  std::fprintf(stderr, "[pid %d] check failed: %s\n", ::getpid(), what.c_str());
  return kFailed;
}

Latch::Latch() {
  if (::pipe(fds_) != 0) throw Error(Status::internal("pipe() failed"));
}

Latch::~Latch() {
  ::close(fds_[0]);
  ::close(fds_[1]);
}

void Latch::open() const { (void)!::write(fds_[1], "x", 1); }

bool Latch::wait(std::chrono::milliseconds timeout) const {
  pollfd p{fds_[0], POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
  char c;
  return ::read(fds_[0], &c, 1) == 1;
}

CommandRun run_command(const std::string& command) {
  CommandRun run;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return run;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) run.output.append(buffer, n);
  const int status = ::pclose(pipe);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::string admin_socket(const TestDaemon& daemon) {
  const std::string& socket = daemon.socket();
  const auto slash = socket.rfind('/');
  return socket.substr(slash + 1) == "gradsync.sock" ? socket.substr(0, slash) + "/admin.sock" : socket + ".admin";
}

#ifdef GRADSYNCCTL_BINARY
CommandRun gradsyncctl(const TestDaemon& daemon, const std::string& args, const std::string& user) {
  std::string command = std::string(GRADSYNCCTL_BINARY) + " --admin unix:" + admin_socket(daemon) + " " + args;
  if (!user.empty()) command = "/usr/bin/setpriv --reuid " + user + " --regid " + user + " --clear-groups " + command;
  return run_command(command);
}
#endif

std::string unique_job(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

size_t open_fd_count(pid_t pid) {
  size_t count = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    count++;
  }
  return count;
}

std::vector<std::string> shm_entries_containing(const std::string& text) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/dev/shm", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find(text) != std::string::npos) found.push_back(name);
  }
  return found;
}

size_t mapped_memfds(pid_t pid, const std::string& tag) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  size_t count = 0;
  while (std::getline(maps, line)) {
    if (line.find("/memfd:gradsync-" + tag) != std::string::npos) count++;
  }
  return count;
}

size_t open_memfds(pid_t pid) {
  size_t count = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code link_error;
    const auto target = std::filesystem::read_symlink(it->path(), link_error).string();
    if (target.rfind("/memfd:gradsync-", 0) == 0) count++;
  }
  return count;
}

long rss_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

void check_still_serving(const TestDaemon& daemon) {
  auto client = join(daemon.socket(), unique_job("after"), 0, 1);
  const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kFloat32, 4, "dp"})};
  const TensorSet set = client->register_tensors(tensors, {});
  tensors[0].as<float>()[0] = 3.0f;
  CHECK(client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(10)));
  CHECK(tensors[0].as<float>()[0] == 3.0f);
}

}  // namespace gradsync::test
