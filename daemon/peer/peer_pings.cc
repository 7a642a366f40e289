#include "daemon/peer/peer_pings.h"

#include "daemon/peer/peer_client.h"
#include "daemon/peer/token_proof.h"
#include "shared/mutex.h"

namespace gradsync {
namespace {

using Steady = std::chrono::steady_clock;

// One ping in flight: what gRPC reads and writes until its callback.
struct Flight {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<peer::Peer::Stub> stub;
  grpc::ClientContext context;
  peer::PingRequest request;
  peer::PingReply reply;
};

}  // namespace

std::vector<PingAnswer> ping_all(const std::vector<std::string>& addresses, const std::shared_ptr<const PeerAuth>& auth,
                                 std::chrono::milliseconds bound, size_t most_in_flight) {
  const size_t count = addresses.size();
  const size_t most = std::max<size_t>(1, most_in_flight);
  const auto deadline = Steady::now() + bound;
  // A ping starts only while a quarter of the bound is left: one started at its very end
  // would be cut short and reported silent, which says "gone" of a daemon nobody really asked.
  const auto last_start = deadline - bound / 4;
  std::vector<PingAnswer> answers(count, PingAnswer::kNotAsked);
  std::vector<std::unique_ptr<Flight>> flights(count);
  Mutex mutex;
  CondVar ended;
  size_t in_flight = 0;          // pings started whose callback has not run
  std::vector<size_t> finished;  // pings whose callback ran, their flights still to free
  // Every ping started has ended before this returns, on every path (an exception included):
  // the callbacks use what is on this stack.
  struct Drain {
    Mutex& mutex;
    CondVar& ended;
    size_t& in_flight;
    ~Drain() {
      MutexLock lock(mutex);
      while (in_flight > 0) ended.wait(lock);
    }
  } drain{mutex, ended, in_flight};

  size_t next = 0;
  for (;;) {
    std::vector<size_t> freed;
    bool start = false;
    bool over = false;
    {
      MutexLock lock(mutex);
      for (;;) {
        const bool may_start = next < count && Steady::now() < last_start;
        start = may_start && in_flight < most;
        over = !may_start && in_flight == 0;
        if (start || over || !finished.empty()) break;
        // Woken by each ping's end; while pings may still start, by the last start too.
        if (may_start) {
          ended.wait_until(lock, last_start);
        } else {
          ended.wait(lock);
        }
      }
      freed.swap(finished);
      if (start) {
        ++in_flight;
        answers[next] = PingAnswer::kSilent;
      }
    }
    // Made and freed without the lock, so that the callbacks (on gRPC's threads) never wait
    // on a channel being made; a finished ping's connection goes with its flight.
    for (size_t i : freed) flights[i].reset();
    if (over) break;
    if (!start) continue;
    const size_t i = next++;
    try {
      auto flight = std::make_unique<Flight>();
      flight->channel = peer_channel(addresses[i], auth);
      flight->stub = peer::Peer::NewStub(flight->channel);
      // Each call's own wall-clock deadline, from the one steady bound: a clock step between
      // calls moves none of them.
      flight->context.set_deadline(std::chrono::system_clock::now() +
                                   std::max(Steady::duration::zero(), deadline - Steady::now()));
      if (auth && !auth->token.empty()) {
        // As PeerClient proves a Ping: no callee id yet, about no job.
        flight->context.AddMetadata(kProofKey, make_proof(auth->token, "Ping", ProofScope{{}, auth->node, {}},
                                                          flight->request));
      }
      Flight& f = *flight;
      flights[i] = std::move(flight);
      f.stub->async()->Ping(&f.context, &f.request, &f.reply, [&, i](grpc::Status status) {
        MutexLock done(mutex);
        answers[i] = status.ok() ? PingAnswer::kAnswers : PingAnswer::kSilent;
        finished.push_back(i);
        --in_flight;
        ended.notify_all();
      });
    } catch (...) {
      MutexLock lock(mutex);
      answers[i] = PingAnswer::kNotAsked;
      --in_flight;
      throw;
    }
  }
  return answers;
}

}  // namespace gradsync
