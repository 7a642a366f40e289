// The NCCL engine through a fake of the NCCL calls (api.h): rank planning and the unique id over
// a rendezvous of several "nodes" (threads), non-blocking initialisation that finishes, fails,
// hangs until aborted or times out, grouped collectives, and the watchdog's answers and aborts.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "daemon/engine/nccl/engine.h"

namespace gradsync::nccl {
namespace {

using namespace std::chrono_literals;

// Records every call; communicators are small integers. Each communicator leaves
// "in progress" after `polls_until_ready` state() calls, unless it is told to hang or fail.
// It counts calls made before load() succeeded and calls on a communicator that overlapped
// another thread's call on the same communicator (an engine makes every call on its own under
// its mutex); tests check both stay zero. Calls on different engines' communicators may overlap.
class FakeNccl final : public NcclApi {
 public:
  Status load() override {
    loaded = load_error.ok();
    return load_error;
  }

  // Marks one call: inside NCCL on `comm` (null: on none), as the engine sees it. Communicators
  // split off one parent share its resources and count as one: no two calls on them may overlap.
  struct Inside {
    explicit Inside(FakeNccl* f, void* on = nullptr) : f(f) {
      {
        std::lock_guard lock(f->inside_mutex);
        auto family = f->family_of.find(on);
        comm = family == f->family_of.end() ? on : family->second;
        if (comm && f->inside[comm]++ != 0) f->overlaps.fetch_add(1);
      }
      if (!f->loaded.load()) f->unloaded_calls.fetch_add(1);
      std::this_thread::yield();  // widens the window for an overlap to show
    }
    ~Inside() {
      if (!comm) return;
      std::lock_guard lock(f->inside_mutex);
      f->inside[comm]--;
    }
    FakeNccl* f;
    void* comm;
  };

  Status unique_id(UniqueId* id) override {
    Inside in(this);
    std::lock_guard lock(mutex);
    ++ids_made;
    id->fill(static_cast<char>(0x40 + ids_made));
    return Status();
  }
  Status init_rank(int device, int ranks, const UniqueId& id, int rank, void** comm) override {
    Inside in(this);
    std::lock_guard lock(mutex);
    if (fail_init_rank == rank) return Status::internal("ncclCommInitRankConfig failed: unhandled cuda error");
    const int handle = ++next_comm;
    comms[handle] = Comm{device, ranks, rank, id, polls_until_ready, false};
    grouped[std::this_thread::get_id()].insert(handle);
    calls.push_back("init rank " + std::to_string(rank) + "/" + std::to_string(ranks) + " on " + std::to_string(device));
    *comm = reinterpret_cast<void*>(static_cast<intptr_t>(handle));
    return Status();
  }
  // As NCCL: refused while the parent is in progress; the child is written to *comm only when
  // the parent's group completed (a state() poll of the parent finds it ready), null until then.
  Status split(void* parent, int device, int color, int key, void** comm) override {
    Inside in(this, parent);
    std::lock_guard lock(mutex);
    grouped[std::this_thread::get_id()].insert(handle_of(parent));
    Comm& p = comms.at(handle_of(parent));
    calls.push_back("split rank " + std::to_string(p.rank) + " on " + std::to_string(device) + " color " +
                    std::to_string(color) + " key " + std::to_string(key));
    *comm = nullptr;
    if (p.aborted) return Status::internal("split of an aborted communicator");
    if (p.pending > 0) return Status::invalid_argument("ncclCommSplit: the parent is in progress");
    if (!fail_split.ok()) return fail_split;
    if (color != kNoColor) splits.push_back(Split{handle_of(parent), comm, Comm{device, -1, key, p.id, 0, false}});
    if (hang_after_split) hang = true;
    if (p.rank == break_after_split) p.broken = true;
    return Status();
  }
  CommState state(void* comm, Status* error) override {
    Inside in(this, comm);
    std::lock_guard lock(mutex);
    Comm& c = comms.at(handle_of(comm));
    if (c.aborted) {
      *error = Status::internal("used after abort");
      return CommState::kFailed;
    }
    if (!async_error.ok() || c.broken) {
      *error = c.broken ? Status::peer_lost("NCCL error: remote process exited") : async_error;
      return CommState::kFailed;
    }
    if (hang) return CommState::kInProgress;
    if (c.pending > 0) {
      --c.pending;
      return CommState::kInProgress;
    }
    // The parent's split completed: its children exist now.
    for (auto it = splits.begin(); it != splits.end();) {
      if (it->parent != handle_of(comm)) {
        ++it;
        continue;
      }
      const int handle = ++next_comm;
      comms[handle] = it->child;
      void* child = reinterpret_cast<void*>(static_cast<intptr_t>(handle));
      {
        std::lock_guard inside_lock(inside_mutex);
        auto family = family_of.find(comm);
        family_of[child] = family == family_of.end() ? comm : family->second;
      }
      *it->out = child;
      it = splits.erase(it);
    }
    return CommState::kReady;
  }
  void abort(void* comm) override {
    Inside in(this, comm);
    {
      // A test may hold aborts inside "NCCL" (ncclCommAbort can take seconds).
      std::unique_lock lock(abort_gate_mutex);
      ++aborts_entered;
      abort_gate.notify_all();
      abort_gate.wait(lock, [&] { return !hold_aborts; });
    }
    std::lock_guard lock(mutex);
    Comm& c = comms.at(handle_of(comm));
    CHECK_FALSE(c.aborted);  // once per communicator
    c.aborted = true;
    ++aborts;
  }
  Status group_start() override {
    Inside in(this);
    std::lock_guard lock(mutex);
    calls.push_back("group start");
    grouped.erase(std::this_thread::get_id());
    return Status();
  }
  Status group_end() override {
    Inside in(this);
    std::lock_guard lock(mutex);
    calls.push_back("group end");
    // A group leaves its communicators in progress for a few polls (those of this thread's group
    // only, as in NCCL: other nodes' groups are theirs).
    for (int h : grouped[std::this_thread::get_id()]) comms.at(h).pending = polls_until_ready;
    grouped.erase(std::this_thread::get_id());
    return fail_group_end;
  }
  Status all_reduce(const void* send, void* recv, size_t count, DType dtype, reduce::Combine op, void* comm,
                    void*) override {
    Inside in(this, comm);
    std::lock_guard lock(mutex);
    grouped[std::this_thread::get_id()].insert(handle_of(comm));
    calls.push_back("allreduce " + std::to_string(count) + " " + std::string(dtype_name(dtype)) + " op " +
                    std::to_string(static_cast<int>(op)) + " rank " + std::to_string(comms.at(handle_of(comm)).rank) +
                    (send == recv ? " in place" : ""));
    return Status();
  }
  Status broadcast(const void*, void*, size_t count, DType, int root, void* comm, void*) override {
    Inside in(this, comm);
    std::lock_guard lock(mutex);
    grouped[std::this_thread::get_id()].insert(handle_of(comm));
    calls.push_back("broadcast " + std::to_string(count) + " from " + std::to_string(root) + " rank " +
                    std::to_string(comms.at(handle_of(comm)).rank));
    return Status();
  }
  Status reduce(const void*, void*, size_t count, DType, reduce::Combine, int root, void* comm, void*) override {
    Inside in(this, comm);
    std::lock_guard lock(mutex);
    grouped[std::this_thread::get_id()].insert(handle_of(comm));
    calls.push_back("reduce " + std::to_string(count) + " to " + std::to_string(root) + " rank " +
                    std::to_string(comms.at(handle_of(comm)).rank));
    return Status();
  }
  Status all_gather(const void*, void*, size_t count, DType, void* comm, void*) override {
    Inside in(this, comm);
    std::lock_guard lock(mutex);
    grouped[std::this_thread::get_id()].insert(handle_of(comm));
    calls.push_back("allgather " + std::to_string(count) + " rank " + std::to_string(comms.at(handle_of(comm)).rank));
    return Status();
  }
  Status reduce_scatter(const void*, void*, size_t count, DType, reduce::Combine, void* comm, void*) override {
    Inside in(this, comm);
    std::lock_guard lock(mutex);
    grouped[std::this_thread::get_id()].insert(handle_of(comm));
    calls.push_back("reduce-scatter " + std::to_string(count) + " rank " +
                    std::to_string(comms.at(handle_of(comm)).rank));
    return Status();
  }
  Status register_buffer(void* comm, void*, size_t, void** handle) override {
    Inside in(this, comm);
    std::lock_guard lock(mutex);
    ++registrations;
    *handle = register_without_handle ? nullptr : reinterpret_cast<void*>(0x99);
    return Status();
  }
  Status deregister_buffer(void* comm, void*) override {
    Inside in(this, comm);
    std::lock_guard lock(mutex);
    if (fail_deregister) return Status::internal("ncclCommDeregister refused (fake)");
    ++deregistrations;
    return Status();
  }

