// What a daemon's etcd settings allow (daemon/rendezvous/etcd_access.h): which members a job's
// rendezvous may name, and the settings refused at start, each naming its flag.
#include "daemon/rendezvous/etcd_access.h"

#include <catch2/catch.hpp>

#include <fstream>

#include "client/tools/process.h"

namespace gradsync {
namespace {

Status load(const EtcdSettings& settings, std::shared_ptr<const EtcdAccess>* out = nullptr) {
  std::shared_ptr<const EtcdAccess> ignored;
  return EtcdAccess::load(settings, std::chrono::hours(1), out ? out : &ignored);
}

}  // namespace

TEST_CASE("etcd access: a job's members, checked against --etcd-endpoints, and bad settings refused naming the flag",
          "[etcd]") {
  CHECK(is_etcd_rendezvous("etcd://10.0.0.1:2379"));
  CHECK_FALSE(is_etcd_rendezvous("10.0.0.1:29590"));

  // Without --etcd-endpoints: any member a job names, and no credentials.
  std::shared_ptr<const EtcdAccess> open;
  REQUIRE(load({}, &open).ok());
  std::vector<std::string> members;
  REQUIRE(open->members("etcd://10.0.0.1:2379,[::1]:2379,10.0.0.1:2379", &members).ok());
  CHECK(members == std::vector<std::string>{"10.0.0.1:2379", "[::1]:2379"});
  Status bare = open->members("etcd://", &members);
  CHECK(bare.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(bare.message(), Catch::Contains("names no etcd member, and this gradsyncd has no --etcd-endpoints"));
  CHECK_THAT(open->members("etcd://10.0.0.1", &members).message(), Catch::Contains("not an etcd member's HOST:PORT"));
  CHECK_THAT(open->members("etcd://10.0.0.1:0", &members).message(), Catch::Contains("port 0 names no member"));
  CHECK_THAT(open->members("etcd://0.0.0.0:2379", &members).message(), Catch::Contains("wildcard"));
  CHECK_THAT(open->members("etcd://a:1,", &members).message(), Catch::Contains("not an etcd member's HOST:PORT"));

  // With them: a bare etcd:// means them; a member outside them is refused, named.
  EtcdSettings listed;
  listed.endpoints = {"10.0.0.1:2379,10.0.0.2:2379", "10.0.0.3:2379"};
  std::shared_ptr<const EtcdAccess> closed;
  REQUIRE(load(listed, &closed).ok());
  REQUIRE(closed->members("etcd://", &members).ok());
  CHECK(members == std::vector<std::string>{"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"});
  REQUIRE(closed->members("etcd://10.0.0.2:2379", &members).ok());
  const Status stranger = closed->members("etcd://10.0.0.2:2379,evil.example:2379", &members);
  CHECK(stranger.code() == ErrorCode::kPermissionDenied);
  CHECK_THAT(stranger.message(), Catch::Contains("evil.example:2379, which is not one of this gradsyncd's "
                                                 "--etcd-endpoints (10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379)"));

  // Refused at start.
  EtcdSettings user;
  user.user = "nodes";
  user.password_file = "/nonexistent";
  CHECK_THAT(load(user).message(), Catch::Contains("need --etcd-endpoints"));
  user.endpoints = {"10.0.0.1:2379"};
  CHECK_THAT(load(user).message(), Catch::Contains("--etcd-password-file: cannot read '/nonexistent'"));
  user.password_file.clear();
  CHECK_THAT(load(user).message(), Catch::Contains("--etcd-user and --etcd-password-file go together"));
  EtcdSettings cert;
  cert.endpoints = {"10.0.0.1:2379"};
  cert.tls_cert = "/c.pem";
  CHECK_THAT(load(cert).message(), Catch::Contains("--etcd-tls-cert and --etcd-tls-key go together"));
  EtcdSettings bad;
  bad.endpoints = {"10.0.0.1"};
  CHECK_THAT(load(bad).message(), Catch::Contains("--etcd-endpoints: '10.0.0.1' is not an etcd member's HOST:PORT"));
  EtcdSettings prefix;
  prefix.prefix = "gradsync";
  CHECK_THAT(load(prefix).message(), Catch::Contains("--etcd-prefix must start and end with '/'"));
  EtcdSettings ttl;
  ttl.lease_ttl = std::chrono::seconds(1);
  CHECK_THAT(load(ttl).message(), Catch::Contains("--etcd-lease-ttl-s must be at least 2"));

  // A CA that is no certificate would turn TLS off without a word (the password in clear).
  TempFolder folder("gradsync-etcd-access-XXXXXX");
  const std::string empty = folder.path() + "/empty.pem";
  std::ofstream(empty).close();
  EtcdSettings ca;
  ca.tls_ca = empty;
  CHECK_THAT(load(ca).message(), Catch::Contains("--etcd-tls-ca: '" + empty + "' holds no PEM block"));
  ca.tls_ca = folder.path();
  CHECK_THAT(load(ca).message(), Catch::Contains("--etcd-tls-ca: '" + folder.path() + "' is not a regular file"));

  // At most 16 members, in the flags or in a job's rendezvous.
  std::string many = "etcd://";
  for (int i = 0; i < 17; ++i) many += (i ? ",10.0.0." : "10.0.0.") + std::to_string(i + 1) + ":2379";
  CHECK_THAT(open->members(many, &members).message(), Catch::Contains("more than 16 etcd members"));
}

}  // namespace gradsync
