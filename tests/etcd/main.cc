// The etcd tests' main: they start real etcd members (Debian's etcd-server, which .ci installs),
// so without one the whole executable is skipped (exit 77, CTest's SKIP_RETURN_CODE), saying so.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "tests/etcd/etcd_cluster.h"

int main(int argc, char** argv) {
  if (gradsync::test::etcd_binary().empty()) {
    std::printf("skipped: no etcd (apt-get install etcd-server, or set GRADSYNC_ETCD)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
