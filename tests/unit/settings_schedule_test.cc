// When a job's settings change, through SettingsSchedule alone: a single-node job's change
// applies from the first operation not begun; the nodes of a multi-node job, each following the
// rendezvous (a real peer service on loopback), apply a change from the largest operation any
// of them had begun plus one; and a node whose peers never answer holds its operations and fails
// the job, naming the change, instead of going on with either settings.
#include "daemon/job/settings_schedule.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_server.h"

namespace gradsync {
namespace {

using namespace std::chrono_literals;

JobSettings cap(uint64_t bytes) {
  JobSettings settings;
  settings.bucket_cap = bytes;
  return settings;
}

// What one node's schedule reports to its job.
struct Node {
  std::atomic<int> wakes{0};
  Mutex mutex;
  Status failure GS_GUARDED_BY(mutex);

  SettingsScheduleOptions options(std::chrono::milliseconds bound) {
    SettingsScheduleOptions o;
    o.job_id = "settings-test";
    o.agreement_bound = bound;
    o.fail = [this](const Status& why) {
      MutexLock lock(mutex);
      if (failure.ok()) failure = why;
    };
    o.failed = [this] {
      MutexLock lock(mutex);
      return !failure.ok();
    };
    o.wake = [this] { wakes.fetch_add(1); };
    o.log = Logger(LogLevel::kError);
    return o;
  }
  Status failed() {
    MutexLock lock(mutex);
    return failure;
  }
};

// Calls begin(seq) until it is no longer held (a change is being agreed), up to 5 s.
bool begin_when_released(SettingsSchedule& schedule, uint64_t seq, std::vector<JobSettings>* due) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!schedule.begin(seq, due)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// A rendezvous with a two-node generation of job "0.job", as config_channel_test.cc makes it.
struct Rendezvous {
  static std::shared_ptr<PeerAuth> cluster() {
    auto auth = std::make_shared<PeerAuth>();
    auth->token = "0123456789abcdef0123456789abcdef-schedule";
    return auth;
  }
  Rendezvous() {
    int64_t incarnation = 0;
    REQUIRE(PeerClient(address, cluster()).add("0.job", "incarnations", 1, 2s, &incarnation).ok());
    for (int n = 0; n < 2; ++n) {
      daemons.push_back(cluster());
      daemons.back()->node = "node" + std::to_string(n);
      daemons.back()->instance_secret = PeerAuth::make_secret();
      REQUIRE(PeerClient(address, daemons.back()).set("0.job", "g0/node/" + std::to_string(n), "", 2s).ok());
    }
  }
  std::shared_ptr<ConfigChannel> channel(int node) {
    return std::make_shared<ConfigChannel>(std::make_shared<PeerClient>(address, daemons[static_cast<size_t>(node)]),
                                           "0.job", "g0/", node, 2);
  }
  PeerServer server{PeerServerOptions{"127.0.0.1:0", Logger(LogLevel::kError), {}, cluster(), {}}};
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  std::vector<std::shared_ptr<PeerAuth>> daemons;
};

// A store that answers every get at once with `value`, counting the gets: a hostile rendezvous
// (or a broken one) for the settings watcher. Nothing else is asked of it.
class AnsweringStore final : public RendezvousStore {
 public:
  explicit AnsweringStore(std::string value) : value_(std::move(value)) {}
  std::string describe() const override { return "a store answering '" + value_ + "'"; }
  Status set(const std::string&, const std::string&, const std::string&, std::chrono::milliseconds) override {
    return Status();
  }
  Status publish(const std::string&, const std::string&, const std::string&, std::chrono::milliseconds) override {
    return Status();
  }
  Status set_if_absent(const std::string&, const std::string&, const std::string&, std::chrono::milliseconds,
                       bool* stored) override {
    *stored = false;
    return Status();
  }
  Status get(const std::string&, const std::vector<std::string>& keys, std::chrono::milliseconds,
             std::vector<std::string>* values) override {
    gets.fetch_add(1);
    values->assign(keys.size(), value_);
    return Status();
  }
  Status peek(const std::string&, const std::vector<std::string>& keys, std::chrono::milliseconds,
              std::vector<std::optional<std::string>>* values) override {
    values->assign(keys.size(), value_);
    return Status();
  }
  Status add(const std::string&, const std::string&, int64_t, std::chrono::milliseconds, int64_t* value) override {
    *value = 1;
    return Status();
  }
  Status delete_job(const std::string&, std::chrono::milliseconds, const std::string&) override { return Status(); }
  void cancel(const Status&) override {}
  std::shared_ptr<RendezvousStore> fresh() const override { return std::make_shared<AnsweringStore>(value_); }
  std::atomic<int> gets{0};

