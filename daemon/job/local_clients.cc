#include "daemon/job/local_clients.h"

#include <algorithm>
#include <cstring>

namespace gradsync {

bool LocalClients::any_submitted() const {
  for (const auto& client : clients_) {
    if (client && !client->submit.empty()) return true;
  }
  return false;
}

bool LocalClients::post(uint32_t local_rank, uint64_t seq, const Status& status, const reduce::Health* health) {
  if (!clients_[local_rank]) return true;
  CompletionEntry entry;
  entry.op_seq = seq;
  entry.code = static_cast<uint32_t>(status.code());
  if (health) {
    entry.result_flags |= kResultHealth;
    entry.found_inf = health->found_inf ? 1 : 0;
    entry.sq_norm = health->sum_sq;
  }
  const std::string& message = status.message();
  entry.message_length = static_cast<uint32_t>(std::min(message.size(), kCompletionMessageBytes));
  std::memcpy(entry.message, message.data(), entry.message_length);
  Client& client = *clients_[local_rank];
  if (!client.completion.try_push(entry)) return false;
  client.completion_ready.notify();
  return true;
}

void LocalClients::publish_failure(const Status& status) {
  for (auto& client : clients_) {
    if (client) client->channel->publish_failure(status);
  }
}

void LocalClients::wake_all() {
  for (auto& client : clients_) {
    if (client) client->completion_ready.notify();
  }
}

}  // namespace gradsync
