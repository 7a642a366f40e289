// The rings of a job's local clients, as the worker uses them: it pops their submissions and
// posts their completions, and on failure publishes the sticky error in every client's rings.
// A client is there once it joined (attach()). Worker thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/job/channel.h"
#include "daemon/reduce/health.h"
#include "shared/channel_layout.h"
#include "shared/status.h"

namespace gradsync {

class LocalClients {
 public:
  // `local_world_size` places, empty until each client joins.
  explicit LocalClients(size_t local_world_size) : clients_(local_world_size) {}

  size_t size() const { return clients_.size(); }
  bool joined(uint32_t local_rank) const { return clients_[local_rank].has_value(); }
  void attach(uint32_t local_rank, std::shared_ptr<ClientChannel> channel) { clients_[local_rank].emplace(channel); }

  // Whether any joined client has a submission waiting (the worker's wake-up condition).
  bool any_submitted() const;
  // The next entry of `local_rank`'s submission ring (a joined client).
  PopResult pop(uint32_t local_rank, SubmitEntry* entry) { return clients_[local_rank]->submit.try_pop(entry); }
  // The sequence number `local_rank` must submit next (a joined client).
  uint64_t& next_seq(uint32_t local_rank) { return clients_[local_rank]->next_seq; }

  // Tells `local_rank` that operation `seq` ended with `status`. False when its completion
  // ring is full: the client stopped draining it (it keeps at most CompletionRing::capacity
  // operations outstanding), and the job cannot go on without it. A client that never joined
  // has nobody to tell: true.
  // `health`, when given, is the operation's fused health (ReduceOptions::health).
  bool post(uint32_t local_rank, uint64_t seq, const Status& status, const reduce::Health* health = nullptr);

  // The job failed: every joined client's rings carry `status`, so later submissions fail at
  // once without waiting for the daemon.
  void publish_failure(const Status& status);
  // Wakes every joined client (it re-reads its rings).
  void wake_all();

 private:
  struct Client {
    explicit Client(std::shared_ptr<ClientChannel> memory)
        : channel(std::move(memory)),
          submit(&channel->client()->submit),
          completion(&channel->daemon()->completion, &channel->client()->completion_cursor),
          completion_ready(channel->completion_ready()) {}
    std::shared_ptr<ClientChannel> channel;  // keeps the rings mapped
    RingReader<SubmitRing> submit;
    RingWriter<CompletionRing> completion;
    WakeRef completion_ready;
    uint64_t next_seq = 1;
  };
  std::vector<std::optional<Client>> clients_;  // by local rank
};

}  // namespace gradsync
