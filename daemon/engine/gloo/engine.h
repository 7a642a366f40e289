// The Gloo engine: one Gloo context among the nodes of one process group, over TCP (or ibverbs
// when configured), rendezvoused through the peer service. Calls run in order on the engine's
// own thread (Gloo calls are blocking), so the caller can overlap other work with them.
//
// Allreduce algorithm rule: buffers under 256 KiB use bcube (log-depth, latency-bound sizes);
// larger ones use ring (bandwidth-optimal). Both run gradsync's combine function, so the
// integer and half-precision semantics are gradsync's, not Gloo's defaults.
//
// Abort: Gloo (2022) cannot interrupt a call blocked on a stuck peer. abort() closes every pair
// of the mesh (so no byte moves in or out of the caller's buffers any more) and answers the
// call at once; the blocked Gloo call ends at its own timeout on the engine's thread, which
// keeps Gloo's state alive and is not waited for (engine.cc). Until then the thread also keeps
// the call's Done, and with it the owners of the call's buffers (engine.h).
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>

#include "daemon/engine/host_engine.h"
#include "daemon/engine/factory.h"

namespace gradsync::gloo_engine {

inline constexpr size_t kBcubeBelowBytes = 256 << 10;

// Connects the full mesh through the job's peer service; blocks up to spec.timeout.
Status make_engine(const EngineSpec& spec, const GlooTransport& transport, std::unique_ptr<HostCollectiveEngine>* out);

// The same through any Gloo store (tests connect engines in one process with a HashStore);
// spec.rendezvous is not used.
Status make_engine(const EngineSpec& spec, const GlooTransport& transport, ::gloo::rendezvous::Store& store,
                   std::unique_ptr<HostCollectiveEngine>* out);

}  // namespace gradsync::gloo_engine
