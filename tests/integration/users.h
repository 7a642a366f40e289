// Other users and certificates for the tests of trust boundaries: system users created on
// first use (tests run as root), a forked child becoming one for good, a daemon's private
// folder opened to them, and certificates made with openssl.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace gradsync::test {

struct TestUser {
  uid_t uid = 0;
  gid_t gid = 0;
};

// The system user `name`, created (no home, no shell) if missing.
TestUser system_user(const std::string& name);

// The unprivileged user the tests run processes as: "gradsync-test".
TestUser test_user();

// In a forked child: become `user` for good (no way back to root).
bool become(const TestUser& user);

// Lets other users reach the daemon's sockets (the test daemon's folder is private).
void open_socket_folder(const TestDaemon& daemon);

// A certificate to make: its file name in the folder, its common name, its extensions (an
// openssl -extfile line), and the CA that signs it ("ca" or "rogue").
struct CertificateSpec {
  std::string file;
  std::string common_name;
  std::string extensions;
  std::string ca = "ca";
};

// Makes, with openssl in `dir`, a CA "ca", another "rogue" nobody trusts, and `certificates`
// (FILE.crt and FILE.key each). The test fails when openssl does.
void make_certificates(const std::string& dir, const std::vector<CertificateSpec>& certificates);

}  // namespace gradsync::test
