#include "tests/integration/users.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>

namespace gradsync::test {

TestUser system_user(const std::string& name) {
  if (!::getpwnam(name.c_str())) {
    const std::string command = "useradd --system --no-create-home --shell /usr/sbin/nologin " + name + " >/dev/null 2>&1";
    REQUIRE(std::system(command.c_str()) == 0);
  }
  passwd* entry = ::getpwnam(name.c_str());
  REQUIRE(entry != nullptr);
  return TestUser{entry->pw_uid, entry->pw_gid};
}

TestUser test_user() { return system_user("gradsync-test"); }

bool become(const TestUser& user) {
  return ::setgroups(0, nullptr) == 0 && ::setresgid(user.gid, user.gid, user.gid) == 0 &&
         ::setresuid(user.uid, user.uid, user.uid) == 0;
}

void open_socket_folder(const TestDaemon& daemon) {
  const std::string dir = daemon.socket().substr(0, daemon.socket().rfind('/'));
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
}

void make_certificates(const std::string& dir, const std::vector<CertificateSpec>& certificates) {
  std::string script =
      "set -e; cd " + dir +
      "\n"
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=test CA' -keyout ca.key -out ca.crt\n"
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=rogue CA' -keyout rogue.key -out rogue.crt\n"
      "cert() { openssl req -newkey rsa:2048 -nodes -subj \"/CN=$2\" -keyout $1.key -out $1.csr;"
      " printf '%s\\n' \"$3\" > $1.ext;"
      " openssl x509 -req -in $1.csr -CA $4.crt -CAkey $4.key -CAcreateserial -days 2 -extfile $1.ext -out $1.crt; }\n";
  for (const auto& c : certificates) {
    script += "cert " + c.file + " '" + c.common_name + "' '" + c.extensions + "' " + c.ca + "\n";
  }
  const CommandRun made = run_command("bash -c \"$(cat <<'SCRIPT'\n" + script + "SCRIPT\n)\" 2>&1");
  INFO(made.output);
  REQUIRE(made.code == 0);
}

}  // namespace gradsync::test
