// Runs the benchmark so that an interrupted or killed benchmark leaves nothing behind: the
// bench runs in a child process that leads a process group of its own, which every daemon,
// trainer, Gloo rank and torch peer it starts joins; SIGINT, SIGTERM or SIGHUP to this process
// sends SIGTERM to that whole group (a second one: SIGKILL), and this process then dies of the
// signal it got; otherwise it exits with the bench's status. Without it, `kill <bench>` ended
// the bench alone and left its gradsyncd processes running. (SIGKILL to this process still
// does: nothing is left to forward it.)
#pragma once

#include <functional>

namespace gradsync::bench {

// Returns body()'s exit status, or 128 + the signal that ended the bench.
int run_supervised(const std::function<int()>& body);

}  // namespace gradsync::bench
