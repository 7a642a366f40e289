#include "tests/etcd/etcd_cluster.h"

#include <unistd.h>

#include <csignal>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

namespace gradsync::test {

std::string etcd_binary() {
  const char* given = std::getenv("GRADSYNC_ETCD");
  const std::string path = given && *given ? given : "/usr/bin/etcd";
  return ::access(path.c_str(), X_OK) == 0 ? path : std::string();
}

namespace {
// In /dev/shm, as TempFolder's pattern would put it in /tmp.
std::string shm_folder() {
  // Not named "gradsync...": faults_test checks that no such entry is left behind, and may
  // run beside this.
  std::string pattern = "/dev/shm/test-etcd-data-XXXXXX";
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}
}  // namespace

EtcdCluster::EtcdCluster(int members, const Tls* tls, const std::vector<std::string>& extra_args)
    : folder_("gradsync-etcd-XXXXXX"), tls_(tls != nullptr) {
  data_ = shm_folder();
  if (tls) ca_ = tls->ca;
  // Free ports are found by binding port 0 and letting go, so another process (a test running
  // beside this one) can take one before a member binds it, and that member exits at once: its
  // cluster never becomes healthy. Such a start is retried on fresh ports; a cluster whose
  // members all run but stay unhealthy is not.
  std::string why;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    why = start(members, tls, extra_args, attempt);
    if (why.empty()) return;
    WARN("etcd cluster start " << attempt << " of 3 failed: " << why);
  }
  discard();  // a constructor that throws runs no destructor
  FAIL("the etcd cluster did not start: " << why);
}

void EtcdCluster::discard() {
  members_.clear();  // each ChildProcess kills and reaps its member
  std::error_code ignored;
  std::filesystem::remove_all(data_, ignored);
}

namespace {
// The last `bytes` of a file ("" when it cannot be read).
std::string tail_of(const std::string& path, size_t bytes = 600) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}
}  // namespace

std::string EtcdCluster::start(int members, const Tls* tls, const std::vector<std::string>& extra_args, int attempt) {
  members_.clear();  // a failed attempt's members are killed and reaped, their data removed
  client_ports_.clear();
  alive_.clear();
  std::error_code ignored;
  std::filesystem::remove_all(data_ + "/attempt" + std::to_string(attempt - 1), ignored);
  const std::string data = data_ + "/attempt" + std::to_string(attempt);
  std::vector<int> peer_ports;
  std::string initial;
  for (int i = 0; i < members; ++i) {
    client_ports_.push_back(free_loopback_port());
    peer_ports.push_back(free_loopback_port());
    initial += (i ? "," : "") + ("m" + std::to_string(i)) + "=http://127.0.0.1:" + std::to_string(peer_ports.back());
  }
  const std::string scheme = tls ? "https" : "http";
  const std::string logs = folder_.path() + "/attempt" + std::to_string(attempt) + "-m";
  for (int i = 0; i < members; ++i) {
    const std::string url = scheme + "://127.0.0.1:" + std::to_string(client_ports_[static_cast<size_t>(i)]);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_ports[static_cast<size_t>(i)]);
    std::vector<std::string> argv = {etcd_binary(), "--name", "m" + std::to_string(i), "--data-dir",
                                     data + "/m" + std::to_string(i), "--listen-client-urls", url,
                                     "--advertise-client-urls", url, "--listen-peer-urls", peer,
                                     "--initial-advertise-peer-urls", peer, "--initial-cluster", initial,
                                     "--initial-cluster-state", "new", "--initial-cluster-token",
                                     "gradsync-test-" + std::to_string(::getpid()) + "-" + std::to_string(attempt),
                                     // A killed leader is replaced within a second.
                                     "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap",
                                     "--log-outputs", logs + std::to_string(i) + ".log"};
    if (tls) argv.insert(argv.end(), {"--cert-file", tls->cert, "--key-file", tls->key});
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    members_.emplace_back(argv, logs + std::to_string(i) + ".out");
    alive_.push_back(true);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  CommandRun health;
  while (std::chrono::steady_clock::now() < deadline) {
    health = ctl("endpoint health");
    // Every member is checked even after a healthy answer: the process holding a port taken
    // from under a member may be another test's etcd, which answers for it.
    for (int i = 0; i < members; ++i) {
      const int status = members_[static_cast<size_t>(i)].wait_for(std::chrono::milliseconds(0));
      if (status == -1) continue;
      alive_[static_cast<size_t>(i)] = false;
      const std::string said = tail_of(logs + std::to_string(i) + ".log") + tail_of(logs + std::to_string(i) + ".out");
      const std::string why = "member m" + std::to_string(i) + " " + describe_wait_status(status) + ": " + said;
      // Only a port taken first is worth another try; anything else is a real failure.
      if (said.find("address already in use") == std::string::npos) {
        discard();
        FAIL("the etcd cluster did not start: " << why);
      }
      return why;
    }
    if (health.code == 0) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO(health.output);
  discard();
  FAIL("the etcd cluster's members all run but it was not healthy within 30 s");
  return "unreachable";
}

EtcdCluster::~EtcdCluster() { discard(); }

std::string EtcdCluster::endpoints() const {
  std::string all;
  for (size_t i = 0; i < client_ports_.size(); ++i) all += (i ? "," : "") + member(static_cast<int>(i));
  return all;
}

void EtcdCluster::kill(int i) {
  members_[static_cast<size_t>(i)].signal(SIGKILL);
  members_[static_cast<size_t>(i)].wait_for(std::chrono::seconds(10));
  alive_[static_cast<size_t>(i)] = false;
}

void EtcdCluster::freeze(int i) { members_[static_cast<size_t>(i)].signal(SIGSTOP); }

void EtcdCluster::thaw(int i) { members_[static_cast<size_t>(i)].signal(SIGCONT); }

CommandRun EtcdCluster::ctl(const std::string& args, const std::string& user) const {
  std::string endpoints;
  for (size_t i = 0; i < client_ports_.size(); ++i) {
    if (!alive_[i]) continue;
    endpoints += (endpoints.empty() ? "" : ",") + std::string(tls_ ? "https" : "http") + "://" +
                 member(static_cast<int>(i));
  }
  std::string command = "ETCDCTL_API=3 etcdctl --dial-timeout 2s --command-timeout 5s --endpoints=" + endpoints;
  if (tls_) command += " --cacert " + ca_;
  if (!user.empty()) command += " --user '" + user + "'";
  return run_command(command + " " + args);
}

void EtcdCluster::enable_auth(const std::string& name, const std::string& password, const std::string& prefix) {
  for (const std::string& step :
       {std::string("user add ") + kRoot + " --interactive=false", std::string("role add gradsync"),
        "role grant-permission gradsync --prefix=true readwrite " + prefix,
        "user add " + name + ":" + password + " --interactive=false", "user grant-role " + name + " gradsync",
        std::string("auth enable")}) {
    const CommandRun run = ctl(step);
    INFO(step << ": " << run.output);
    REQUIRE(run.code == 0);
  }
}

}  // namespace gradsync::test
