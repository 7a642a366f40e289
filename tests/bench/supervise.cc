#include "tests/bench/supervise.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace gradsync::bench {
namespace {

// Reaps every child that has exited (orphans of the bench's group come here: this process is
// their subreaper); true once the bench itself is among them, with its wait status.
bool reap(pid_t bench, int* bench_status) {
  bool ended = false;
  int status = 0;
  for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;) {
    if (p == bench) {
      *bench_status = status;
      ended = true;
    }
  }
  return ended;
}

// True while any process of the group is left (exited ones are reaped first).
bool group_alive(pid_t group) {
  int ignored;
  reap(-1, &ignored);
  return ::kill(-group, 0) == 0 || errno != ESRCH;
}

// Waits up to `ms` for one of `signals`; returns it, or 0.
int wait_signal(const sigset_t& signals, long ms) {
  const timespec timeout{ms / 1000, (ms % 1000) * 1'000'000};
  siginfo_t info;
  const int signo = ::sigtimedwait(&signals, &info, &timeout);
  return signo > 0 ? signo : 0;
}

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
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) == 0 && current.sa_handler != SIG_IGN) sigaddset(&stops, s);
  }
  sigset_t handled = stops;
  sigaddset(&handled, SIGCHLD);
  // Blocked before the fork, so that a signal that comes early is not lost: this process takes
  // them with sigwaitinfo(), the child restores the mask it had.
  sigset_t previous;
  sigprocmask(SIG_BLOCK, &handled, &previous);
  // Descendants whose parent dies (a daemon whose bench was killed) become this process's
  // children, so it can wait for them and reap them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t self = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("gradsync-bench: fork (running unsupervised)");
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    return body();
  }
  if (child == 0) {
    ::setpgid(0, 0);
    // A supervisor killed outright (SIGKILL) cannot forward anything: end the bench then too.
    // (Its daemons then stay: nothing can stop them without the supervisor.)
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    if (::getppid() != self) std::_Exit(128 + SIGTERM);  // the supervisor is already gone
    const int status = body();
    std::fflush(nullptr);
    std::_Exit(status);
  }
  ::setpgid(child, child);  // also here: a signal may come before the child has run
  int caught = 0;           // the first stop signal this process got
  int status = 0;
  for (;;) {
    siginfo_t info;
    const int signo = ::sigwaitinfo(&handled, &info);
    if (signo < 0) continue;  // EINTR
    if (signo == SIGCHLD) {
      if (reap(child, &status)) break;
      continue;
    }
    // SIGTERM for the first (gradsyncd reloads its configuration on SIGHUP, and shuts down
    // cleanly on SIGTERM), SIGKILL for a second one.
    ::kill(-child, caught ? SIGKILL : SIGTERM);
    if (!caught) caught = signo;
  }
  // A bench that returns has ended its children. One that a signal ended (forwarded or not:
  // a crash, the OOM killer) leaves the rest of its group: ask it to stop, give the daemons
  // five seconds to shut down cleanly (a further stop signal: no more waiting), then SIGKILL.
  if (caught || WIFSIGNALED(status)) {
    if (!caught) ::kill(-child, SIGTERM);
    for (int i = 0; i < 50 && group_alive(child); ++i) {
      const int signo = wait_signal(stops, 100);
      if (signo == 0) continue;
      if (!caught) caught = signo;
      break;
    }
    ::kill(-child, SIGKILL);
    for (int i = 0; i < 500 && group_alive(child); ++i) ::usleep(10'000);
  }
  if (caught) die_of(caught);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace gradsync::bench
