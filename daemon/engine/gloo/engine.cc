#include "daemon/engine/gloo/engine.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/ibverbs/device.h>
#include <gloo/transport/tcp/device.h>


#include <atomic>
#include <deque>
#include <system_error>
#include <thread>

#include "daemon/engine/gloo/store.h"
#include "daemon/reduce/staged.h"
#include "shared/mutex.h"

namespace gradsync::gloo_engine {
namespace {

// The one place Gloo's exceptions become Status. IoException covers closed connections and
// Gloo's own timeouts; both mean a peer daemon is gone or stuck.
template <class Body>
Status translate(const std::string& what, Body&& body) {
  try {
    body();
    return Status();
  } catch (const ::gloo::IoException& e) {
    const std::string text = e.what();
    if (text.find("imed out") != std::string::npos) return Status::timeout(what + " timed out: " + text);
    return Status::peer_lost(what + " lost a peer: " + text);
  } catch (const ::gloo::Exception& e) {
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
    case DType::kFloat16:
    case DType::kBFloat16: fn(static_cast<uint16_t*>(nullptr)); break;  // wire compression
    default: throw Error(Status::internal("the engine does not carry " + std::string(dtype_name(dtype))));
  }
}

// How long abort() waits for a call that is still moving data to fail on the closed pairs.
constexpr auto kLeaveGlooWait = std::chrono::milliseconds(500);

std::function<void(void*, const void*, const void*, size_t)> combine_of(const ReduceSpec& spec) {
  if (spec.wire) return reduce::wire_combiner(spec.op, *spec.wire);
  reduce::KernelArgs args;
  args.dtype = spec.element;
  args.combine = spec.op;
  args.wide_accumulate = spec.wide_accumulate;
  return reduce::combiner(args);
}

// What the engine's thread needs, shared with it: the thread may outlive the engine (see abort).
struct EngineState {
  struct Call {
    std::string what;
    EngineDone done;
    std::function<void()> body;
    std::shared_ptr<std::atomic<bool>> finished = std::make_shared<std::atomic<bool>>(false);
  };

  EngineSpec spec;
  std::shared_ptr<::gloo::Context> context;
  Mutex mutex;
  CondVar wake;
  std::deque<Call> calls GS_GUARDED_BY(mutex);
  std::shared_ptr<std::atomic<bool>> in_flight GS_GUARDED_BY(mutex);  // the call Gloo is running
  EngineDone in_flight_done GS_GUARDED_BY(mutex);
  Status aborted GS_GUARDED_BY(mutex);
  bool stopping GS_GUARDED_BY(mutex) = false;
  Status failure;                                  // engine thread only
  // reduce_scatter's copies of this node's part, kept between calls so that a step does not
  // fault fresh pages in (engine thread only; it grows to the largest part times nodes, at most
  // twice the largest bucket sent as parts, node_parts_even in model/tensor_set.h, and is never shrunk).
  std::vector<uint8_t> received;

  // Runs the calls in order until the engine is closed.
  void run() {
    for (;;) {
      Call call;
      Status status;
      {
        MutexLock lock(mutex);
        while (!stopping && calls.empty()) wake.wait(lock);
        if (calls.empty()) return;
        call = std::move(calls.front());
        calls.pop_front();
        status = failure.ok() ? aborted : failure;
        if (status.ok()) {
          in_flight = call.finished;
          in_flight_done = call.done;
        }
      }
      if (status.ok()) {
        status = translate("gloo " + call.what + " among " + std::to_string(spec.nodes) + " nodes", call.body);
        MutexLock lock(mutex);
        in_flight.reset();
        in_flight_done = nullptr;
        if (!status.ok() && !aborted.ok()) status = aborted;  // our own abort, not a peer's fault
        wake.notify_all();  // an abort() may be waiting for this call to leave Gloo
      }
      if (failure.ok()) failure = status;
      // abort() may have answered this call already.
      if (!call.finished->exchange(true)) call.done(status);
    }
  }
};

// Gloo (2022) cannot interrupt a call blocked on a peer that stopped answering: it waits until
// its own timeout. abort() therefore closes every pair of the mesh first, so that no byte can
// reach or leave the call's buffers any more, and then answers the call at once. The blocked
// Gloo call lingers on the engine's thread until its timeout, touching only Gloo's own state,
// which the thread keeps alive; the engine does not wait for it when it is destroyed.
class GlooEngine final : public HostCollectiveEngine {
 public:
  GlooEngine(const EngineSpec& spec, std::shared_ptr<::gloo::Context> context, uint64_t slice_bytes)
      : state_(std::make_shared<EngineState>()), slice_bytes_(slice_bytes) {
    state_->spec = spec;
    state_->context = std::move(context);
    std::thread([state = state_] { state->run(); }).detach();
  }

