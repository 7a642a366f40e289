#include "tests/bench/supervise.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <exception>

#include "client/tools/process.h"

namespace gradsync::bench {
namespace {

// Signals whose default action ends a process and that someone may send an interrupted bench
// (the terminal's SIGINT and SIGQUIT included): each stops the bench's whole group.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM};

// How long the group has to shut down after SIGTERM (daemons end their jobs) before SIGKILL.
constexpr long kGraceMs = 5000;

// The bench child and how it ended.
struct Bench {
  pid_t pid = -1;
  int status = 0;
  bool ended = false;
};

// Reaps every child that has exited (orphans of the bench's group come here: this process is
// their subreaper), noting the bench's end when it is among them.
void reap(Bench* bench) {
  int status = 0;
  for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;) {
    if (p == bench->pid) {
      bench->status = status;
      bench->ended = true;
    }
  }
}

// True while any process of the bench's group is left (exited ones are reaped first).
bool group_alive(Bench* bench) {
  reap(bench);
  return ::kill(-bench->pid, 0) == 0 || errno != ESRCH;
}

// Waits up to `ms` for one of `signals`; returns it, or 0.
int wait_signal(const sigset_t& signals, long ms) {
  const timespec timeout{ms / 1000, (ms % 1000) * 1'000'000};
  siginfo_t info;
  const int signo = ::sigtimedwait(&signals, &info, &timeout);
  return signo > 0 ? signo : 0;
}

// SIGTERM to what is left of the group, up to kGraceMs for it to go (a stop signal meanwhile:
// no more waiting), then SIGKILL. A stop signal that came is noted in *caught.
void stop_group(Bench* bench, const sigset_t& stops, int* caught) {
  if (!group_alive(bench)) return;
  ::kill(-bench->pid, SIGTERM);
  for (long waited = 0; waited < kGraceMs && group_alive(bench); waited += 100) {
    if (const int signo = wait_signal(stops, 100)) {
      if (!*caught) *caught = signo;
      break;
    }
  }
  if (!group_alive(bench)) return;
  ::kill(-bench->pid, SIGKILL);
  for (int i = 0; i < 500 && group_alive(bench); ++i) ::usleep(10'000);
}

// The bench's own group ends when its supervisor is killed outright (SIGKILL), which can
// forward nothing: the kernel sends the bench this signal then (PR_SET_PDEATHSIG), and the
// bench sends SIGTERM to its whole group, itself, its daemons and its trainers included, as
// the supervisor would have. (Daemons then end their jobs and exit; nobody is left to SIGKILL
// one that would not.)
void stop_own_group(int) {
  // SIGTERM must end this process too, whatever it inherited (ignored, or blocked).
  ::signal(SIGTERM, SIG_DFL);
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_UNBLOCK, &term, nullptr);
  ::kill(0, SIGTERM);
}

// Removes a directory and what is in it when it goes (the supervisor's, not the bench's: the
// child leaves with _Exit and never runs it).
struct ScratchDirectory {
  std::string path;
  ~ScratchDirectory() { remove(); }
  // Now, for a path that leaves without unwinding (die_of()).
  void remove() {
    if (path.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
    path.clear();
  }
};

// Dies of `signo` as if this process had not caught it, so that a calling shell sees the
// interruption (a loop stops on Ctrl-C).
[[noreturn]] void die_of(int signo) {
  ::signal(signo, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, signo);
  sigprocmask(SIG_UNBLOCK, &only, nullptr);
  ::raise(signo);
  std::_Exit(128 + signo);
}

}  // namespace

int run_supervised(const std::function<int()>& body) {
  // The stop signals this process forwards: not those it was started ignoring (nohup, or a
  // background job of a non-interactive shell), which must not stop the bench either.
  sigset_t stops;
  sigemptyset(&stops);
  for (int s : kStopSignals) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) == 0 && current.sa_handler != SIG_IGN) sigaddset(&stops, s);
  }
  // An inherited SIGCHLD ignore would make the kernel reap children unseen (here and in the
  // bench, which waits for its trainers): undo it for both.
  ::signal(SIGCHLD, SIG_DFL);
  sigset_t handled = stops;
  sigaddset(&handled, SIGCHLD);
  // Blocked before the fork, so that a signal that comes early is not lost: this process takes
  // them with sigwaitinfo(), the child restores the mask it had.
  sigset_t previous;
  sigprocmask(SIG_BLOCK, &handled, &previous);
  // Descendants whose parent dies (a daemon whose bench was killed) become this process's
  // children, so it can wait for them and reap them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Everything the bench's group creates in the temporary directory (daemon sockets, the
  // cluster token, the Gloo floor's store) goes into one private directory, which this process
  // removes once the group is gone: processes killed by a stop signal remove nothing. It is in
  // /tmp, not $TMPDIR: a daemon's socket path must stay short (108 bytes) and in folders that
  // gradsyncd's checks accept.
  std::string scratch = "/tmp/gradsync-bench-XXXXXX";
  if (!::mkdtemp(scratch.data())) {
    std::perror("gradsync-bench: mkdtemp /tmp/gradsync-bench-XXXXXX (its files go into /tmp itself)");
    scratch.clear();
  }
  ScratchDirectory cleanup{scratch};
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t self = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("gradsync-bench: fork (running unsupervised)");
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    return body();
  }
  if (child == 0) {
    cleanup.path.clear();  // the supervisor's to remove, once the whole group is gone
    // A supervisor killed outright (SIGKILL) cannot forward anything: stop_own_group() then,
    // which signals this process's group (only once it is a group of its own).
    const int orphaned = SIGRTMIN;
    if (::setpgid(0, 0) == 0) {
      struct sigaction on_orphaned {};
      on_orphaned.sa_handler = stop_own_group;
      ::sigaction(orphaned, &on_orphaned, nullptr);
      ::prctl(PR_SET_PDEATHSIG, orphaned);
    } else {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    }
    sigset_t unblock;
    sigemptyset(&unblock);
    sigaddset(&unblock, orphaned);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    sigprocmask(SIG_UNBLOCK, &unblock, nullptr);
    if (::getppid() != self) std::_Exit(128 + SIGTERM);  // the supervisor is already gone
    if (!scratch.empty()) ::setenv(kScratchVariable, scratch.c_str(), 1);
    int status = 1;
    try {
      status = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gradsync-bench: %s\n", e.what());
    }
    std::fflush(nullptr);
    std::_Exit(status);
  }
  ::setpgid(child, child);  // also here: a signal may come before the child has run
  Bench bench{child};
  int caught = 0;  // the first stop signal this process got
  // Until the bench ends; after a stop signal, at most kGraceMs more (a bench that ignores
  // SIGTERM, or is stopped, must not keep this process waiting forever).
  for (long waited = 0; !bench.ended && (!caught || waited < kGraceMs);) {
    siginfo_t info;
    const int signo = caught ? wait_signal(handled, 100) : ::sigwaitinfo(&handled, &info);
    if (caught) waited += 100;
    if (signo <= 0) continue;  // EINTR, or a slice of the grace period
    if (signo == SIGCHLD) {
      reap(&bench);
      continue;
    }
    // SIGTERM for the first (gradsyncd reloads its configuration on SIGHUP and shuts down
    // cleanly on SIGTERM), SIGKILL for a second one.
    if (group_alive(&bench)) ::kill(-child, caught ? SIGKILL : SIGTERM);
    if (!caught) caught = signo;
  }
  // Whatever of the group is left (daemons shutting down, or anything the bench started and
  // did not end: a crash, the OOM killer, a torch rank that outlived its parent) is stopped.
  stop_group(&bench, stops, &caught);
  if (caught) {
    cleanup.remove();  // die_of() does not return: no destructor runs after it
    die_of(caught);
  }
  if (!bench.ended) return 128 + SIGKILL;
  return WIFEXITED(bench.status) ? WEXITSTATUS(bench.status) : 128 + WTERMSIG(bench.status);
}

}  // namespace gradsync::bench