  static int handle_of(void* comm) { return static_cast<int>(reinterpret_cast<intptr_t>(comm)); }

  struct Comm {
    int device = 0, ranks = 0, rank = 0;
    UniqueId id{};
    int pending = 0;
    bool aborted = false;
    bool broken = false;  // an asynchronous error of this communicator only
  };
  struct Split {
    int parent;
    void** out;
    Comm child;
  };
  std::mutex mutex;       // the fake's own data
  std::mutex inside_mutex;
  std::map<void*, int> inside;        // calls inside, per family
  std::map<void*, void*> family_of;   // a split child -> the communicator it was split off
  std::vector<Split> splits;          // under mutex: made once the parent is ready
  std::map<std::thread::id, std::set<int>> grouped;  // under mutex: each thread's open group
  Status fail_split;
  bool hang_after_split = false;  // under mutex
  int break_after_split = -1;     // under mutex: this parent rank fails once its split is issued
  std::atomic<int> overlaps{0};
  std::atomic<int> unloaded_calls{0};
  std::atomic<bool> loaded{false};
  Status load_error;
  std::map<int, Comm> comms;
  std::vector<std::string> calls;
  int next_comm = 0;
  int ids_made = 0;
  int aborts = 0;
  int registrations = 0;
  int deregistrations = 0;
  int polls_until_ready = 2;
  bool register_without_handle = false;  // as NCCL answers where it does not register
  bool fail_deregister = false;
  int fail_init_rank = -1;
  std::atomic<bool> hang{false};
  std::mutex abort_gate_mutex;
  std::condition_variable abort_gate;
  bool hold_aborts = false;  // under abort_gate_mutex
  int aborts_entered = 0;     // under abort_gate_mutex
  // Waits until an abort is inside "NCCL".
  bool abort_entered(std::chrono::milliseconds within) {
    std::unique_lock lock(abort_gate_mutex);
    return abort_gate.wait_for(lock, within, [&] { return aborts_entered > 0; });
  }
  void release_aborts() {
    {
      std::lock_guard lock(abort_gate_mutex);
      hold_aborts = false;
    }
    abort_gate.notify_all();
  }
  Status async_error;
  Status fail_group_end;
};

// The rendezvous of `nodes` nodes, each a thread: exchange() blocks until every node offered.
class Table {
 public:
  explicit Table(int nodes) : nodes_(nodes) {}
  Status exchange(int node, const std::string& name, const std::string& mine, std::vector<std::string>* all) {
    std::unique_lock lock(mutex_);
    values_[name][node] = mine;
    changed_.notify_all();
    if (!changed_.wait_for(lock, 5s, [&] { return static_cast<int>(values_[name].size()) == nodes_; })) {
      return Status::timeout("'" + name + "' was not offered by every node");
    }
    all->clear();
    for (auto& [n, v] : values_[name]) all->push_back(v);
    return Status();
  }
  int nodes() const { return nodes_; }

 private:
  int nodes_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::map<int, std::string>> values_;
};

class TableRendezvous final : public Rendezvous {
 public:
  TableRendezvous(Table* table, int node) : table_(table), node_(node) {}
  int node() const override { return node_; }
  int nodes() const override { return table_->nodes(); }
  Status exchange(const std::string& name, const std::string& mine, std::vector<std::string>* all) override {
    return table_->exchange(node_, name, mine, all);
  }