  ~GlooEngine() override {
    abort(Status::aborted("the engine of job " + state_->spec.job + " (" + state_->spec.prefix + ") was closed"));
    {
      MutexLock lock(state_->mutex);
      state_->stopping = true;
    }
    state_->wake.notify_all();
  }

  int node() const override { return state_->spec.node; }
  int nodes() const override { return state_->spec.nodes; }
  uint64_t slice_bytes() const override { return slice_bytes_; }

  void allreduce(void* data, size_t count, const ReduceSpec& spec, EngineDone done) override {
    post("allreduce", std::move(done), [context = state_->context, timeout = state_->spec.timeout, data, count, spec] {
      with_type(spec.wire.value_or(reduce::accumulation_dtype(spec.element)), [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        ::gloo::AllreduceOptions opts(context);
        // Output only: Gloo then reduces in place. Given the same buffer as its input too, it
        // would memcpy every segment onto itself first, a pass over the data for nothing.
        opts.setOutput(static_cast<T*>(data), count);
        opts.setReduceFunction(combine_of(spec));
        opts.setAlgorithm(count * sizeof(T) < kBcubeBelowBytes ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                                                                : ::gloo::AllreduceOptions::Algorithm::RING);
        opts.setTimeout(timeout);
        ::gloo::allreduce(opts);
      });
    });
  }

  void broadcast(void* data, size_t bytes, int root_node, EngineDone done) override {
    post("broadcast", std::move(done),
         [context = state_->context, timeout = state_->spec.timeout, node = state_->spec.node, data, bytes, root_node] {
           ::gloo::BroadcastOptions opts(context);
           opts.setOutput(static_cast<uint8_t*>(data), bytes);
           if (node == root_node) opts.setInput(static_cast<uint8_t*>(data), bytes);
           opts.setRoot(root_node);
           opts.setTimeout(timeout);
           ::gloo::broadcast(opts);
         });
  }

  void allgather(const void* in, size_t bytes, void* out, EngineDone done) override {
    post("allgather", std::move(done),
         [context = state_->context, timeout = state_->spec.timeout, nodes = state_->spec.nodes, in, bytes, out] {
           ::gloo::AllgatherOptions opts(context);
           opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
           opts.setOutput(static_cast<uint8_t*>(out), bytes * static_cast<size_t>(nodes));
           opts.setTimeout(timeout);
           ::gloo::allgather(opts);
         });
  }

  void reduce(void* data, size_t count, const ReduceSpec& spec, int root_node, EngineDone done) override {
    post("reduce", std::move(done),
         [context = state_->context, timeout = state_->spec.timeout, data, count, spec, root_node] {
           with_type(spec.wire.value_or(reduce::accumulation_dtype(spec.element)), [&](auto* typed) {
             using T = std::remove_pointer_t<decltype(typed)>;
             ::gloo::ReduceOptions opts(context);
             opts.setInput(static_cast<T*>(data), count);
             opts.setOutput(static_cast<T*>(data), count);
             opts.setReduceFunction(combine_of(spec));
             opts.setRoot(root_node);
             opts.setTimeout(timeout);
             ::gloo::reduce(opts);
           });
         });
  }

