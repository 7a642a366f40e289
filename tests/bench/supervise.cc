#include "tests/bench/supervise.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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

// True while any process of the group is left (zombies are reaped first).
bool group_alive(pid_t group) {
  int ignored;
  reap(-1, &ignored);
  return ::kill(-group, 0) == 0 || errno != ESRCH;
}

}  // namespace

int run_supervised(const std::function<int()>& body) {
  // Blocked before the fork, so that a signal that comes early is not lost: this process takes
  // them with sigwaitinfo(), the child restores the mask it had.
  sigset_t handled, previous;
  sigemptyset(&handled);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&handled, s);
  sigprocmask(SIG_BLOCK, &handled, &previous);
  // Descendants whose parent dies (a daemon whose bench was killed) become this process's
  // children, so it can wait for them and reap them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("gradsync-bench: fork (running unsupervised)");
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    return body();
  }
  if (child == 0) {
    ::setpgid(0, 0);
    // A supervisor killed outright (SIGKILL) cannot forward anything: end the bench then too.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    if (::getppid() == 1) std::_Exit(128 + SIGTERM);  // the supervisor is already gone
    const int status = body();
    std::fflush(nullptr);
    std::_Exit(status);
  }
  ::setpgid(child, child);  // also here: a signal may come before the child has run
  bool forwarded = false;
  int status = 0;
  for (;;) {
    siginfo_t info;
    const int signo = ::sigwaitinfo(&handled, &info);
    if (signo < 0) continue;  // EINTR
    if (signo == SIGCHLD) {
      if (reap(child, &status)) break;
      continue;
    }
    // The first signal lets the daemons shut down cleanly; a second one does not wait.
    ::kill(-child, forwarded ? SIGKILL : signo);
    forwarded = true;
  }
  // A bench that returns has ended its children. One that a signal ended leaves the rest of
  // its group shutting down (daemons on SIGTERM): give them five seconds, then SIGKILL.
  if (forwarded || WIFSIGNALED(status)) {
    for (int i = 0; i < 50 && group_alive(child); ++i) ::usleep(100'000);
    ::kill(-child, SIGKILL);
    for (int i = 0; i < 500 && group_alive(child); ++i) ::usleep(10'000);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace gradsync::bench
