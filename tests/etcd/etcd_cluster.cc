#include "tests/etcd/etcd_cluster.h"

#include <unistd.h>

#include <csignal>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
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
  std::string pattern = "/dev/shm/gradsync-etcd-XXXXXX";
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}
}  // namespace

EtcdCluster::EtcdCluster(int members, const Tls* tls, const std::vector<std::string>& extra_args)
    : folder_("gradsync-etcd-XXXXXX"), tls_(tls != nullptr) {
  data_ = shm_folder();
  const std::string& data = data_;
  std::vector<int> peer_ports;
  std::string initial;
  for (int i = 0; i < members; ++i) {
    client_ports_.push_back(free_loopback_port());
    peer_ports.push_back(free_loopback_port());
    initial += (i ? "," : "") + ("m" + std::to_string(i)) + "=http://127.0.0.1:" + std::to_string(peer_ports.back());
  }
  if (tls) ca_ = tls->ca;
  const std::string scheme = tls ? "https" : "http";
  for (int i = 0; i < members; ++i) {
    const std::string url = scheme + "://127.0.0.1:" + std::to_string(client_ports_[static_cast<size_t>(i)]);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_ports[static_cast<size_t>(i)]);
    std::vector<std::string> argv = {etcd_binary(), "--name", "m" + std::to_string(i), "--data-dir",
                                     data + "/m" + std::to_string(i), "--listen-client-urls", url,
                                     "--advertise-client-urls", url, "--listen-peer-urls", peer,
                                     "--initial-advertise-peer-urls", peer, "--initial-cluster", initial,
                                     "--initial-cluster-state", "new", "--initial-cluster-token",
                                     "gradsync-test-" + std::to_string(::getpid()),
                                     // A killed leader is replaced within a second.
                                     "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap",
                                     "--log-outputs", folder_.path() + "/m" + std::to_string(i) + ".log"};
    if (tls) argv.insert(argv.end(), {"--cert-file", tls->cert, "--key-file", tls->key});
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    members_.emplace_back(argv, folder_.path() + "/m" + std::to_string(i) + ".out");
    alive_.push_back(true);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  CommandRun health;
  while (std::chrono::steady_clock::now() < deadline) {
    health = ctl("endpoint health");
    if (health.code == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO(health.output);
  REQUIRE(health.code == 0);
}

EtcdCluster::~EtcdCluster() {
  members_.clear();  // each ChildProcess kills and reaps its member
  std::error_code ignored;
  std::filesystem::remove_all(data_, ignored);
}

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