 private:
  Table* table_;
  int node_;
};

DeviceEngineSpec spec_of(std::vector<int> devices, std::vector<int> slots) {
  DeviceEngineSpec spec;
  spec.what = "job j set 1 group 'dp'";
  spec.name = "nccl/s1/dp";
  spec.devices = std::move(devices);
  spec.slot_of_local_rank = std::move(slots);
  spec.timeout = 2000ms;
  return spec;
}

EngineTiming fast() {
  EngineTiming t;
  t.init_poll = 1ms;
  t.watchdog_poll = 5ms;
  t.completion_poll = 100us;
  return t;
}

std::vector<DeviceBuffer> buffers_for(const NcclEngine& engine) {
  std::vector<DeviceBuffer> buffers;
  for (int d : engine.devices()) buffers.push_back(DeviceBuffer{d, reinterpret_cast<void*>(0x1000 + d), nullptr});
  return buffers;
}

}  // namespace

TEST_CASE("nccl engine: one node with two GPUs creates both ranks inside one group", "[nccl][engine]") {
  FakeNccl nccl;
  {
    NcclEngine engine(&nccl, spec_of({0, 1}, {0, 0, 1}), fast());
    LocalRendezvous local;
    REQUIRE(engine.connect(&local).ok());
    CHECK(engine.ranks() == 2);
    CHECK(engine.rank_of(0, 2) == 1);
    CHECK(nccl.ids_made == 1);
    CHECK(nccl.calls == std::vector<std::string>{"group start", "init rank 0/2 on 0", "init rank 1/2 on 1", "group end"});
    nccl.calls.clear();
    const auto buffers = buffers_for(engine);
    REQUIRE(engine.allreduce(buffers, 100, ReduceSpec{reduce::Combine::kMax, DType::kFloat16, true}).ok());
    // Half types travel in their accumulation type; the op is NCCL's, in place, one group.
    CHECK(nccl.calls == std::vector<std::string>{"group start", "allreduce 100 float32 op 2 rank 0 in place",
                                                 "allreduce 100 float32 op 2 rank 1 in place", "group end"});
    nccl.calls.clear();
    REQUIRE(engine.broadcast(buffers, 64, 1).ok());
    REQUIRE(engine.reduce(buffers, 8, ReduceSpec{}, 0).ok());
    REQUIRE(engine.allgather(buffers, buffers, 16).ok());
    REQUIRE(engine.reduce_scatter(buffers, buffers, 4, ReduceSpec{}).ok());
    CHECK(nccl.calls == std::vector<std::string>{
                            "group start", "broadcast 64 from 1 rank 0", "broadcast 64 from 1 rank 1", "group end",
                            "group start", "reduce 8 to 0 rank 0", "reduce 8 to 0 rank 1", "group end",
                            "group start", "allgather 16 rank 0", "allgather 16 rank 1", "group end",
                            "group start", "reduce-scatter 4 rank 0", "reduce-scatter 4 rank 1", "group end"});
    CHECK(engine.broadcast(buffers, 64, 2).code() == ErrorCode::kInternal);  // no rank 2
    bool registered = false;
    REQUIRE(engine.register_buffer(1, reinterpret_cast<void*>(0x5000), 1 << 20, &registered).ok());
    CHECK(registered);
    REQUIRE(engine.register_buffer(1, reinterpret_cast<void*>(0x5000), 1 << 20, &registered).ok());
    CHECK(nccl.registrations == 1);  // once per buffer
    // NCCL's success without a handle is no registration (not zero-copy), asked once too.
    nccl.register_without_handle = true;
    REQUIRE(engine.register_buffer(0, reinterpret_cast<void*>(0x9000), 1 << 20, &registered).ok());
    CHECK_FALSE(registered);
    REQUIRE(engine.register_buffer(0, reinterpret_cast<void*>(0x9000), 1 << 20, &registered).ok());
    CHECK_FALSE(registered);
    CHECK(nccl.registrations == 2);
    // Undone through NCCL only where it registered; forgotten either way, so that memory later
    // mapped at the same address is offered again.
    REQUIRE(engine.deregister_buffer(1, reinterpret_cast<void*>(0x5000)).ok());
    CHECK(nccl.deregistrations == 1);
    REQUIRE(engine.deregister_buffer(0, reinterpret_cast<void*>(0x9000)).ok());
    CHECK(nccl.deregistrations == 1);
    REQUIRE(engine.deregister_buffer(0, reinterpret_cast<void*>(0x7000)).ok());  // never registered
    CHECK(nccl.deregistrations == 1);
    nccl.register_without_handle = false;
    REQUIRE(engine.register_buffer(1, reinterpret_cast<void*>(0x5000), 1 << 20, &registered).ok());
    CHECK(registered);
    CHECK(nccl.registrations == 3);
    // NCCL's refusal keeps it registered (the caller then keeps the memory mapped), named.
    nccl.fail_deregister = true;
    const Status refused = engine.deregister_buffer(1, reinterpret_cast<void*>(0x5000));
    CHECK(refused.code() == ErrorCode::kInternal);
    CHECK_THAT(refused.message(), Catch::Contains("GPU 1") && Catch::Contains("refused"));
    nccl.fail_deregister = false;
    REQUIRE(engine.deregister_buffer(1, reinterpret_cast<void*>(0x5000)).ok());
    CHECK(nccl.deregistrations == 2);
  }
  CHECK(nccl.aborts == 2);  // every communicator ended, and only once
}

TEST_CASE("nccl engine: three nodes agree on ranks and on one unique id", "[nccl][engine]") {
  // Node 0 brings GPU 3, node 1 none, node 2 GPUs 0 and 1 (its local rank 1 on GPU 1, rank 0 on 0).
  FakeNccl nccl;
  Table table(3);
  std::vector<std::unique_ptr<NcclEngine>> engines;
  engines.push_back(std::make_unique<NcclEngine>(&nccl, spec_of({3}, {0, -1}), fast()));
  engines.push_back(std::make_unique<NcclEngine>(&nccl, spec_of({}, {-1, -1}), fast()));
  engines.push_back(std::make_unique<NcclEngine>(&nccl, spec_of({0, 1}, {0, 1}), fast()));
  std::vector<std::future<Status>> connected;
  std::vector<std::unique_ptr<TableRendezvous>> rendezvous;
  for (int n = 0; n < 3; ++n) {
    rendezvous.push_back(std::make_unique<TableRendezvous>(&table, n));
    connected.push_back(std::async(std::launch::async, [&, n] { return engines[n]->connect(rendezvous[n].get()); }));
  }
  for (auto& c : connected) REQUIRE(c.get().ok());
  CHECK(nccl.ids_made == 1);  // on the owner of rank 0 only
  std::set<int> ranks;
  for (const auto& [h, comm] : nccl.comms) {
    CHECK(comm.ranks == 3);
    CHECK(comm.id == nccl.comms.begin()->second.id);  // everybody got node 0's id
    ranks.insert(comm.rank);
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  for (const auto& engine : engines) {
    CHECK(engine->rank_of(0, 0) == 0);
    CHECK(engine->rank_of(0, 1) == -1);
    CHECK(engine->rank_of(1, 0) == -1);
    CHECK(engine->rank_of(2, 0) == 1);
    CHECK(engine->rank_of(2, 1) == 2);
  }
  // Three threads, one api: no NCCL call overlapped another (a review found the watchdog's
  // ncclCommGetAsyncError racing the worker's), and none came before load().
  CHECK(nccl.overlaps == 0);
  CHECK(nccl.unloaded_calls == 0);
}

TEST_CASE("nccl engine: every node loads NCCL before its first call, not only the one that makes the id",
          "[nccl][engine]") {
  // Separate NCCLs per node, as in separate daemons: node 1 makes no id, and a review found it
  // calling into a library it never loaded.
  FakeNccl nccl0, nccl1;
  Table table(2);
  NcclEngine engine0(&nccl0, spec_of({0}, {0}), fast());
  NcclEngine engine1(&nccl1, spec_of({0}, {0}), fast());
  TableRendezvous r0(&table, 0), r1(&table, 1);
  auto c0 = std::async(std::launch::async, [&] { return engine0.connect(&r0); });
  auto c1 = std::async(std::launch::async, [&] { return engine1.connect(&r1); });
  REQUIRE(c0.get().ok());
  REQUIRE(c1.get().ok());
  CHECK(nccl1.ids_made == 0);
  CHECK(nccl0.unloaded_calls == 0);
  CHECK(nccl1.unloaded_calls == 0);
  // A node whose NCCL cannot be loaded fails at once, naming the cause, and calls nothing.
  FakeNccl missing;
  missing.load_error = Status::not_supported("cannot load NCCL (libnccl.so.2): cannot open shared object file");
  NcclEngine engine(&missing, spec_of({0, 1}, {0, 1}), fast());
  LocalRendezvous local;
  const Status status = engine.connect(&local);
  CHECK(status.code() == ErrorCode::kNotSupported);
  CHECK(status.message() == "job j set 1 group 'dp': cannot load NCCL (libnccl.so.2): cannot open shared object file");
  CHECK(missing.unloaded_calls == 0);
  CHECK(missing.comms.empty());
}

TEST_CASE("nccl engine: a node that sends a malformed plan is named", "[nccl][engine]") {
  class Liar final : public Rendezvous {
   public:
    int node() const override { return 0; }
    int nodes() const override { return 2; }
    Status exchange(const std::string&, const std::string& mine, std::vector<std::string>* all) override {
      *all = {mine, "2 0 7"};  // slot 7 of 2 GPUs
      return Status();
    }
  } liar;
  FakeNccl nccl;
  NcclEngine engine(&nccl, spec_of({0}, {0, -1}), fast());
  const Status status = engine.connect(&liar);
  CHECK(status.code() == ErrorCode::kProtocol);
  CHECK_THAT(status.message(), Catch::Contains("node 1 offered an undecodable GPU plan for 'nccl/s1/dp'"));
  CHECK(nccl.comms.empty());
}

TEST_CASE("nccl engine: a node whose plan counts more GPUs than it has local ranks is named", "[nccl][engine]") {
  // Each slot is in range of the count, but no node brings more GPUs than local ranks; two such
  // counts near INT_MAX would overflow the rank count NCCL is given.
  for (const std::string plan : {"3 0 1", "2147483647 0 -1"}) {
    class Liar final : public Rendezvous {
     public:
      explicit Liar(std::string plan) : plan_(std::move(plan)) {}
      int node() const override { return 0; }
      int nodes() const override { return 3; }
      Status exchange(const std::string&, const std::string& mine, std::vector<std::string>* all) override {
        *all = {mine, plan_, plan_};
        return Status();
      }

     private:
      std::string plan_;
    } liar(plan);
    FakeNccl nccl;
    NcclEngine engine(&nccl, spec_of({0}, {0, -1}), fast());
    const Status status = engine.connect(&liar);
    CHECK(status.code() == ErrorCode::kProtocol);
    CHECK_THAT(status.message(), Catch::Contains("node 1 offered an undecodable GPU plan for 'nccl/s1/dp': '" + plan + "'"));
    CHECK(nccl.comms.empty());
  }
}

TEST_CASE("nccl engine: initialisation that fails, hangs or is aborted ends every communicator", "[nccl][engine]") {
  LocalRendezvous local;
  SECTION("a rank fails to initialise") {
    FakeNccl nccl;
    nccl.fail_init_rank = 1;
    NcclEngine engine(&nccl, spec_of({0, 1}, {0, 1}), fast());
    const Status status = engine.connect(&local);
    CHECK_THAT(status.message(), Catch::StartsWith("job j set 1 group 'dp': ncclCommInitRankConfig failed"));
    CHECK(nccl.aborts == 1);  // the one that was created
  }
  SECTION("an asynchronous error during initialisation names the GPU and rank") {
    FakeNccl nccl;
    nccl.async_error = Status::peer_lost("remote process exited or there was a network error");
    NcclEngine engine(&nccl, spec_of({0, 1}, {0, 1}), fast());
    const Status status = engine.connect(&local);
    CHECK(status.code() == ErrorCode::kPeerLost);
    CHECK_THAT(status.message(), Catch::Contains("creating the NCCL communicators on GPU 0 (rank 0 of 2)"));
    CHECK(nccl.aborts == 2);
  }
  SECTION("a peer that never joins: the job timeout") {
    FakeNccl nccl;
    nccl.hang = true;
    NcclEngine engine(&nccl, spec_of({0, 1}, {0, 1}), fast());
    const auto started = std::chrono::steady_clock::now();
    const Status status = engine.connect(&local);
    CHECK(status.code() == ErrorCode::kTimeout);
    CHECK_THAT(status.message(), Catch::Contains("creating the NCCL communicators did not finish within 2000 ms"));
    CHECK(std::chrono::steady_clock::now() - started >= 2000ms);
    CHECK(nccl.aborts == 2);
  }
  SECTION("abort() from another thread ends a hung initialisation promptly, with its reason") {
    FakeNccl nccl;
    nccl.hang = true;
    auto spec = spec_of({0, 1}, {0, 1});
    spec.timeout = 60'000ms;
    NcclEngine engine(&nccl, spec, fast());
    auto connected = std::async(std::launch::async, [&] { return engine.connect(&local); });
    std::this_thread::sleep_for(50ms);
    const auto asked = std::chrono::steady_clock::now();
    engine.abort(Status::aborted("job j failed: rank 3 left"));
    REQUIRE(connected.wait_for(1s) == std::future_status::ready);
    CHECK(std::chrono::steady_clock::now() - asked < 1s);
    CHECK(connected.get().message() == "job j failed: rank 3 left");
    CHECK(nccl.aborts == 2);
    CHECK(engine.allreduce(buffers_for(engine), 1, ReduceSpec{}).message() == "job j failed: rank 3 left");
  }
}

TEST_CASE("nccl engine: the watchdog answers finished work and fails hung or broken work", "[nccl][engine]") {
  LocalRendezvous local;
  FakeNccl nccl;
  NcclEngine engine(&nccl, spec_of({0, 1}, {0, 1}), fast());
  REQUIRE(engine.connect(&local).ok());
  const auto watch = [&](std::atomic<bool>* finished, std::chrono::milliseconds timeout) {
    auto answered = std::make_shared<std::promise<Status>>();
    engine.watch(
        "allreduce bucket 0",
        [finished](bool* done) {
          *done = finished->load();
          return Status();
        },
        timeout, [answered](const Status& s) { answered->set_value(s); });
    return answered->get_future();
  };
  std::atomic<bool> finished{false};
  auto first = watch(&finished, 5000ms);
  CHECK(first.wait_for(30ms) == std::future_status::timeout);  // not before the GPUs are through
  const auto through = std::chrono::steady_clock::now();
  finished = true;
  REQUIRE(first.wait_for(1s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - through < 50ms);  // the completion poll, not the error poll
  CHECK(first.get().ok());

  SECTION("a collective that never finishes times out, and the communicators are aborted") {
    std::atomic<bool> never{false};
    auto hung = watch(&never, 100ms);
    REQUIRE(hung.wait_for(2s) == std::future_status::ready);
    const Status status = hung.get();
    CHECK(status.code() == ErrorCode::kTimeout);
    CHECK_THAT(status.message(), Catch::Contains("job j set 1 group 'dp': allreduce bucket 0 did not finish within 100 ms"));
    CHECK(nccl.aborts == 2);
    // Sticky: later calls fail with it, and make no NCCL call.
    const size_t calls = nccl.calls.size();
    CHECK(engine.allreduce(buffers_for(engine), 1, ReduceSpec{}).code() == ErrorCode::kTimeout);
    CHECK(nccl.calls.size() == calls);
  }
  SECTION("an asynchronous NCCL error fails the collective in flight, naming the GPU") {
    std::atomic<bool> never{false};
    auto broken = watch(&never, 60'000ms);
    {
      std::lock_guard lock(nccl.mutex);
      nccl.async_error = Status::peer_lost("NCCL error: remote process exited");
    }
    REQUIRE(broken.wait_for(2s) == std::future_status::ready);
    const Status status = broken.get();
    CHECK(status.code() == ErrorCode::kPeerLost);
    CHECK_THAT(status.message(), Catch::Contains("on GPU 0 (rank 0 of 2)"));
    CHECK(nccl.aborts == 2);
  }
  SECTION("the watchdog's polls never overlap the worker's group calls") {
    for (int i = 0; i < 200; ++i) REQUIRE(engine.allreduce(buffers_for(engine), 1, ReduceSpec{}).ok());
    CHECK(nccl.overlaps == 0);
  }
  SECTION("abort() fails the collective in flight within a poll") {
    std::atomic<bool> never{false};
    auto pending = watch(&never, 60'000ms);
    const auto asked = std::chrono::steady_clock::now();
    engine.abort(Status::aborted("job j failed"));
    REQUIRE(pending.wait_for(1s) == std::future_status::ready);
    CHECK(std::chrono::steady_clock::now() - asked < 1s);
    CHECK(pending.get().message() == "job j failed");
    CHECK(nccl.aborts == 2);
  }
}

TEST_CASE("nccl engine: a failed group call fails the engine and aborts every communicator", "[nccl][engine]") {
  LocalRendezvous local;
  FakeNccl nccl;
  NcclEngine engine(&nccl, spec_of({0, 1}, {0, 1}), fast());
  REQUIRE(engine.connect(&local).ok());
  nccl.fail_group_end = Status::internal("ncclGroupEnd failed: unhandled cuda error");
  const Status status = engine.allreduce(buffers_for(engine), 10, ReduceSpec{});
  CHECK_THAT(status.message(), Catch::StartsWith("job j set 1 group 'dp': NCCL allreduce of 10 elements: ncclGroupEnd"));
  // The watchdog aborts them on its thread, within a poll.
  for (int i = 0; i < 200 && nccl.aborts < 2; ++i) std::this_thread::sleep_for(5ms);
  CHECK(nccl.aborts == 2);
  nccl.fail_group_end = Status();
  CHECK(engine.allreduce(buffers_for(engine), 10, ReduceSpec{}).message() == status.message());
  CHECK(engine.allreduce(buffers_for(engine), 10, ReduceSpec{}).message() == status.message());
}

TEST_CASE("nccl engine: issuing a collective waits past the job timeout for NCCL's lazy connection, up to the "
          "execution bound plus it", "[nccl][engine]") {
  // NCCL connects a communicator's peers at its first collective, which stays in progress until
  // every peer issued it: a peer late in backward by more than the job timeout once failed the
  // job here, though the bucket's own bound (the watchdog's) allows it.
  LocalRendezvous local;
  FakeNccl nccl;
  DeviceEngineSpec spec = spec_of({0, 1}, {0, 1});
  spec.timeout = 50ms;
  spec.enqueue_timeout = 10000ms;
  EngineTiming timing = fast();
  timing.enqueue_poll = 1ms;
  NcclEngine engine(&nccl, spec, timing);
  REQUIRE(engine.connect(&local).ok());
  nccl.polls_until_ready = 1000;  // after the spins, 1 ms a poll: most of a second, many job timeouts
  const auto began = std::chrono::steady_clock::now();
  CHECK(engine.allreduce(buffers_for(engine), 10, ReduceSpec{}).ok());
  CHECK(std::chrono::steady_clock::now() - began > 200ms);
  // And it is still bounded: past the enqueue bound it fails naming the call.
  DeviceEngineSpec tight = spec;
  tight.enqueue_timeout = 20ms;
  FakeNccl stuck;
  NcclEngine bounded(&stuck, tight, timing);
  REQUIRE(bounded.connect(&local).ok());
  stuck.polls_until_ready = 1'000'000;
  const Status status = bounded.allreduce(buffers_for(bounded), 10, ReduceSpec{});
  CHECK(status.code() == ErrorCode::kTimeout);
  CHECK_THAT(status.message(), Catch::Contains("allreduce of 10 elements"));
}

TEST_CASE("nccl engine: a single GPU in all needs no communicator", "[nccl][engine]") {
  LocalRendezvous local;
  FakeNccl nccl;
  NcclEngine engine(&nccl, spec_of({2}, {0, 0}), fast());
  REQUIRE(engine.connect(&local).ok());
  CHECK(engine.ranks() == 1);
  CHECK(nccl.ids_made == 0);
  CHECK(nccl.comms.empty());
}

}  // namespace gradsync::nccl

namespace gradsync::nccl {
namespace {

DeviceEngineSpec reusable(std::vector<int> devices, std::vector<int> slots) {
  DeviceEngineSpec spec = spec_of(std::move(devices), std::move(slots));
  spec.reuse_key = "job j/nccl/s1/dp";
  return spec;
}

// One step of a job on `engine`: an allreduce whose GPUs are through at once.
Status step(NcclEngine& engine) {
  if (Status s = engine.allreduce(buffers_for(engine), 4, ReduceSpec{}); !s.ok()) return s;
  std::promise<Status> answered;
  engine.watch(
      "allreduce bucket 0",
      [](bool* done) {
        *done = true;
        return Status();
      },
      5000ms, [&](const Status& s) { answered.set_value(s); });
  auto future = answered.get_future();
  if (future.wait_for(2s) != std::future_status::ready) return Status::timeout("not answered");
  return future.get();
}

int inits(FakeNccl& nccl) {
  std::lock_guard lock(nccl.mutex);
  return static_cast<int>(std::count_if(nccl.calls.begin(), nccl.calls.end(),
                                        [](const std::string& c) { return c.rfind("init rank", 0) == 0; }));
}

// Every node connects its engine at once (threads); the statuses in node order.
std::vector<Status> connect_all(std::vector<std::unique_ptr<NcclEngine>>& engines, Table* table) {
  std::vector<std::future<Status>> connected;
  for (size_t n = 0; n < engines.size(); ++n) {
    connected.push_back(std::async(std::launch::async, [&, n] {
      TableRendezvous rendezvous(table, static_cast<int>(n));
      return engines[n]->connect(&rendezvous);
    }));
  }
  std::vector<Status> statuses;
  for (auto& c : connected) statuses.push_back(c.get());
  return statuses;
}

}  // namespace

TEST_CASE("nccl engine: a job's idle communicators are kept when it fails, and its next run re-joins them",
          "[nccl][engine][rejoin]") {
  LocalRendezvous local;
  FakeNccl nccl;
  CommPark park(&nccl, 60'000ms);
  {
    NcclEngine engine(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
    REQUIRE(engine.connect(&local).ok());
    CHECK_FALSE(engine.reused());
    bool registered = false;
    REQUIRE(engine.register_buffer(0, reinterpret_cast<void*>(0x5000), 4096, &registered).ok());
    REQUIRE(step(engine).ok());
    // A trainer died between steps: the job fails, with nothing in flight.
    engine.abort(Status::peer_lost("job j: local rank 1 disconnected"));
    CHECK(engine.allreduce(buffers_for(engine), 4, ReduceSpec{}).code() == ErrorCode::kPeerLost);
  }
  CHECK(nccl.aborts == 0);
  CHECK(nccl.deregistrations == 1);  // the job's memory is unmapped next: its registration ended first
  CHECK(park.size() == 1);
  const int made = inits(nccl);
  const int ids = nccl.ids_made;

  SECTION("the same layout reuses them: no unique id, no init, and they work") {
    NcclEngine again(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
    REQUIRE(again.connect(&local).ok());
    CHECK(again.reused());
    CHECK(inits(nccl) == made);
    CHECK(nccl.ids_made == ids);
    CHECK(park.size() == 0);
    CHECK(step(again).ok());
    CHECK(nccl.aborts == 0);
  }
  SECTION("another layout creates its own, and the kept ones stay for their own job") {
    NcclEngine other(&nccl, reusable({0, 1}, {1, 0}), fast(), &park);
    REQUIRE(other.connect(&local).ok());
    CHECK_FALSE(other.reused());
    CHECK(inits(nccl) == made + 2);
    CHECK(park.size() == 1);
  }
  SECTION("kept communicators that failed meanwhile are aborted, and fresh ones made") {
    {
      std::lock_guard lock(nccl.mutex);
      for (auto& [h, c] : nccl.comms) c.broken = true;
    }
    NcclEngine again(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
    REQUIRE(again.connect(&local).ok());
    CHECK_FALSE(again.reused());
    CHECK(nccl.aborts == 2);
    CHECK(inits(nccl) == made + 2);
  }
  SECTION("they are kept for a while only") {
    CommPark brief(&nccl, 50ms);
    {
      NcclEngine engine(&nccl, reusable({2, 3}, {0, 1}), fast(), &brief);
      REQUIRE(engine.connect(&local).ok());
    }
    CHECK(brief.size() == 1);
    const int aborts = nccl.aborts;
    std::this_thread::sleep_for(80ms);
    NcclEngine late(&nccl, reusable({2, 3}, {0, 1}), fast(), &brief);
    REQUIRE(late.connect(&local).ok());
    CHECK_FALSE(late.reused());
    CHECK(nccl.aborts == aborts + 2);  // the expired ones
  }
}

TEST_CASE("nccl engine: communicators with work in flight at the job's failure are aborted, never kept",
          "[nccl][engine][rejoin]") {
  LocalRendezvous local;
  FakeNccl nccl;
  CommPark park(&nccl, 60'000ms);
  SECTION("a collective watched, not finished") {
    {
      NcclEngine engine(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
      REQUIRE(engine.connect(&local).ok());
      REQUIRE(engine.allreduce(buffers_for(engine), 4, ReduceSpec{}).ok());
      std::promise<Status> answered;
      engine.watch(
          "allreduce bucket 0",
          [](bool* done) {
            *done = false;
            return Status();
          },
          60'000ms, [&](const Status& s) { answered.set_value(s); });
      engine.abort(Status::peer_lost("job j: local rank 1 disconnected"));
      auto future = answered.get_future();
      REQUIRE(future.wait_for(1s) == std::future_status::ready);
      CHECK(future.get().code() == ErrorCode::kPeerLost);
      CHECK(nccl.aborts == 2);  // before the answer
    }
    CHECK(park.size() == 0);
  }
  SECTION("a collective issued while the job failed, before it was watched") {
    {
      NcclEngine engine(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
      REQUIRE(engine.connect(&local).ok());
      REQUIRE(engine.allreduce(buffers_for(engine), 4, ReduceSpec{}).ok());
      engine.abort(Status::peer_lost("job j: local rank 1 disconnected"));
      // The owner watches what it issued; the answer comes after the abort.
      std::promise<Status> answered;
      engine.watch(
          "allreduce bucket 0",
          [](bool* done) {
            *done = false;
            return Status();
          },
          60'000ms, [&](const Status& s) {
            CHECK(nccl.aborts == 2);
            answered.set_value(s);
          });
      auto future = answered.get_future();
      REQUIRE(future.wait_for(1s) == std::future_status::ready);
      CHECK(future.get().code() == ErrorCode::kPeerLost);
    }
    CHECK(nccl.aborts == 2);
    CHECK(park.size() == 0);
  }
  SECTION("a collective whose group call failed") {
    {
      NcclEngine engine(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
      REQUIRE(engine.connect(&local).ok());
      nccl.fail_group_end = Status::internal("ncclGroupEnd failed");
      CHECK_FALSE(engine.allreduce(buffers_for(engine), 4, ReduceSpec{}).ok());
      nccl.fail_group_end = Status();
    }
    CHECK(nccl.aborts == 2);
    CHECK(park.size() == 0);
  }
  const int made = inits(nccl);
  NcclEngine again(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
  REQUIRE(again.connect(&local).ok());
  CHECK_FALSE(again.reused());
  CHECK(inits(nccl) == made + 2);
}

TEST_CASE("nccl engine: nodes re-join kept communicators only when every node kept the same ones",
          "[nccl][engine][rejoin]") {
  // Two daemons, each with its NCCL and its park; node 1 brings GPU 0, node 0 GPUs 0 and 1.
  FakeNccl nccl0, nccl1;
  CommPark park0(&nccl0, 60'000ms), park1(&nccl1, 60'000ms);
  const auto engines = [&] {
    std::vector<std::unique_ptr<NcclEngine>> e;
    e.push_back(std::make_unique<NcclEngine>(&nccl0, reusable({0, 1}, {0, 1}), fast(), &park0));
    e.push_back(std::make_unique<NcclEngine>(&nccl1, reusable({0}, {0, -1}), fast(), &park1));
    return e;
  };
  {
    Table first(2);
    auto gen1 = engines();
    for (const Status& s : connect_all(gen1, &first)) REQUIRE(s.ok());
    CHECK(gen1[0]->ranks() == 3);
    REQUIRE(step(*gen1[0]).ok());
    REQUIRE(step(*gen1[1]).ok());
    SECTION("both kept theirs at the same point: both re-join") {
      gen1.clear();
      Table second(2);
      auto gen2 = engines();
      for (const Status& s : connect_all(gen2, &second)) REQUIRE(s.ok());
      CHECK(gen2[0]->reused());
      CHECK(gen2[1]->reused());
      CHECK(inits(nccl0) == 2);
      CHECK(inits(nccl1) == 1);
      CHECK(nccl0.ids_made == 1);
    }
    SECTION("one node aborted its own: both create fresh ones, and the other's kept ones go") {
      std::promise<Status> answered;
      REQUIRE(gen1[1]->allreduce(buffers_for(*gen1[1]), 4, ReduceSpec{}).ok());
      gen1[1]->watch(
          "allreduce bucket 1", [](bool* done) { return *done = false, Status(); }, 60'000ms,
          [&](const Status& s) { answered.set_value(s); });
      gen1[1]->abort(Status::peer_lost("node 0 failed"));
      gen1.clear();
      CHECK(park0.size() == 1);
      CHECK(park1.size() == 0);
      Table second(2);
      auto gen2 = engines();
      for (const Status& s : connect_all(gen2, &second)) REQUIRE(s.ok());
      CHECK_FALSE(gen2[0]->reused());
      CHECK_FALSE(gen2[1]->reused());
      CHECK(nccl0.aborts == 2);  // the kept ones, discarded
      CHECK(inits(nccl0) == 4);
      CHECK(inits(nccl1) == 2);
    }
    SECTION("one node issued a collective more (it finished there alone): both create fresh ones") {
      REQUIRE(step(*gen1[0]).ok());
      gen1.clear();
      Table second(2);
      auto gen2 = engines();
      for (const Status& s : connect_all(gen2, &second)) REQUIRE(s.ok());
      CHECK_FALSE(gen2[0]->reused());
      CHECK_FALSE(gen2[1]->reused());
      CHECK(nccl0.aborts == 2);
      CHECK(nccl1.aborts == 1);
    }
  }
}

}  // namespace gradsync::nccl

namespace gradsync::nccl {

TEST_CASE("nccl engine: kept communicators across nodes: fail-fast, nodes without GPUs, counts, aborts",
          "[nccl][engine][rejoin]") {
  FakeNccl nccl0, nccl1;
  CommPark park0(&nccl0, 60'000ms), park1(&nccl1, 60'000ms);
  const auto engines = [&] {
    std::vector<std::unique_ptr<NcclEngine>> e;
    e.push_back(std::make_unique<NcclEngine>(&nccl0, reusable({0, 1}, {0, 1}), fast(), &park0));
    e.push_back(std::make_unique<NcclEngine>(&nccl1, reusable({0}, {0, -1}), fast(), &park1));
    return e;
  };
  Table first(2);
  auto gen1 = engines();
  for (const Status& s : connect_all(gen1, &first)) REQUIRE(s.ok());
  REQUIRE(step(*gen1[0]).ok());
  REQUIRE(step(*gen1[1]).ok());

  SECTION("a job failure aborts communicators that span nodes even when idle: peers must not wait") {
    gen1[0]->abort(Status::peer_lost("job j: local rank 1 disconnected"));
    for (int i = 0; i < 200 && nccl0.aborts < 2; ++i) std::this_thread::sleep_for(5ms);
    CHECK(nccl0.aborts == 2);  // by the watchdog, now, not when the engine goes
    gen1.clear();
    CHECK(park0.size() == 0);
    CHECK(park1.size() == 1);  // node 1 saw no failure (yet): its own go when the next run disagrees
  }
  SECTION("the count carries over a re-join: both re-join again only if both went on alike") {
    gen1.clear();
    Table second(2);
    auto gen2 = engines();
    for (const Status& s : connect_all(gen2, &second)) REQUIRE(s.ok());
    REQUIRE(gen2[0]->reused());
    REQUIRE(step(*gen2[0]).ok());
    const bool both = GENERATE(true, false);
    if (both) REQUIRE(step(*gen2[1]).ok());
    gen2.clear();
    Table third(2);
    auto gen3 = engines();
    for (const Status& s : connect_all(gen3, &third)) REQUIRE(s.ok());
    CHECK(gen3[0]->reused() == both);
    CHECK(gen3[1]->reused() == both);
  }
}

TEST_CASE("nccl engine: a node that brings no GPU takes part in the re-join decision", "[nccl][engine][rejoin]") {
  FakeNccl nccl0, nccl1, nccl2;
  CommPark park0(&nccl0, 60'000ms), park1(&nccl1, 60'000ms), park2(&nccl2, 60'000ms);
  const auto engines = [&] {
    std::vector<std::unique_ptr<NcclEngine>> e;
    e.push_back(std::make_unique<NcclEngine>(&nccl0, reusable({0}, {0}), fast(), &park0));
    e.push_back(std::make_unique<NcclEngine>(&nccl1, reusable({}, {-1}), fast(), &park1));
    e.push_back(std::make_unique<NcclEngine>(&nccl2, reusable({3}, {0}), fast(), &park2));
    return e;
  };
  {
    Table first(3);
    auto gen1 = engines();
    for (const Status& s : connect_all(gen1, &first)) REQUIRE(s.ok());
    CHECK(gen1[0]->ranks() == 2);
  }
  Table second(3);
  auto gen2 = engines();
  for (const Status& s : connect_all(gen2, &second)) REQUIRE(s.ok());
  CHECK(gen2[0]->reused());
  CHECK(gen2[2]->reused());
  CHECK(nccl0.ids_made + nccl2.ids_made == 1);  // the first generation's id only
  CHECK(nccl1.comms.empty());
}

TEST_CASE("nccl engine: an abort while agreeing on re-join makes no unique id and ends the kept communicators",
          "[nccl][engine][rejoin]") {
  FakeNccl nccl;
  CommPark park(&nccl, 60'000ms);
  {
    LocalRendezvous local;
    NcclEngine engine(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
    REQUIRE(engine.connect(&local).ok());
  }
  REQUIRE(park.size() == 1);
  NcclEngine again(&nccl, reusable({0, 1}, {0, 1}), fast(), &park);
  // The job fails while the nodes exchange their offers.
  class AbortingRendezvous final : public Rendezvous {
   public:
    explicit AbortingRendezvous(NcclEngine* engine) : engine_(engine) {}
    int node() const override { return 0; }
    int nodes() const override { return 1; }
    Status exchange(const std::string& name, const std::string& mine, std::vector<std::string>* all) override {
      if (name.size() > 6 && name.compare(name.size() - 6, 6, "/reuse") == 0) {
        engine_->abort(Status::peer_lost("job j: local rank 0 disconnected"));
      }
      *all = {mine};
      return Status();
    }

   private:
    NcclEngine* engine_;
  } rendezvous(&again);
  const int ids = nccl.ids_made;
  const Status status = again.connect(&rendezvous);
  CHECK(status.code() == ErrorCode::kPeerLost);
  CHECK(nccl.ids_made == ids);
  CHECK(nccl.aborts == 2);  // the kept ones, which nobody will re-join now
  CHECK(park.size() == 0);
}

}  // namespace gradsync::nccl

namespace gradsync::nccl {

TEST_CASE("nccl engine: one job's communicator abort, still inside NCCL, does not hold up another job's collectives",
          "[nccl][engine][containment]") {
  FakeNccl nccl;
  LocalRendezvous local_a, local_b;
  NcclEngine job_a(&nccl, spec_of({0, 1}, {0, 1}), fast());
  DeviceEngineSpec spec_b = spec_of({0, 1}, {0, 1});
  spec_b.what = "job k set 1 group 'dp'";
  NcclEngine job_b(&nccl, spec_b, fast());
  REQUIRE(job_a.connect(&local_a).ok());
  REQUIRE(job_b.connect(&local_b).ok());
  {
    std::lock_guard lock(nccl.abort_gate_mutex);
    nccl.hold_aborts = true;  // ncclCommAbort takes its time (proxy threads, network teardown)
  }
  // Job A fails with a collective in flight: its watchdog aborts its communicators, and the
  // abort stays inside NCCL.
  REQUIRE(job_a.allreduce(buffers_for(job_a), 1, ReduceSpec{}).ok());
  auto answered = std::make_shared<std::promise<Status>>();
  auto a_answer = answered->get_future();
  job_a.watch(
      "allreduce bucket 0",
      [](bool* done) {
        *done = false;
        return Status();
      },
      60'000ms, [answered](const Status& s) { answered->set_value(s); });
  job_a.abort(Status::aborted("job j failed: rank 1 left"));
  REQUIRE(nccl.abort_entered(2s));  // A's watchdog is inside ncclCommAbort
  // Job B's collective on the same GPUs goes through meanwhile.
  auto b_call = std::async(std::launch::async, [&] { return job_b.allreduce(buffers_for(job_b), 1, ReduceSpec{}); });
  const bool b_through = b_call.wait_for(1s) == std::future_status::ready;
  CHECK(b_through);
  CHECK(a_answer.wait_for(0ms) == std::future_status::timeout);  // A's abort is still inside NCCL
  nccl.release_aborts();
  CHECK(b_call.get().ok());
  REQUIRE(a_answer.wait_for(2s) == std::future_status::ready);
  CHECK(a_answer.get().message() == "job j failed: rank 1 left");
  CHECK(nccl.overlaps == 0);  // no communicator was entered from two threads at once
}

}  // namespace gradsync::nccl

namespace gradsync::nccl {
namespace {

// A group of the job on some of the parent's GPUs, split off it.
DeviceEngineSpec child_of(NcclEngine* parent, std::vector<int> devices, std::vector<int> slots) {
  DeviceEngineSpec spec = spec_of(std::move(devices), std::move(slots));
  spec.what = "job j group 'tp'";
  spec.name = "nccl/s2/2:tp";
  spec.reuse_key = "job j/nccl/s2/2:tp";
  spec.parent = parent;
  return spec;
}

// The split calls made since the calls were last cleared, in any order (nodes are threads).
std::multiset<std::string> splits_in(FakeNccl& nccl) {
  std::lock_guard lock(nccl.mutex);
  std::multiset<std::string> out;
  for (const auto& c : nccl.calls) {
    if (c.rfind("split", 0) == 0) out.insert(c);
  }
  return out;
}

}  // namespace

TEST_CASE("nccl engine: a group on some of a parent's GPUs is split off it, sharing its resources",
          "[nccl][engine][split]") {
  FakeNccl nccl;
  CommPark park(&nccl, 60'000ms);
  LocalRendezvous local;
  {
    NcclEngine parent(&nccl, reusable({0, 1, 2}, {0, 1, 2}), fast(), &park);
    REQUIRE(parent.connect(&local).ok());
    CHECK(parent.splittable());
    nccl.calls.clear();
    // GPUs 0 and 2: local rank 0 on GPU 0, local rank 2 on GPU 2.
    NcclEngine child(&nccl, child_of(&parent, {0, 2}, {0, -1, 1}), fast(), &park);
    REQUIRE(child.connect(&local).ok());
    CHECK_FALSE(child.reused());
    CHECK(child.ranks() == 2);
    CHECK(nccl.ids_made == 1);  // no unique id, no bootstrap of its own
    CHECK(inits(nccl) == 0);
    // Every rank of the parent takes part, in one group; GPU 1 with no color; keys are the
    // child's planned ranks, so NCCL ranks them as the plan does.
    CHECK(nccl.calls == std::vector<std::string>{"group start", "split rank 0 on 0 color 0 key 0",
                                                 "split rank 1 on 1 color -1 key 0",
                                                 "split rank 2 on 2 color 0 key 1", "group end"});
    nccl.calls.clear();
    REQUIRE(step(child).ok());
    CHECK(nccl.calls == std::vector<std::string>{"group start", "allreduce 4 float32 op 0 rank 0 in place",
                                                 "allreduce 4 float32 op 0 rank 1 in place", "group end"});
    REQUIRE(step(parent).ok());
    CHECK(nccl.overlaps == 0);  // parent and child calls never overlapped (watchdogs included)
  }
  // A family shares one abort flag in NCCL: neither is kept for re-join; all five are ended.
  CHECK(park.size() == 0);
  CHECK(nccl.aborts == 5);
}

TEST_CASE("nccl engine: a split waits while the parent is in progress, and reads the child only once NCCL made it",
          "[nccl][engine][split]") {
  FakeNccl nccl;
  LocalRendezvous local;
  NcclEngine parent(&nccl, spec_of({0, 1}, {0, 1}), fast());
  REQUIRE(parent.connect(&local).ok());
  {
    // A group call of the parent's still being enqueued: NCCL would refuse the split.
    std::lock_guard lock(nccl.mutex);
    for (auto& [h, c] : nccl.comms) c.pending = 5;
  }
  NcclEngine child(&nccl, child_of(&parent, {0, 1}, {1, 0}), fast());
  REQUIRE(child.connect(&local).ok());
  CHECK(child.ranks() == 2);
  REQUIRE(step(child).ok());  // the children it holds are the ones NCCL made, not null
  CHECK(nccl.overlaps == 0);
}

TEST_CASE("nccl engine: a failed split fails the child, and aborts the parent and what was made",
          "[nccl][engine][split]") {
  FakeNccl nccl;
  LocalRendezvous local;
  NcclEngine parent(&nccl, spec_of({0, 1}, {0, 1}), fast());
  REQUIRE(parent.connect(&local).ok());
  SECTION("ncclCommSplit fails") {
    nccl.fail_split = Status::internal("ncclCommSplit failed: unhandled cuda error");
    NcclEngine child(&nccl, child_of(&parent, {0, 1}, {0, 1}), fast());
    const Status status = child.connect(&local);
    CHECK(status.code() == ErrorCode::kInternal);
    CHECK_THAT(status.message(), Catch::Contains("job j group 'tp'") && Catch::Contains("splitting") &&
                                     Catch::Contains("unhandled cuda error"));
  }
  SECTION("the parent fails while NCCL splits it") {
    nccl.hang_after_split = true;  // the split never completes...
    NcclEngine child(&nccl, child_of(&parent, {0, 1}, {0, 1}), fast());
    auto connected = std::async(std::launch::async, [&] { return child.connect(&local); });
    std::this_thread::sleep_for(20ms);
    {
      std::lock_guard lock(nccl.mutex);  // ...and the parent breaks
      for (auto& [h, c] : nccl.comms) c.broken = true;
    }
    nccl.hang = false;
    const Status status = connected.get();
    CHECK(status.code() == ErrorCode::kPeerLost);
    CHECK_THAT(status.message(), Catch::Contains("off job j set 1 group 'dp'") && Catch::Contains("remote process"));
  }
  SECTION("one rank of the parent fails after NCCL made the other's child") {
    nccl.break_after_split = 1;
    nccl.polls_until_ready = 0;  // GPU 0's half completes at the first poll, then GPU 1 fails
    NcclEngine child(&nccl, child_of(&parent, {0, 1}, {0, 1}), fast());
    const Status status = child.connect(&local);
    CHECK(status.code() == ErrorCode::kPeerLost);
    // The parent's two and the child NCCL made for GPU 0: NCCL's order, parent first.
    CHECK(nccl.aborts == 3);
    std::lock_guard lock(nccl.mutex);
    CHECK(nccl.comms.size() == 3);
    for (const auto& [h, c] : nccl.comms) CHECK(c.aborted);
  }
  // The parent is unusable, and its communicators are aborted without waiting for the job's end.
  CHECK_FALSE(parent.allreduce(buffers_for(parent), 4, ReduceSpec{}).ok());
  for (int i = 0; i < 200 && nccl.aborts < 2; ++i) std::this_thread::sleep_for(5ms);
  CHECK(nccl.aborts >= 2);
  std::lock_guard lock(nccl.mutex);
  for (int h : {1, 2}) CHECK(nccl.comms.at(h).aborted);  // the parent's, before any child
}

TEST_CASE("nccl engine: an abort of one communicator of a split family fails the others' work in flight",
          "[nccl][engine][split]") {
  // NCCL's abort flag is shared by communicators that share resources: the child's abort cuts
  // the parent's kernels short too, so the parent's watchdog must fail its bucket, not answer it.
  FakeNccl nccl;
  LocalRendezvous local;
  NcclEngine parent(&nccl, spec_of({0, 1}, {0, 1}), fast());
  REQUIRE(parent.connect(&local).ok());
  NcclEngine child(&nccl, child_of(&parent, {0, 1}, {1, 0}), fast());
  REQUIRE(child.connect(&local).ok());
  REQUIRE(parent.allreduce(buffers_for(parent), 4, ReduceSpec{}).ok());
  std::promise<Status> answered;
  parent.watch(
      "allreduce bucket 0",
      [](bool* done) {
        *done = false;  // the GPUs never say it finished
        return Status();
      },
      60'000ms, [&](const Status& s) { answered.set_value(s); });
  child.abort(Status::aborted("job j failed: rank 1 left"));
  auto answer = answered.get_future();
  REQUIRE(answer.wait_for(2s) == std::future_status::ready);
  const Status status = answer.get();
  CHECK(status.code() == ErrorCode::kAborted);
  CHECK_THAT(status.message(), Catch::Contains("sharing its resources"));
  CHECK_FALSE(parent.allreduce(buffers_for(parent), 4, ReduceSpec{}).ok());
}

TEST_CASE("nccl engine: a split parent may go before its child", "[nccl][engine][split]") {
  FakeNccl nccl;
  LocalRendezvous local;
  auto parent = std::make_unique<NcclEngine>(&nccl, spec_of({0, 1}, {0, 1}), fast());
  REQUIRE(parent->connect(&local).ok());
  NcclEngine child(&nccl, child_of(parent.get(), {0, 1}, {0, 1}), fast());
  REQUIRE(child.connect(&local).ok());
  CHECK(child.split());
  parent.reset();  // the executor ends its engines in name order, parents first or last
  CHECK(nccl.aborts == 2);
  // The child's calls fail cleanly (one abort flag), and its own end aborts it once.
  CHECK_FALSE(step(child).ok());
  CHECK(nccl.overlaps == 0);
}

TEST_CASE("nccl engine: across nodes every rank of the parent takes part in the split, on nodes without the child's GPUs too",
          "[nccl][engine][split]") {
  // The parent: node 0 GPUs 0 and 1, node 1 GPUs 0 and 1 (4 ranks). The child: node 0's GPU 1
  // alone... and node 1's GPU 0 (2 ranks); then a child with no GPU on node 1.
  FakeNccl nccl;
  Table table(2);
  std::vector<std::unique_ptr<NcclEngine>> parents;
  parents.push_back(std::make_unique<NcclEngine>(&nccl, spec_of({0, 1}, {0, 1}), fast()));
  parents.push_back(std::make_unique<NcclEngine>(&nccl, spec_of({0, 1}, {0, 1}), fast()));
  for (const Status& s : connect_all(parents, &table)) {
    INFO(s.message());
    REQUIRE(s.ok());
  }
  nccl.calls.clear();
  std::vector<std::unique_ptr<NcclEngine>> children;
  children.push_back(std::make_unique<NcclEngine>(&nccl, child_of(parents[0].get(), {1}, {-1, 0}), fast()));
  children.push_back(std::make_unique<NcclEngine>(&nccl, child_of(parents[1].get(), {0}, {0, -1}), fast()));
  for (const Status& s : connect_all(children, &table)) {
    INFO(s.message());
    REQUIRE(s.ok());
  }
  CHECK(nccl.ids_made == 1);
  CHECK(splits_in(nccl) == std::multiset<std::string>{"split rank 0 on 0 color -1 key 0",
                                                      "split rank 1 on 1 color 0 key 0",
                                                      "split rank 2 on 0 color 0 key 1",
                                                      "split rank 3 on 1 color -1 key 0"});
  for (const auto& child : children) CHECK(child->ranks() == 2);
  nccl.calls.clear();
  const auto another = [&](int node, std::vector<int> devices, std::vector<int> slots) {
    DeviceEngineSpec spec = child_of(parents[static_cast<size_t>(node)].get(), std::move(devices), std::move(slots));
    spec.name = "nccl/s3/2:tp";
    return std::make_unique<NcclEngine>(&nccl, spec, fast());
  };
  std::vector<std::unique_ptr<NcclEngine>> node0_only;
  node0_only.push_back(another(0, {0, 1}, {0, 1}));
  node0_only.push_back(another(1, {}, {-1, -1}));
  for (const Status& s : connect_all(node0_only, &table)) {
    INFO(s.message());
    REQUIRE(s.ok());
  }
  // Node 1 holds no GPU of this child, but its parent ranks join the split all the same.
  CHECK(splits_in(nccl) == std::multiset<std::string>{"split rank 0 on 0 color 0 key 0",
                                                      "split rank 1 on 1 color 0 key 1",
                                                      "split rank 2 on 0 color -1 key 0",
                                                      "split rank 3 on 1 color -1 key 0"});
  CHECK(node0_only[0]->ranks() == 2);
  REQUIRE(step(*node0_only[0]).ok());
  CHECK(nccl.overlaps == 0);
}

}  // namespace gradsync::nccl
