// gradsyncd: parse the configuration once, build the Daemon, run it.
#include <cstdio>

#include "daemon/config.h"
#include "daemon/daemon.h"

int main(int argc, char** argv) {
  gradsync::ParsedConfig parsed = gradsync::parse_daemon_config(argc, argv);
  if (!parsed.config) {
    std::fprintf(parsed.exit_code == 0 ? stdout : stderr, "%s\n", parsed.message.c_str());
    return parsed.exit_code;
  }
  try {
    // SIGHUP reads the same flags and configuration file again.
    gradsync::Daemon daemon(*parsed.config, [argc, argv] { return gradsync::parse_daemon_config(argc, argv); });
    return daemon.run();
  } catch (const gradsync::Error& e) {
    std::fprintf(stderr, "gradsyncd: %s\n", e.what());
    return 1;
  }
}