 private:
  const std::string value_;
};

}  // namespace

TEST_CASE("settings schedule: a single-node change applies from the first operation not begun", "[settings]") {
  Node node;
  SettingsSchedule schedule(node.options(1s));
  std::vector<JobSettings> due;
  REQUIRE(schedule.begin(1, &due));
  REQUIRE(schedule.begin(2, &due));
  CHECK(due.empty());
  CHECK(schedule.schedule_here(cap(4096)) == 3);
  CHECK(schedule.schedule_here(cap(8192)) == 3);  // both from 3, in the order given
  // A multi-node proposal before the job formed is refused by name.
  uint64_t from = 0;
  const Status early = schedule.propose(cap(1), 1s, &from);
  CHECK(early.code() == ErrorCode::kNotSupported);
  CHECK_THAT(early.message(), Catch::Contains("has not formed across its nodes yet"));
  REQUIRE(schedule.begin(3, &due));
  REQUIRE(due.size() == 2);
  CHECK(due[0].bucket_cap == std::optional<uint64_t>(4096));
  CHECK(due[1].bucket_cap == std::optional<uint64_t>(8192));
  due.clear();
  REQUIRE(schedule.begin(4, &due));
  CHECK(due.empty());  // taken once
}

TEST_CASE("settings schedule: the nodes apply a change from one operation, the largest any had not begun",
          "[settings]") {
  Rendezvous rendezvous;
  Node node0, node1;
  SettingsSchedule schedule0(node0.options(5s));
  SettingsSchedule schedule1(node1.options(5s));
  std::vector<JobSettings> due;
  REQUIRE(schedule0.begin(5, &due));  // node 0 is at operation 5, node 1 ahead at 7
  REQUIRE(schedule1.begin(7, &due));
  schedule0.follow(rendezvous.channel(0));
  schedule1.follow(rendezvous.channel(1));

  uint64_t from = 0;
  REQUIRE(schedule1.propose(cap(4096), 5s, &from).ok());
  CHECK(from == 8);
  // Node 0 runs 6 and 7 with the old settings (node 1 had begun them), and 8 with the new.
  REQUIRE(begin_when_released(schedule0, 6, &due));
  CHECK(due.empty());
  REQUIRE(begin_when_released(schedule0, 8, &due));
  REQUIRE(due.size() == 1);
  CHECK(due[0].bucket_cap == std::optional<uint64_t>(4096));
  due.clear();
  REQUIRE(begin_when_released(schedule1, 8, &due));
  REQUIRE(due.size() == 1);
  CHECK(node0.wakes.load() >= 1);  // each worker was woken for it
  CHECK(node1.wakes.load() >= 1);
  CHECK(node0.failed().ok());
  CHECK(node1.failed().ok());
}

TEST_CASE("settings schedule: a node whose peers never offer holds its operations and fails the job",
          "[settings]") {
  Rendezvous rendezvous;
  Node node0;
  SettingsSchedule schedule0(node0.options(300ms));  // node 1 never follows
  std::vector<JobSettings> due;
  REQUIRE(schedule0.begin(3, &due));
  schedule0.follow(rendezvous.channel(0));

  uint64_t from = 0;
  const Status proposed = schedule0.propose(cap(4096), 200ms, &from);
  CHECK(proposed.code() == ErrorCode::kTimeout);
  CHECK_THAT(proposed.message(), Catch::Contains("the nodes did not all take change 1 within 200 ms"));
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (node0.failed().ok() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  const Status failure = node0.failed();
  CHECK(failure.code() == ErrorCode::kTimeout);
  CHECK_THAT(failure.message(), Catch::Contains("job settings-test: the nodes did not agree on when settings change 1 "
                                                "(bucket cap 4096 bytes) takes effect"));
  CHECK_THAT(failure.message(), Catch::Contains("node 1"));
  // Neither settings may be used any more: operation 4 stays held.
  CHECK_FALSE(schedule0.begin(4, &due));
  CHECK(due.empty());
  schedule0.stop(Status::aborted("test over"));
  schedule0.stop(Status::aborted("again"));  // idempotent
}

TEST_CASE("settings schedule: a rendezvous that answers every change as malformed is read at a pause, not in a spin",
          "[settings]") {
  for (const std::string& answer : {std::string("not settings"), std::string(ConfigChannel::kSkip)}) {
    INFO(answer);
    auto store = std::make_shared<AnsweringStore>(answer);
    Node node;
    {
      SettingsSchedule schedule(node.options(1s));
      schedule.follow(std::make_shared<ConfigChannel>(store, "0.job", "g0/", 0, 2));
      std::this_thread::sleep_for(1s);
      schedule.stop(Status::aborted("the test ends"));
    }
    // A pause of SettingsSchedule::kSkipPause (100 ms) after each: about 10 in the second.
    CHECK(store->gets.load() >= 2);
    CHECK(store->gets.load() <= 15);
    CHECK(node.failed().ok());  // skipped, not failed: every node skips a value alike
  }
}

}  // namespace gradsync
