#include "daemon/engine/host_engine.h"

#include <future>

namespace gradsync {

Status run_engine_call(const std::function<void(EngineDone)>& call, std::shared_ptr<const void> owners) {
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> outcome = result->get_future();
  call([result, owners = std::move(owners)](const Status& status) { result->set_value(status); });
  return outcome.get();
}

}  // namespace gradsync
