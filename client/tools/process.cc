#include "client/tools/process.h"

#include <cstdio>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "shared/status.h"

extern char** environ;

namespace gradsync {

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& output_file) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!output_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  const int err = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    pid_ = -1;
    throw Error(Status::internal("cannot start " + argv[0] + ": " + std::strerror(err)));
  }
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), reaped_(other.reaped_), status_(other.status_) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    kill_and_reap();
    pid_ = std::exchange(other.pid_, -1);
    reaped_ = other.reaped_;
    status_ = other.status_;
  }
  return *this;
}

ChildProcess::~ChildProcess() { kill_and_reap(); }

void ChildProcess::kill_and_reap() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    ::kill(pid_, SIGCONT);  // a stopped process must run to die
    ::waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
}

void ChildProcess::signal(int signo) const {
  if (running()) ::kill(pid_, signo);
}

int ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  if (reaped_) return status_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t got = ::waitpid(pid_, &status, WNOHANG);
    if (got == pid_) {
      reaped_ = true;
      status_ = status;
      return status;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string describe_wait_status(int status) {
  if (status == -1) return "still running";
  if (WIFEXITED(status)) return "exited " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

bool exited_ok(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

namespace {

bool socket_accepts(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

std::string temp_pattern(const std::string& name) {
  const char* dir = std::getenv(kScratchVariable);
  return std::string(dir && *dir ? dir : "/tmp") + "/" + name;
}

TempFolder::TempFolder(const std::string& name) : path_(temp_pattern(name)) {
  if (!::mkdtemp(path_.data())) {
    throw Error(Status::internal("mkdtemp of " + path_ + " failed: " + std::strerror(errno)));
  }
}

TempFolder::~TempFolder() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

DaemonProcess::DaemonProcess(const Options& options) : directory_("gradsync-XXXXXX") {
  socket_path_ = directory_.path() + "/gradsync.sock";
  std::vector<std::string> argv = {options.binary, "--socket", socket_path_};
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  process_ = ChildProcess(argv, options.log_file);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!socket_accepts(socket_path_)) {
    if (process_.wait_for(std::chrono::milliseconds(0)) != -1 || std::chrono::steady_clock::now() >= deadline) {
      throw Error(Status::internal("gradsyncd (" + options.binary + ") did not come up on " + socket_path_));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

DaemonProcess::~DaemonProcess() {
  process_ = ChildProcess();  // kills it if still running, before its folder goes
}

int DaemonProcess::terminate(std::chrono::milliseconds timeout) {
  process_.signal(SIGTERM);
  return process_.wait_for(timeout);
}

ClusterToken::ClusterToken() {
  std::string pattern = temp_pattern("gradsync-token-XXXXXX");
  const int fd = ::mkstemp(pattern.data());  // mode 0600
  if (fd < 0) throw Error(Status::internal("mkstemp of " + pattern + " failed: " + std::strerror(errno)));
  path_ = pattern;
  unsigned char bytes[32];
  std::FILE* random = std::fopen("/dev/urandom", "rb");
  const bool read = random && std::fread(bytes, 1, sizeof bytes, random) == sizeof bytes;
  if (random) std::fclose(random);
  std::string hex;
  for (unsigned char b : bytes) {
    static constexpr char kDigits[] = "0123456789abcdef";
    hex += kDigits[b >> 4];
    hex += kDigits[b & 15];
  }
  const bool written = read && ::write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size());
  ::close(fd);
  if (!written) throw Error(Status::internal("cannot write a cluster token to " + path_));
}

ClusterToken::~ClusterToken() { ::unlink(path_.c_str()); }

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  if (!ok) throw Error(Status::internal(std::string("cannot find a free port: ") + std::strerror(errno)));
  return ntohs(address.sin_port);
}

std::string executable_directory() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

}  // namespace gradsync
