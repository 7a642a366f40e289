#include "daemon/engine/engine.h"

#include <future>

#include "daemon/backend/host/staged.h"

namespace gradsync {

void CollectiveEngine::allreduce_inputs(std::vector<const void*> inputs, void* out, size_t count,
                                        const ReduceSpec& spec, EngineDone done) {
  reduce::KernelArgs args;
  args.dtype = reduce::accumulation_dtype(spec.element);
  args.combine = spec.op;
  void* const outputs[] = {out};
  reduce::reduce(args, inputs, outputs, count);
  allreduce(out, count, spec, std::move(done));
}

Status run_engine_call(const std::function<void(EngineDone)>& call) {
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> outcome = result->get_future();
  call([result](const Status& status) { result->set_value(status); });
  return outcome.get();
}

}  // namespace gradsync
