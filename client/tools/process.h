// Child processes for the demo, the benchmark and the tests: a running gradsyncd on a private
// socket, and trainer processes. RAII: a DaemonProcess or ChildProcess that goes out of scope
// kills (SIGKILL) and reaps its process, so a failing test never leaves one behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace gradsync {

class ChildProcess {
 public:
  ChildProcess() = default;
  // Starts argv[0] (a path) with the given arguments; stdout/stderr are inherited unless
  // `output_file` is set, in which case both go there.
  explicit ChildProcess(const std::vector<std::string>& argv, const std::string& output_file = {});
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !reaped_; }

  // Sends a signal (SIGKILL, SIGSTOP, SIGTERM, ...).
  void signal(int signo) const;

  // Waits at most `timeout` for the process to exit; returns its wait status, or -1 on timeout.
  int wait_for(std::chrono::milliseconds timeout);

 private:
  void kill_and_reap();

  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// "exited 0", "exited 3", "killed by signal 9"
std::string describe_wait_status(int status);

// True when the wait status is a normal exit with code 0.
bool exited_ok(int status);

// A private temporary folder made from `name` ("gradsync-XXXXXX", see temp_pattern), removed
// with what it holds when this goes. Throws Error when it cannot be made.
class TempFolder {
 public:
  explicit TempFolder(const std::string& name);
  ~TempFolder();
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A gradsyncd started on a fresh socket in a private temporary directory, removed afterwards
// (also when it does not come up).
class DaemonProcess {
 public:
  struct Options {
    std::string binary;                    // path to gradsyncd
    std::vector<std::string> extra_args;   // e.g. {"--timeout-ms", "2000"}
    std::string log_file;                  // empty: inherit stderr
  };
  // Starts the daemon and waits (at most 10 s) until its socket accepts connections; throws
  // Error if it does not come up.
  explicit DaemonProcess(const Options& options);
  ~DaemonProcess();

  const std::string& socket_path() const { return socket_path_; }
  const std::string& directory() const { return directory_.path(); }
  ChildProcess& process() { return process_; }

  // Sends SIGTERM and waits for a clean exit; returns the wait status.
  int terminate(std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  TempFolder directory_;  // before process_: removed after the daemon is gone
  std::string socket_path_;
  ChildProcess process_;
};

// Directory of the running executable, to find sibling binaries (gradsyncd next to the demo).
std::string executable_directory();

// The environment variable naming a private folder for the temporary files of this process
// and its children (the benchmark's supervisor sets it for the bench's process group, and
// removes the folder afterwards). Unset: /tmp.
inline constexpr const char* kScratchVariable = "GRADSYNC_SCRATCH_DIR";

// A mkdtemp/mkstemp pattern for `name` ("gradsync-XXXXXX") in $GRADSYNC_SCRATCH_DIR, or in
// /tmp. Not $TMPDIR: a daemon's socket goes there, and its path must stay short (108 bytes)
// and in folders gradsyncd's checks accept.
std::string temp_pattern(const std::string& name);

// A free TCP port on 127.0.0.1 (bound and released; another process could take it meanwhile).
int free_loopback_port();

// A cluster token for daemons on loopback playing the nodes of a job (--peer-token-file): 32
// random bytes as hex in a private file, removed when this goes away.
class ClusterToken {
 public:
  ClusterToken();
  ~ClusterToken();
  ClusterToken(const ClusterToken&) = delete;
  ClusterToken& operator=(const ClusterToken&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace gradsync
