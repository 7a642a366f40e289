#include "daemon/peer/peer_pings.h"

#include "daemon/peer/peer_client.h"
#include "daemon/peer/token_proof.h"
#include "shared/mutex.h"

namespace gradsync {
namespace {

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
  const auto deadline = std::chrono::steady_clock::now() + bound;
  const auto system_deadline = std::chrono::system_clock::now() + bound;
  std::vector<PingAnswer> answers(addresses.size(), PingAnswer::kNotAsked);
  std::vector<std::unique_ptr<Flight>> flights(addresses.size());
  Mutex mutex;
  CondVar ended;
  size_t in_flight = 0;
  size_t next = 0;
  MutexLock lock(mutex);
  while (true) {
    while (next < addresses.size() && in_flight < std::max<size_t>(1, most_in_flight) &&
           std::chrono::steady_clock::now() < deadline) {
      const size_t i = next++;
      auto flight = std::make_unique<Flight>();
      flight->channel = peer_channel(addresses[i], auth);
      flight->stub = peer::Peer::NewStub(flight->channel);
      flight->context.set_deadline(system_deadline);
      if (auth && !auth->token.empty()) {
        // As PeerClient proves a Ping: no callee id yet, about no job.
        flight->context.AddMetadata(kProofKey, make_proof(auth->token, "Ping", ProofScope{{}, auth->node, {}},
                                                          flight->request));
      }
      answers[i] = PingAnswer::kSilent;
      ++in_flight;
      Flight& f = *flight;
      flights[i] = std::move(flight);
      f.stub->async()->Ping(&f.context, &f.request, &f.reply, [&, i](grpc::Status status) {
        MutexLock done(mutex);
        answers[i] = status.ok() ? PingAnswer::kAnswers : PingAnswer::kSilent;
        --in_flight;
        ended.notify_all();
      });
    }
    const bool none_to_start = next == addresses.size() || std::chrono::steady_clock::now() >= deadline;
    if (in_flight == 0 && none_to_start) break;
    // Woken by each ping's end; after the deadline, only by those (gRPC ends each at it).
    if (none_to_start) {
      ended.wait(lock);
    } else {
      ended.wait_until(lock, deadline);
    }
  }
  return answers;
}

}  // namespace gradsync
