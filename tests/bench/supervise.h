// Runs the benchmark so that an interrupted or killed benchmark leaves nothing behind: the
// bench runs in a child process that leads a process group of its own, which every daemon,
// trainer, Gloo rank and torch peer it starts joins; this process forwards SIGINT, SIGTERM and
// SIGHUP to that whole group (a second one: SIGKILL) and exits with the bench's status.
// Without it, `kill <bench>` ended the bench alone and left its gradsyncd processes running.
#pragma once

#include <functional>

namespace gradsync::bench {

// Returns body()'s exit status, or 128 + the signal that ended the bench.
int run_supervised(const std::function<int()>& body);

}  // namespace gradsync::bench