  // Gloo's one reduce-scatter (ReduceScatterHalvingDoubling) is an old-style algorithm over
  // `int` counts whose result layout is its own, not the node-major parts this contract asks
  // for: this is Gloo's alltoallv, which sends each node its part directly, then this node's
  // combine of the copies it received, in node order, on the engine's thread as Gloo's own
  // combines run. Unlike theirs, the combine runs after Gloo returned, so an abort's 500 ms
  // wait may answer the call while it still writes this node's part: the caller's buffers stay
  // alive in Done (engine contract), and the caller gives the next bucket fresh ones while a
  // call still holds them (host/cross_node.cc).
  void reduce_scatter(void* data, std::span<const uint64_t> counts, const ReduceSpec& spec,
                      EngineDone done) override {
    post("reduce_scatter", std::move(done),
         [state = state_.get(), context = state_->context, timeout = state_->spec.timeout, node = state_->spec.node,
          data, counts = std::vector<uint64_t>(counts.begin(), counts.end()), spec] {
           const DType carried = spec.wire.value_or(reduce::accumulation_dtype(spec.element));
           const size_t element = dtype_size(carried);
           if (counts.size() != static_cast<size_t>(context->size)) {
             throw Error(Status::internal("reduce_scatter was given " + std::to_string(counts.size()) +
                                          " parts for " + std::to_string(context->size) + " nodes"));
           }
           const uint64_t mine = counts[static_cast<size_t>(node)];
           uint64_t offset = 0;
           for (int n = 0; n < node; ++n) offset += counts[static_cast<size_t>(n)];
           // In bytes: Gloo's element type only sets the unit of its counts.
           std::vector<int64_t> in, out(counts.size(), static_cast<int64_t>(mine * element));
           for (uint64_t count : counts) in.push_back(static_cast<int64_t>(count * element));
           // Every node's copy of this node's part, node-major (at least one byte: Gloo maps
           // the pointer even when it receives nothing).
           std::vector<uint8_t>& copies = state->received;
           if (copies.size() < std::max<size_t>(1, counts.size() * mine * element)) {
             copies.resize(std::max<size_t>(1, counts.size() * mine * element));
           }
           ::gloo::AlltoallvOptions opts(context);
           opts.setInput(static_cast<uint8_t*>(data), std::move(in));
           opts.setOutput(copies.data(), std::move(out));
           opts.setTimeout(timeout);
           ::gloo::alltoallv(opts);
           if (mine == 0 || counts.size() < 2) return;
           const auto combine = combine_of(spec);
           uint8_t* part = static_cast<uint8_t*>(data) + offset * element;
           const size_t bytes = mine * element;
           combine(part, copies.data(), copies.data() + bytes, mine);
           for (size_t n = 2; n < counts.size(); ++n) combine(part, part, copies.data() + n * bytes, mine);
         });
  }

  void abort(const Status& why) override {
    std::shared_ptr<std::atomic<bool>> in_flight;
    EngineDone done;
    std::deque<EngineState::Call> queued;
    Status reason;
    {
      MutexLock lock(state_->mutex);
      if (!state_->aborted.ok()) return;
      state_->aborted = why.ok() ? Status::aborted("aborted") : why;
      reason = state_->aborted;
      in_flight = state_->in_flight;
      done = state_->in_flight_done;
      // Calls that never started are answered with the abort too, not after the call in
      // Gloo, which may linger there until its timeout.
      queued.swap(state_->calls);
    }
    // Close every pair before answering: from then on Gloo moves no byte in or out of the
    // caller's buffers, so the caller may release them as soon as it has the answer.
    for (int n = 0; n < state_->spec.nodes; ++n) {
      if (n == state_->spec.node) continue;
      if (auto& pair = state_->context->getPair(n)) pair->close();
    }
    if ((in_flight && done) || !queued.empty()) {
      // A call that is moving data fails at its next send on a closed pair, within
      // milliseconds; only one blocked on a silent peer stays. Wait for the former, so that no
      // combine step can touch the buffers after the caller has its answer; wait off the
      // caller's thread, because abort() must not block (the caller may be the io thread).
      // The queued calls are answered after it, in the order they were made.
      answer_elsewhere([state = state_, in_flight, done = std::move(done), queued = std::move(queued), reason]() mutable {
        if (in_flight && done) {
          {
            MutexLock lock(state->mutex);
            const auto deadline = std::chrono::steady_clock::now() + kLeaveGlooWait;
            while (state->in_flight == in_flight && state->wake.wait_until(lock, deadline)) {
            }
          }
          if (!in_flight->exchange(true)) done(reason);
        }
        for (auto& call : queued) call.done(reason);
      });
    }
    state_->wake.notify_all();
  }

