// gradsyncd's whole main(), in the daemon library: main.cc only calls it, so the executable's
// own file includes nothing heavy (it compiled in 11 s on its own; inside a batch, in none).
#pragma once

namespace gradsync {

// Parses the command line and the configuration file, starts the daemon and runs it until it
// is stopped. Returns the process's exit status: 0 after a clean stop, 1 when it cannot start
// or fails, 2 for a usage error, Daemon::kExitGpuLost (never returns then: it _Exit()s).
int daemon_main(int argc, char** argv);

}  // namespace gradsync
