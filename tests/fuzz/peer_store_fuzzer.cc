// The peer store's request handling (daemon/peer/peer_requests.h): a sequence of set, add, get
// and delete calls from three daemon instances and a caller without one, on keys near the
// formation protocol's. Nothing crashes, the store stays within its bounds, and a node of a
// generation, once taken, is never taken by another instance until the generation is deleted.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "daemon/peer/peer_requests.h"

namespace {

std::string make_key(FuzzedDataProvider& in, int* generation, int* node, bool* node_key) {
  *generation = in.ConsumeIntegralInRange<int>(0, 2);
  *node = in.ConsumeIntegralInRange<int>(0, 3);
  *node_key = false;
  const std::string g = "g" + std::to_string(*generation) + "/";
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: *node_key = true; return g + "node/" + std::to_string(*node);
    case 1: return g + "set/1/layout/" + std::to_string(*node);
    case 2: return g + "group/dp/" + std::to_string(*node);
    case 3: return g + "cfg/" + std::to_string(*node);
    case 4: return g + "cfg/count";
    case 5: return g + "ended";
    case 6: return "incarnations";
    case 7: return g + "~claim/" + std::to_string(*node);
    case 8: return g + in.ConsumeRandomLengthString(24);
    default: return in.ConsumeRandomLengthString(40);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  FuzzedDataProvider in(data, size);
  // One store for every input (its expiry thread is costly to start), emptied after each.
  static const KvStore::Limits limits = [] {
    KvStore::Limits l;
    l.max_value_bytes = 256;
    l.max_job_bytes = 4096;
    l.max_total_bytes = 8192;
    l.max_keys_per_job = 64;
    l.max_name_bytes = 64;
    return l;
  }();
  static KvStore store(limits);
  KeyScope scope(&store);
  std::set<std::string> jobs;
  const std::string instances[] = {"aaaa", "bbbb", "cccc", ""};
  std::map<std::tuple<std::string, int, int>, std::string> taken;  // (job, generation, node) -> instance
  for (int step = 0; step < 48 && in.remaining_bytes() > 0; ++step) {
    const std::string& instance = instances[in.ConsumeIntegralInRange<int>(0, 3)];
    const std::string job = in.ConsumeBool() ? "0.a" : in.ConsumeRandomLengthString(16);
    jobs.insert(job);
    int generation = 0, node = 0;
    bool node_key = false;
    const std::string key = make_key(in, &generation, &node, &node_key);
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:
      case 1: {
        peer::SetRequest request;
        request.set_job(job);
        request.set_key(key);
        request.set_value(in.ConsumeRandomLengthString(300));
        request.set_if_absent(in.ConsumeBool());
        peer::SetReply reply;
        const Status status = serve_set(store, scope, request, PeerCaller{instance, "fuzz"}, &reply);
        if (status.ok() && node_key) {
          auto [it, fresh] = taken.emplace(std::make_tuple(job, generation, node), instance);
          if (!fresh && it->second != instance) std::abort();  // a taken node went to another daemon
        }
        break;
      }
      case 2: {
        peer::AddRequest request;
        request.set_job(job);
        request.set_key(key);
        request.set_delta(in.ConsumeIntegralInRange<int64_t>(-2, 3));
        peer::AddReply reply;
        (void)serve_add(store, scope, request, PeerCaller{instance, "fuzz"}, &reply);
        break;
      }
      case 3: {
        peer::GetRequest request;
        request.set_job(job);
        request.add_keys(key);
        if (in.ConsumeBool()) request.add_keys(make_key(in, &generation, &node, &node_key));
        if (check_get(scope, request, PeerCaller{instance, "fuzz"}).ok()) {
          store.get(job, {request.keys().begin(), request.keys().end()}, std::chrono::milliseconds(0),
                    [](const Status&, std::vector<std::string>) {});
        }
        break;
      }
      default: {
        peer::DeleteJobRequest request;
        request.set_job(job);
        request.set_prefix(in.ConsumeBool() ? "g" + std::to_string(generation) + "/" : in.ConsumeRandomLengthString(8));
        peer::DeleteJobReply reply;
        if (serve_delete(store, scope, request, PeerCaller{instance, "fuzz"}, &reply).ok()) {
          for (auto it = taken.begin(); it != taken.end();) {
            const bool gone = std::get<0>(it->first) == job && "g" + std::to_string(std::get<1>(it->first)) + "/" == request.prefix();
            it = gone ? taken.erase(it) : std::next(it);
          }
        }
        break;
      }
    }
    const KvStore::Usage usage = store.usage();
    if (usage.bytes > limits.max_total_bytes) std::abort();
  }
  for (const std::string& job : jobs) store.delete_job(job);
  if (store.usage().jobs != 0) std::abort();  // nothing outlives its job
  return 0;
}