 private:
  // Runs `answer` on a thread of its own; inline when no thread can be started (the answer
  // must come, and an exception here would end the daemon; abort() may then block for up to
  // kLeaveGlooWait).
  template <class Answer>
  static void answer_elsewhere(Answer answer) {
    auto shared = std::make_shared<Answer>(std::move(answer));
    try {
      std::thread([shared] { (*shared)(); }).detach();
    } catch (const std::system_error&) {
      (*shared)();
    }
  }

  void post(const char* what, EngineDone done, std::function<void()> body) {
    Status aborted;
    {
      MutexLock lock(state_->mutex);
      aborted = state_->aborted;
      if (aborted.ok()) state_->calls.push_back(EngineState::Call{what, std::move(done), std::move(body)});
    }
    if (!aborted.ok()) {
      // Not queued behind a call that lingers in Gloo until its timeout: a call after an abort
      // fails at once (engine.h), answered on a thread of the engine as every call is.
      answer_elsewhere([done = std::move(done), aborted] { done(aborted); });
      return;
    }
    state_->wake.notify_all();
  }

  std::shared_ptr<EngineState> state_;
  uint64_t slice_bytes_;
};

std::shared_ptr<::gloo::transport::Device> make_device(const GlooTransport& options) {
  if (options.transport == "ibverbs") {
    ::gloo::transport::ibverbs::attr attr;
    attr.name = options.ib_device;
    attr.port = options.ib_port;
    attr.index = options.ib_index;
    return ::gloo::transport::ibverbs::CreateDevice(attr);
  }
  if (options.transport != "tcp") {
    throw Error(Status::invalid_argument("unknown Gloo transport '" + options.transport + "' (tcp or ibverbs)"));
  }
  ::gloo::transport::tcp::attr attr;
  if (!options.iface.empty()) {
    attr.iface = options.iface;
  } else {
    attr.hostname = options.hostname;
  }
  return ::gloo::transport::tcp::CreateDevice(attr);
}

}  // namespace

Status make_engine(const EngineSpec& spec, const GlooTransport& transport, std::unique_ptr<HostCollectiveEngine>* out) {
  PeerStore store(spec.rendezvous, spec.job, spec.prefix, spec.timeout, transport.transport == "tcp", spec.nodes,
                  spec.node);
  return make_engine(spec, transport, store, out);
}

Status make_engine(const EngineSpec& spec, const GlooTransport& transport, ::gloo::rendezvous::Store& store,
                   std::unique_ptr<HostCollectiveEngine>* out) {
  std::shared_ptr<::gloo::rendezvous::Context> context;
  const Status status = translate("forming the Gloo mesh of job " + spec.job + " (" + spec.prefix + ")", [&] {
    auto device = make_device(transport);
    context = std::make_shared<::gloo::rendezvous::Context>(spec.node, spec.nodes);
    context->setTimeout(spec.timeout);
    context->connectFullMesh(store, device);
  });
  if (!status.ok()) return status;
  *out = std::make_unique<GlooEngine>(spec, std::move(context), transport.slice_bytes);
  return Status();
}

}  // namespace gradsync::gloo_engine
