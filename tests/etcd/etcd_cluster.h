// A real etcd cluster on loopback for the tests (Debian's etcd-server): N members, each with
// its own client and peer port and a data folder in /dev/shm (a write's fsync is free there),
// optionally serving TLS. Every member is killed and its folder removed when this goes.
#pragma once

#include <string>
#include <vector>

#include "client/tools/process.h"
#include "tests/integration/harness.h"

namespace gradsync::test {

// The etcd binary: $GRADSYNC_ETCD, else /usr/bin/etcd; empty when there is none.
std::string etcd_binary();

class EtcdCluster {
 public:
  static constexpr char kRoot[] = "root:root-password";  // for ctl() once authentication is on
  struct Tls {
    std::string ca, cert, key;  // the members' CA, and their certificate and key
  };
  // Starts `members` members and waits (at most 30 s) until each answers; the test fails if
  // they do not. A start in which a member exited because a port was taken first (by another
  // process) is retried on fresh ports, up to 3 times; any other exit fails the test.
  explicit EtcdCluster(int members, const Tls* tls = nullptr, const std::vector<std::string>& extra_args = {});
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // "127.0.0.1:P0,127.0.0.1:P1,..."
  std::string endpoints() const;
  std::string member(int i) const { return "127.0.0.1:" + std::to_string(client_ports_[static_cast<size_t>(i)]); }
  // SIGKILL, and reaped.
  void kill(int i);
  // SIGSTOP and SIGCONT: a member that holds its connections and answers nothing.
  void freeze(int i);
  void thaw(int i);
  // etcdctl against the members still running, as `user` ("name:password") when given.
  CommandRun ctl(const std::string& args, const std::string& user = {}) const;
  // Turns authentication on: a root user (kRoot), and a user `name` with `password` allowed to
  // read and write under `prefix` only.
  void enable_auth(const std::string& name, const std::string& password, const std::string& prefix);

 private:
  // One try at starting the members on fresh ports: "" once the cluster is healthy, else why
  // not (a member that exited). Fails the test when all run but the cluster stays unhealthy.
  std::string start(int members, const Tls* tls, const std::vector<std::string>& extra_args, int attempt);
  // Kills the members and removes their data (before a constructor that fails throws).
  void discard();

  TempFolder folder_;  // the members' logs
  std::string data_;   // their data, in /dev/shm
  bool tls_ = false;
  std::string ca_;
  std::vector<int> client_ports_;
  std::vector<bool> alive_;
  std::vector<ChildProcess> members_;
};

}  // namespace gradsync::test
