#include "daemon/engine/factory.h"

#include "daemon/engine/gloo/engine.h"
#if GRADSYNC_HAVE_CUDA
#include "daemon/engine/nccl/engine.h"
#endif

namespace gradsync {
namespace {

class Engines final : public HostEngineFactory {
 public:
  explicit Engines(GlooTransport gloo) : gloo_(std::move(gloo)) {}
  Status make(const EngineSpec& spec, std::unique_ptr<HostCollectiveEngine>* out) override {
    return gloo_engine::make_engine(spec, gloo_, out);
  }

 private:
  GlooTransport gloo_;
};

}  // namespace

std::unique_ptr<HostEngineFactory> make_host_engine_factory(const GlooTransport& gloo) { return std::make_unique<Engines>(gloo); }

std::unique_ptr<DeviceEngineFactory> make_device_engine_factory(std::chrono::seconds keep_idle) {
#if GRADSYNC_HAVE_CUDA
  return std::make_unique<nccl::NcclEngineFactory>(nccl::make_nccl_api(), nccl::EngineTiming{}, keep_idle);
#else
  (void)keep_idle;
  return nullptr;
#endif
}

}  // namespace gradsync
