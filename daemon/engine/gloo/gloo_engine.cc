#include "daemon/engine/gloo/gloo_engine.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/ibverbs/device.h>
#include <gloo/transport/tcp/device.h>

#include "daemon/engine/gloo/peer_store.h"

namespace gradsync {
namespace {

// The one place Gloo's exceptions become Status. IoException covers closed connections and
// Gloo's own timeouts; both mean a peer daemon is gone or stuck.
template <class Body>
Status translate(const std::string& what, Body&& body) {
  try {
    body();
    return Status();
  } catch (const gloo::IoException& e) {
    const std::string text = e.what();
    if (text.find("imed out") != std::string::npos) return Status::timeout(what + " timed out: " + text);
    return Status::peer_lost(what + " lost a peer: " + text);
  } catch (const gloo::Exception& e) {
    return Status::internal(what + " failed in Gloo: " + e.what());
  } catch (const Error& e) {
    return Status(e.code(), what + ": " + e.status().message(), e.status().where());
  } catch (const std::exception& e) {
    return Status::internal(what + " failed: " + e.what());
  }
}

// Gloo's typed entry points want T*; the element type only sets the chunking granularity.
template <class Fn>
void with_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(static_cast<float*>(nullptr)); break;
    case DType::kFloat64: fn(static_cast<double*>(nullptr)); break;
    case DType::kInt32: fn(static_cast<int32_t*>(nullptr)); break;
    case DType::kInt64: fn(static_cast<int64_t*>(nullptr)); break;
    case DType::kUInt8: fn(static_cast<uint8_t*>(nullptr)); break;
    default: throw Error(Status::internal("the engine does not carry " + std::string(dtype_name(dtype))));
  }
}

class GlooEngine final : public CollectiveEngine {
 public:
  GlooEngine(const GlooEngineOptions& options, std::shared_ptr<gloo::Context> context)
      : options_(options), context_(std::move(context)) {}

  int node() const override { return options_.node; }
  int nodes() const override { return options_.nodes; }

  Status allreduce(void* data, size_t count, DType dtype, const CombineFn& combine) override {
    return run("allreduce", [&] {
      with_type(dtype, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        gloo::AllreduceOptions opts(context_);
        opts.setInput(static_cast<T*>(data), count);
        opts.setOutput(static_cast<T*>(data), count);
        opts.setReduceFunction(combine);
        opts.setAlgorithm(count * sizeof(T) < kBcubeBelowBytes ? gloo::AllreduceOptions::Algorithm::BCUBE
                                                                : gloo::AllreduceOptions::Algorithm::RING);
        opts.setTimeout(options_.timeout);
        gloo::allreduce(opts);
      });
    });
  }

  Status broadcast(void* data, size_t bytes, int root_node) override {
    return run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      if (options_.node == root_node) opts.setInput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root_node);
      opts.setTimeout(options_.timeout);
      gloo::broadcast(opts);
    });
  }

  Status allgather(const void* in, size_t bytes, void* out) override {
    return run("allgather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
      opts.setOutput(static_cast<uint8_t*>(out), bytes * static_cast<size_t>(options_.nodes));
      opts.setTimeout(options_.timeout);
      gloo::allgather(opts);
    });
  }

  Status reduce(void* data, size_t count, DType dtype, const CombineFn& combine, int root_node) override {
    return run("reduce", [&] {
      with_type(dtype, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        gloo::ReduceOptions opts(context_);
        opts.setInput(static_cast<T*>(data), count);
        opts.setOutput(static_cast<T*>(data), count);
        opts.setReduceFunction(combine);
        opts.setRoot(root_node);
        opts.setTimeout(options_.timeout);
        gloo::reduce(opts);
      });
    });
  }

 private:
  template <class Body>
  Status run(const std::string& op, Body&& body) {
    if (!failure_.ok()) return failure_;
    failure_ = translate("gloo " + op + " among " + std::to_string(options_.nodes) + " nodes", body);
    return failure_;
  }

  GlooEngineOptions options_;
  std::shared_ptr<gloo::Context> context_;
  Status failure_;
};

std::shared_ptr<gloo::transport::Device> make_device(const GlooEngineOptions& options) {
  if (options.transport == "ibverbs") {
    gloo::transport::ibverbs::attr attr;
    attr.name = options.ib_device;
    attr.port = options.ib_port;
    attr.index = options.ib_index;
    return gloo::transport::ibverbs::CreateDevice(attr);
  }
  if (options.transport != "tcp") {
    throw Error(Status::invalid_argument("unknown Gloo transport '" + options.transport + "' (tcp or ibverbs)"));
  }
  gloo::transport::tcp::attr attr;
  if (!options.iface.empty()) {
    attr.iface = options.iface;
  } else {
    attr.hostname = options.hostname;
  }
  return gloo::transport::tcp::CreateDevice(attr);
}

}  // namespace

std::unique_ptr<CollectiveEngine> make_gloo_engine(const GlooEngineOptions& options) {
  std::shared_ptr<gloo::rendezvous::Context> context;
  const Status status = translate("forming the Gloo mesh of job " + options.job + " (" + options.prefix + ")", [&] {
    auto device = make_device(options);
    context = std::make_shared<gloo::rendezvous::Context>(options.node, options.nodes);
    context->setTimeout(options.timeout);
    PeerStore store(options.rendezvous, options.job, options.prefix, options.timeout);
    context->connectFullMesh(store, device);
  });
  throw_if_error(status);
  return std::make_unique<GlooEngine>(options, std::move(context));
}

}  // namespace gradsync
