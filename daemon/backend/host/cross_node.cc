#include "daemon/backend/host/cross_node.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <future>
#include <memory>

#include "daemon/backend/host/local.h"
#include "daemon/backend/host/masked.h"
#include "daemon/reduce/simd.h"
#include "daemon/reduce/staged.h"

namespace gradsync::host {
namespace {

using Piece = TensorPiece;

std::vector<Piece> pieces_of(const TensorSet& set, size_t bucket, size_t parts) {
  return tensor_pieces(set, bucket, parts);
}

// The header every node must agree on before a bucket crosses nodes.
struct Header {
  uint64_t seq = 0;
  uint32_t kind = 0;
  uint32_t set = 0;
  uint32_t bucket = 0;
  uint32_t reduce_op = 0;
  int32_t root = 0;
  uint32_t scaling = 0;
  double divisor = 0;
  uint64_t elements = 0;
  uint64_t slice_bytes = 0;  // the engine's: nodes that slice differently would make different calls
  uint32_t wire = 0;         // the wire compression's dtype (0: none); it changes the engine calls
  uint32_t health = 0;       // fused health asked: staged rather than in place on every node
  uint64_t integrity_every = 0;  // --integrity-check-every: nodes that differ make different calls
  uint64_t mask_digest = 0;      // a masked set's mask (TensorSet::mask_digest); 0 without one
};

Header header_of(const BucketCall& c, uint64_t integrity_every) {
  Header h;
  h.integrity_every = integrity_every;
  h.seq = c.seq;
  h.kind = static_cast<uint32_t>(c.desc.kind);
  h.set = c.desc.set_id;
  h.bucket = static_cast<uint32_t>(c.bucket);
  h.reduce_op = static_cast<uint32_t>(c.desc.reduce_op);
  h.root = c.desc.root;
  h.scaling = static_cast<uint32_t>(c.desc.scaling);
  h.divisor = c.desc.divisor;
  h.elements = c.set->reduced_elements(c.bucket);
  h.mask_digest = c.set->mask_digest;
  h.slice_bytes = c.engine->slice_bytes();
  h.wire = c.desc.wire == DType::kFloat32 ? 0 : static_cast<uint32_t>(c.desc.wire);
  h.health = c.desc.health ? 1 : 0;
  return h;
}

std::string describe(const Header& h) {
  OpDesc d;
  d.kind = static_cast<OpKind>(h.kind);
  d.set_id = h.set;
  d.reduce_op = static_cast<WireReduceOp>(h.reduce_op);
  d.root = h.root;
  d.scaling = static_cast<WireScaling>(h.scaling);
  d.divisor = h.divisor;
  if (h.wire != 0) d.wire = static_cast<DType>(h.wire);
  d.health = h.health != 0;
  return "operation " + std::to_string(h.seq) + " (" + describe(d) + ", bucket " + std::to_string(h.bucket) + ")";
}

bool same(const Header& a, const Header& b) {
  return a.seq == b.seq && a.kind == b.kind && a.set == b.set && a.bucket == b.bucket && a.reduce_op == b.reduce_op &&
         a.root == b.root && a.scaling == b.scaling && a.divisor == b.divisor && a.elements == b.elements &&
         a.slice_bytes == b.slice_bytes && a.wire == b.wire && a.health == b.health &&
         a.integrity_every == b.integrity_every && a.mask_digest == b.mask_digest;
}

// The node's index within the group's nodes, for a global rank.
int group_node_of(const Topology& t, const std::string& group, int rank) {
  const std::vector<int> nodes = t.nodes_of(group);
  return static_cast<int>(std::find(nodes.begin(), nodes.end(), rank / t.local_world_size) - nodes.begin());
}

// The call's timing fields, or nowhere when nobody asked.
std::chrono::nanoseconds* local_time(const BucketCall& c) { return c.timings ? &c.timings->local : nullptr; }
std::chrono::nanoseconds* collective_time(const BucketCall& c) {
  return c.timings ? &c.timings->collective : nullptr;
}

// What an engine call reads and writes lives in the node buffers (staged paths) or in the
// first participant's mapped memory (in place). The call's Done holds just that (engine.h), so
// that a library thread still inside a call that an abort answered early never writes into a
// mapping that was released, nor into buffers freed or reused by the next bucket; and a call
// blocked on a silent peer until Gloo's timeout pins no more than that.
using Regions = std::vector<std::shared_ptr<const MemoryRegion>>;

// Every region of the set that overlaps [begin, end): a run is contiguous in the daemon's
// address space, but its tensors may lie in several segments mapped side by side.
std::shared_ptr<const Regions> regions_overlapping(const TensorSet& set, const std::byte* begin, const std::byte* end) {
  auto found = std::make_shared<Regions>();
  for (const auto& region : set.regions) {
    if (region->base() < end && begin < region->base() + region->size()) found->push_back(region);
  }
  return found;
}

// The payload bytes this node hands to the engine's collectives for the bucket (what the job's
// cross_node_bytes counter adds up).
void count_carried(const BucketCall& c, uint64_t bytes) {
  if (c.timings) c.timings->carried_bytes += bytes;
}

// An engine call whose buffers live in the node buffers, timed as collective time; `bytes` is
// its payload.
Status timed_engine_call(const BucketCall& c, std::shared_ptr<NodeBuffers> buffers, uint64_t bytes,
                         const std::function<void(EngineDone)>& start) {
  count_carried(c, bytes);
  PhaseTimer timer(collective_time(c));
  return run_engine_call(start, std::move(buffers));
}

// The finishing stage's arguments: results of a bucket past the cache are streamed out.
reduce::KernelArgs fan_out_args(const BucketCall& c, uint64_t bucket_bytes) {
  reduce::KernelArgs args = c.args;
  args.stream_outputs = bucket_bytes >= kStreamResultsFromBytes;
  return args;
}

ReduceSpec spec_of(const reduce::KernelArgs& args) {
  return ReduceSpec{args.combine, args.dtype, args.wide_accumulate};
}

// One slice's engine allreduce, started now and timed as collective time from its start to its
// answer (on the engine's thread, overlapping the local work on the neighbouring slices).
// `owner`, what the slice lives in, rides in the Done (engine.h).
std::future<Status> carry_slice(const BucketCall& c, void* data, uint64_t count, size_t carried_size,
                                const ReduceSpec& spec, std::shared_ptr<const void> owner) {
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> answer = done->get_future();
  const auto started = std::chrono::steady_clock::now();
  std::chrono::nanoseconds* into = collective_time(c);
  count_carried(c, count * carried_size);
  c.engine->allreduce(data, count, spec, [done, started, into, owner = std::move(owner)](const Status& status) {
    if (into) *into += std::chrono::steady_clock::now() - started;
    done->set_value(status);
  });
  return answer;
}

// A bucket's pipeline over `slices` slices: while the engine carries slice k, the pool
// accumulates slice k + 1 and finishes slice k - 1.
template <class Accumulate, class Carry, class Finish>
Status run_pipeline(size_t slices, const Accumulate& accumulate, const Carry& carry, const Finish& finish) {
  if (slices == 0) return Status();
  accumulate(0);
  for (size_t k = 0; k < slices; ++k) {
    std::future<Status> answer = carry(k);
    if (k + 1 < slices) accumulate(k + 1);
    if (k > 0) finish(k - 1);
    if (Status s = answer.get(); !s.ok()) return s;
  }
  finish(slices - 1);
  return Status();
}

// The common case of a flat float32/float64/integer gradient buffer: the first participant's
// memory is the node buffer, so nothing is staged in the daemon. A bucket larger than the
// engine's slice_bytes() is cut into slices and pipelined: while the engine carries slice k
// between nodes (on its own thread), the pool accumulates slice k + 1 and finishes slice k - 1,
// so the network and memory stages overlap.

// Where a reduction left the node's reduced copy of the bucket, in canonical order: what the
// integrity check hashes.
struct Reduced {
  std::byte* data = nullptr;
  size_t bytes = 0;
};

Status allreduce_in_place(const BucketCall& c, ThreadPool& pool, Reduced* reduced) {
  const TensorSet& set = *c.set;
  const auto& members = set.participants[c.bucket];
  const BucketRun& run = set.runs[c.bucket][0];
  const size_t element = dtype_size(c.args.dtype);
  const uint64_t elements = set.bucket_elements[c.bucket];
  const uint64_t slice = std::max<uint64_t>(1, c.engine->slice_bytes() / element);
  const size_t slices = static_cast<size_t>((elements + slice - 1) / slice);
  std::byte* node_buffer = run.address[members[0]];
  *reduced = Reduced{node_buffer, elements * element};
  const ReduceSpec spec = spec_of(c.args);

  auto chunks_of = [&](size_t k, auto&& body) {
    const uint64_t first = k * slice, count = std::min(slice, elements - first);
    const uint64_t per = std::max<uint64_t>(kMinBytesPerTask / element, (count + pool.size() - 1) / pool.size());
    const size_t parts = static_cast<size_t>((count + per - 1) / per);
    pool.parallel_for(parts, [&](size_t i) {
      const uint64_t begin = first + i * per;
      body(begin, std::min(per, first + count - begin));
    });
  };
  // With one local participant the node buffer already holds the node's sum: accumulating is
  // a copy onto itself unless it applies the prescale, and finishing is one unless it divides.
  const bool lone = members.size() == 1;
  auto accumulate = [&](size_t k) {
    if (lone && c.args.scale != reduce::Scale::kBefore) return;
    PhaseTimer timer(local_time(c));
    chunks_of(k, [&](uint64_t first, uint64_t count) {
      std::vector<const void*> inputs;
      for (uint32_t m : members) inputs.push_back(run.address[m] + first * element);
      reduce::accumulate(c.args, inputs, node_buffer + first * element, count);
    });
  };
  const reduce::KernelArgs fan_out = fan_out_args(c, elements * element);
  auto finish = [&](size_t k) {
    if (lone && c.args.scale != reduce::Scale::kAfter) return;
    PhaseTimer timer(local_time(c));
    chunks_of(k, [&](uint64_t first, uint64_t count) {
      std::vector<void*> outputs;
      for (uint32_t m : members) outputs.push_back(run.address[m] + first * element);
      reduce::finish(fan_out, node_buffer + first * element, outputs, count);
    });
  };
  // The engine carries slice k on its own (persistent) thread while this one prepares the next.
  const std::shared_ptr<const void> pinned = regions_overlapping(set, node_buffer, node_buffer + elements * element);
  return run_pipeline(slices, accumulate, [&](size_t k) {
    const uint64_t first = k * slice;
    return carry_slice(c, node_buffer + first * element, std::min(slice, elements - first), element, spec, pinned);
  }, finish);
}

// Canonical range [first, first + count) of the bucket as pieces of its tensors, cut so that
// `threads` threads share them (none below kMinBytesPerTask unless the range is).
std::vector<Piece> pieces_in_range(const TensorSet& set, size_t bucket, uint64_t first, uint64_t count,
                                   size_t threads) {
  const size_t element = dtype_size(set.plan.buckets[bucket].dtype);
  const uint64_t per = std::max<uint64_t>(std::max<uint64_t>(1, kMinBytesPerTask / element),
                                          (count + threads - 1) / std::max<size_t>(threads, 1));
  std::vector<uint32_t> tensors = set.plan.buckets[bucket].tensors;
  std::sort(tensors.begin(), tensors.end());  // canonical order
  std::vector<Piece> pieces;
  for (uint32_t t : tensors) {
    const uint64_t begin = std::max(set.offset_in_bucket[t], first);
    const uint64_t end = std::min(set.offset_in_bucket[t] + set.layout[t].numel, first + count);
    for (uint64_t at = begin; at < end; at += per) {
      pieces.push_back({t, at - set.offset_in_bucket[t], std::min(per, end - at)});
    }
  }
  return pieces;
}

// The staged allreduce (a bucket that is not one canonical run in every client, a half-type
// one, or one compressed on the wire), pipelined as allreduce_in_place is: while the engine
// carries slice k of the node buffer (on its own thread), the pool accumulates slice k + 1
// into it (and narrows it for the wire) and finishes slice k - 1 into every member's tensors.
// The slices are the engine's slice_bytes of what it carries, as on every other node: a node
// that takes allreduce_in_place makes the same calls (only a dtype that accumulates in itself,
// uncompressed, takes it, and then the carried size is the element's).
Status allreduce_staged(const BucketCall& c, ThreadPool& pool, const std::shared_ptr<NodeBuffers>& buffers,
                        Reduced* reduced) {
  const TensorSet& set = *c.set;
  const auto& members = set.participants[c.bucket];
  const size_t acc_size = dtype_size(reduce::accumulation_dtype(c.args.dtype));
  const size_t element = dtype_size(c.args.dtype);
  const uint64_t elements = set.bucket_elements[c.bucket];
  // Wire compression: the engine carries the node's float32 sums as the half type, each hop
  // rounding its sum (docs/how-it-works.md bounds the error); they are widened back after.
  const bool compressed = c.desc.wire != DType::kFloat32;
  if (compressed && acc_size != sizeof(float)) {
    // check_op admits a wire dtype on float32, float16 and bfloat16 sets only, which all
    // accumulate in float32 (the stretches' scratch below is sized for it).
    return Status::internal("wire compression of a bucket that does not accumulate in float32");
  }
  ReduceSpec spec = spec_of(c.args);
  if (compressed) {
    spec.wire = c.desc.wire;
    buffers->wire.resize(elements * dtype_size(c.desc.wire));
  } else {
    buffers->work.resize(elements * acc_size);
  }
  std::byte* const acc = compressed ? nullptr : buffers->work.data();
  const size_t carried_size = compressed ? dtype_size(c.desc.wire) : acc_size;
  std::byte* const carried = compressed ? buffers->wire.data() : acc;
  // What the integrity check hashes: the carried copy, as it came back (every node of a
  // compressed operation compresses, so every node hashes the wire's bytes).
  *reduced = Reduced{carried, elements * carried_size};
  const uint64_t slice = std::max<uint64_t>(1, c.engine->slice_bytes() / carried_size);
  const size_t slices = static_cast<size_t>((elements + slice - 1) / slice);
  const reduce::KernelArgs fan_out = fan_out_args(c, elements * element);
  auto pieces_of_slice = [&](size_t k) {
    const uint64_t first = k * slice;
    return pieces_in_range(set, c.bucket, first, std::min(slice, elements - first), pool.size());
  };
  // Compressed, the float32 sums never need the node buffer: each task works through its piece
  // a cache-sized stretch at a time in a scratch of its own (accumulate, then narrow into the
  // wire; widen, then finish into the outputs), which saves writing and reading the sums in
  // memory twice. Uncompressed, the engine carries the sums themselves, in the node buffer.
  constexpr uint64_t kStretch = 4096;
  auto accumulate = [&](size_t k) {
    PhaseTimer timer(local_time(c));
    const std::vector<Piece> pieces = pieces_of_slice(k);
    pool.parallel_for(pieces.size(), [&](size_t i) {
      const Piece& p = pieces[i];
      const uint64_t at = set.offset_in_bucket[p.tensor] + p.first;
      std::vector<const void*> inputs(members.size());
      alignas(64) std::array<std::byte, kStretch * sizeof(float)> scratch;  // compressed: float32 sums
      const uint64_t step = compressed ? kStretch : p.count;
      for (uint64_t done = 0; done < p.count; done += step) {
        const uint64_t n = std::min(step, p.count - done);
        for (size_t m = 0; m < members.size(); ++m) {
          inputs[m] = set.address[members[m]][p.tensor] + (p.first + done) * element;
        }
        std::byte* const sums = compressed ? scratch.data() : acc + (at + done) * acc_size;
        reduce::accumulate(c.args, inputs, sums, n);
        if (compressed) reduce::simd::narrow(c.desc.wire, carried + (at + done) * carried_size, sums, n);
      }
    });
  };
  auto finish = [&](size_t k) {
    PhaseTimer timer(local_time(c));
    const std::vector<Piece> pieces = pieces_of_slice(k);
    pool.parallel_for(pieces.size(), [&](size_t i) {
      const Piece& p = pieces[i];
      const uint64_t at = set.offset_in_bucket[p.tensor] + p.first;
      std::vector<void*> outputs(members.size());
      alignas(64) std::array<std::byte, kStretch * sizeof(float)> scratch;  // compressed: float32 sums
      const uint64_t step = compressed ? kStretch : p.count;
      for (uint64_t done = 0; done < p.count; done += step) {
        const uint64_t n = std::min(step, p.count - done);
        for (size_t m = 0; m < members.size(); ++m) {
          outputs[m] = set.address[members[m]][p.tensor] + (p.first + done) * element;
        }
        const std::byte* sums = nullptr;
        if (compressed) {
          reduce::simd::widen(c.desc.wire, scratch.data(), carried + (at + done) * carried_size, n);
          sums = scratch.data();
        } else {
          sums = acc + (at + done) * acc_size;
        }
        reduce::finish(fan_out, sums, outputs, n);
      }
    });
  };
  return run_pipeline(slices, accumulate, [&](size_t k) {
    const uint64_t first = k * slice;
    return carry_slice(c, carried + first * carried_size, std::min(slice, elements - first), carried_size, spec,
                       buffers);
  }, finish);
}

// Where a reduction's results go: every participant's tensors (allreduce), the root's (reduce),
// or each participant's shard output (reduce-scatter).
enum class Results { kEveryone, kRoot, kShards };

// Reduce-scatter crosses nodes as the engine's reduce_scatter where the bucket's node parts are
// even enough (node_parts_even): each node's stretch of the bucket (node_parts: its ranks'
// shards) goes only to that node, half the bytes of an allreduce. Other buckets, and a checked
// one (so that every node holds the whole reduced bucket to hash), cross as an allreduce. Each
// node finishes just its ranks' shards.
// `checked`: the integrity check hashes this operation's reduced copy. It is then staged on
// every node, so that every node hashes the same stage (the carried sums, before any divide):
// in place, the node buffer is the clients' memory, which the finish overwrites with the
// averages, while the staged copy keeps the sums. Nodes choose in place by their own memory
// layout, so two nodes of one job may differ.
Status reduce_across(const BucketCall& c, ThreadPool& pool, const std::shared_ptr<NodeBuffers>& buffers,
                     Results results, bool checked, Reduced* reduced) {
  const TensorSet& set = *c.set;
  const bool to_root = results == Results::kRoot;
  // In place, the clients' memory holds the node's partial sums: only an allreduce, which then
  // overwrites all of it, may work there.
  // The fused health is computed tensor by tensor (reduce/health.h), which the in-place path's
  // slices are not, and wire compression needs a buffer of its own: with either, the bucket is
  // staged (the engine calls are the same).
  // A masked set's kept elements are gathered into the node buffer (masked.h), never in place.
  const bool compressed = c.desc.wire != DType::kFloat32;
  const bool masked = set.masked();
  if (results == Results::kEveryone && set.canonical_run[c.bucket] && !c.health && !compressed && !masked &&
      !checked && reduce::accumulation_dtype(c.args.dtype) == c.args.dtype) {
    return allreduce_in_place(c, pool, reduced);
  }
  if (results == Results::kEveryone && !c.health && !masked) return allreduce_staged(c, pool, buffers, reduced);
  const auto& members = set.participants[c.bucket];
  const DType acc_type = reduce::accumulation_dtype(c.args.dtype);
  const size_t acc_size = dtype_size(acc_type);
  const size_t element = dtype_size(c.args.dtype);
  const uint64_t elements = set.reduced_elements(c.bucket);
  buffers->work.resize(elements * acc_size);
  std::byte* acc = buffers->work.data();
  *reduced = Reduced{acc, elements * acc_size};
  const std::vector<Piece> pieces = masked ? std::vector<Piece>{} : pieces_of(set, c.bucket, pool.size());
  if (masked) {
    PhaseTimer timer(local_time(c));
    masked_accumulate(set, c.bucket, c.args, acc, pool);
  } else {
    PhaseTimer timer(local_time(c));
    pool.parallel_for(pieces.size(), [&](size_t i) {
      const Piece& p = pieces[i];
      std::vector<const void*> inputs;
      for (uint32_t m : members) inputs.push_back(set.address[m][p.tensor] + p.first * element);
      reduce::accumulate(c.args, inputs, acc + (set.offset_in_bucket[p.tensor] + p.first) * acc_size, p.count);
    });
  }
  ReduceSpec spec = spec_of(c.args);
  const std::string& group = set.plan.buckets[c.bucket].group;
  Status status;
  int root_local = -1;
  // Wire compression: the engine carries the node's float32 sums as the half type, each hop
  // rounding its sum (docs/how-it-works.md bounds the error); they are widened back after.
  std::byte* wire = nullptr;
  if (compressed) {
    spec.wire = c.desc.wire;
    buffers->wire.resize(elements * dtype_size(c.desc.wire));
    wire = buffers->wire.data();
  }
  const size_t wire_size = compressed ? dtype_size(c.desc.wire) : acc_size;
  auto carried = [&](uint64_t first) { return compressed ? wire + first * wire_size : acc + first * acc_size; };
  auto to_wire = [&](uint64_t first, uint64_t count) {
    if (compressed) reduce::simd::narrow(c.desc.wire, carried(first), acc + first * acc_size, count);
  };
  auto from_wire = [&](uint64_t first, uint64_t count) {
    if (compressed) reduce::simd::widen(c.desc.wire, acc + first * acc_size, carried(first), count);
  };
  // A reduce-scatter's parts per node, from the layout every node checked (so every node makes
  // the same choice below).
  const std::vector<uint64_t> parts_of_bucket =
      results == Results::kShards ? node_parts(set, c.bucket, *c.topology) : std::vector<uint64_t>{};
  if (to_root) {
    const int root = c.desc.root;
    const int root_node = group_node_of(*c.topology, group, root);
    to_wire(0, elements);
    // A masked bucket may keep nothing (every node agrees: the header carries the mask).
    if (elements > 0) {
      status = timed_engine_call(c, buffers, elements * wire_size, [&](EngineDone done) {
        c.engine->reduce(carried(0), elements, spec, root_node, std::move(done));
      });
    }
    if (root / c.topology->local_world_size == c.topology->node) root_local = root % c.topology->local_world_size;
    if (status.ok() && root_local >= 0) from_wire(0, elements);
  } else if (results == Results::kShards && !checked && node_parts_even(parts_of_bucket)) {
    // One call for the whole bucket: no node works in place for a reduce-scatter, so there is
    // no other node's slicing to match, and each node's combine runs as its part arrives.
    const std::vector<uint64_t>& parts = parts_of_bucket;
    const size_t me = static_cast<size_t>(c.engine->node());
    uint64_t own_first = 0;
    for (size_t n = 0; n < me; ++n) own_first += parts[n];
    to_wire(0, elements);
    if (elements > 0) {
      status = timed_engine_call(c, buffers, elements * wire_size, [&](EngineDone done) {
        c.engine->reduce_scatter(carried(0), parts, spec, std::move(done));
      });
    }
    if (status.ok()) from_wire(own_first, parts[me]);
  } else if (compressed) {
    // Every node compresses, so every node slices alike: by the wire's bytes.
    const uint64_t slice = std::max<uint64_t>(1, c.engine->slice_bytes() / wire_size);
    for (uint64_t first = 0; first < elements && status.ok(); first += slice) {
      const uint64_t count = std::min(slice, elements - first);
      to_wire(first, count);
      status = timed_engine_call(c, buffers, count * wire_size, [&](EngineDone done) {
        c.engine->allreduce(carried(first), count, spec, std::move(done));
      });
      if (status.ok()) from_wire(first, count);
    }
  } else {
    // A reduce (every node here), a reduce-scatter not sent as parts or that the integrity
    // check hashes, or an allreduce with health or a mask (every node here too, as the header
    // says): a dtype that accumulates in itself in slice_bytes slices, the half types in one
    // call.
    const uint64_t slice = acc_type == c.args.dtype ? std::max<uint64_t>(1, c.engine->slice_bytes() / acc_size) : elements;
    for (uint64_t first = 0; first < elements && status.ok(); first += slice) {
      const uint64_t count = std::min(slice, elements - first);
      status = timed_engine_call(c, buffers, count * acc_size, [&](EngineDone done) {
        c.engine->allreduce(acc + first * acc_size, count, spec, std::move(done));
      });
    }
  }
  if (!status.ok()) return status;
  if (to_root && root_local < 0) return Status();
  const reduce::KernelArgs fan_out = fan_out_args(c, elements * element);
  PhaseTimer timer(local_time(c));
  if (masked) {
    const std::vector<uint32_t> destinations =
        to_root ? std::vector<uint32_t>{static_cast<uint32_t>(root_local)} : members;
    masked_finish(set, c.bucket, fan_out, acc, destinations, pool,
                  c.health && results == Results::kEveryone ? c.health->data() : nullptr);
    return Status();
  }
  if (results == Results::kShards) {
    const std::vector<ShardTask> tasks = shard_tasks(set, c.bucket, pool.size());
    pool.parallel_for(tasks.size(), [&](size_t i) {
      const ShardPiece& p = tasks[i].piece;
      void* output = set.shard_output[tasks[i].owner] + p.at * element;
      reduce::finish(fan_out, acc + (set.offset_in_bucket[p.tensor] + p.first) * acc_size,
                     std::span<void* const>(&output, 1), p.count);
    });
    return Status();
  }
  pool.parallel_for(pieces.size(), [&](size_t i) {
    const Piece& p = pieces[i];
    std::vector<void*> outputs;
    if (to_root) {
      outputs.push_back(set.address[static_cast<size_t>(root_local)][p.tensor] + p.first * element);
    } else {
      for (uint32_t m : members) outputs.push_back(set.address[m][p.tensor] + p.first * element);
    }
    reduce::KernelArgs piece = fan_out;
    if (c.health && results == Results::kEveryone) {
      piece.health = c.health->data() + set.health_block[p.tensor] + p.first / reduce::kHealthBlockElements;
    }
    reduce::finish(piece, acc + (set.offset_in_bucket[p.tensor] + p.first) * acc_size, outputs, p.count);
  });
  return Status();
}

Status broadcast(const BucketCall& c, const std::shared_ptr<NodeBuffers>& buffers) {
  const TensorSet& set = *c.set;
  const plan::Bucket& bucket = set.plan.buckets[c.bucket];
  const size_t element = dtype_size(bucket.dtype);
  const uint64_t bytes = set.bucket_elements[c.bucket] * element;
  const int root = c.desc.root;
  const bool root_here = root / c.topology->local_world_size == c.topology->node;
  const uint32_t root_local = static_cast<uint32_t>(root % c.topology->local_world_size);
  buffers->work.resize(bytes);
  std::byte* buffer = buffers->work.data();
  if (root_here) {
    PhaseTimer timer(local_time(c));
    for (uint32_t t : bucket.tensors) {
      std::memcpy(buffer + set.offset_in_bucket[t] * element, set.address[root_local][t], set.layout[t].numel * element);
    }
  }
  const int root_node = group_node_of(*c.topology, bucket.group, root);
  if (Status s = timed_engine_call(c, buffers, bytes,
                                   [&](EngineDone done) { c.engine->broadcast(buffer, bytes, root_node, std::move(done)); });
      !s.ok()) {
    return s;
  }
  PhaseTimer timer(local_time(c));
  for (uint32_t m : set.participants[c.bucket]) {
    if (root_here && m == root_local) continue;
    for (uint32_t t : bucket.tensors) {
      std::memcpy(set.address[m][t], buffer + set.offset_in_bucket[t] * element, set.layout[t].numel * element);
    }
  }
  return Status();
}

Status allgather(const BucketCall& c, const std::shared_ptr<NodeBuffers>& owned) {
  NodeBuffers& buffers = *owned;
  const TensorSet& set = *c.set;
  const Topology& topo = *c.topology;
  const plan::Bucket& bucket = set.plan.buckets[c.bucket];
  const size_t element = dtype_size(bucket.dtype);
  const uint64_t bytes = set.bucket_elements[c.bucket] * element;
  const auto& members = set.participants[c.bucket];
  const std::vector<int> nodes = topo.nodes_of(bucket.group);
  // Gloo's allgather needs the same contribution from every node.
  for (int n : nodes) {
    size_t count = 0;
    for (int r : topo.ranks(bucket.group)) count += r / topo.local_world_size == n;
    if (count != members.size()) {
      return Status::not_supported("allgather over group '" + bucket.group +
                                   "' needs the same number of its ranks on every node");
    }
  }
  buffers.work.resize(members.size() * bytes);
  buffers.gathered.resize(nodes.size() * members.size() * bytes);
  {
    PhaseTimer timer(local_time(c));
    for (size_t k = 0; k < members.size(); ++k) {
      for (uint32_t t : bucket.tensors) {
        std::memcpy(buffers.work.data() + k * bytes + set.offset_in_bucket[t] * element, set.address[members[k]][t],
                    set.layout[t].numel * element);
      }
  }
  }
  if (Status s = timed_engine_call(c, owned, members.size() * bytes, [&](EngineDone done) {
        c.engine->allgather(buffers.work.data(), members.size() * bytes, buffers.gathered.data(), std::move(done));
      });
      !s.ok()) {
    return s;
  }
  PhaseTimer timer(local_time(c));
  for (size_t n = 0; n < nodes.size(); ++n) {
    std::vector<int> ranks;
    for (int r : topo.ranks(bucket.group)) {
      if (r / topo.local_world_size == nodes[n]) ranks.push_back(r);
    }
    for (size_t k = 0; k < ranks.size(); ++k) {
      const std::byte* source = buffers.gathered.data() + (n * members.size() + k) * bytes;
      for (uint32_t dest : members) {
        for (uint32_t t : bucket.tensors) {
          std::memcpy(set.gather_output[dest] + static_cast<uint64_t>(ranks[k]) * set.packed_bytes + set.packed_offset[t],
                      source + set.offset_in_bucket[t] * element, set.layout[t].numel * element);
        }
      }
    }
  }
  return Status();
}

}  // namespace

Status check_sequence(const BucketCall& c, uint64_t integrity_every) {
  // On the heap and held by the call's Done, like a bucket's buffers (engine.h).
  struct Exchange {
    Header mine;
    std::vector<Header> all;
  };
  auto exchange = std::make_shared<Exchange>(
      Exchange{header_of(c, integrity_every), std::vector<Header>(static_cast<size_t>(c.engine->nodes()))});
  const Header& mine = exchange->mine;
  const std::vector<Header>& all = exchange->all;
  if (Status s = run_engine_call(
          [&](EngineDone done) {
            c.engine->allgather(&exchange->mine, sizeof(Header), exchange->all.data(), std::move(done));
          },
          exchange);
      !s.ok()) {
    return s;
  }
  const std::vector<int> nodes = c.topology->nodes_of(c.set->plan.buckets[c.bucket].group);
  for (size_t n = 0; n < all.size(); ++n) {
    if (all[n].slice_bytes != mine.slice_bytes) {
      return Status::layout_mismatch("node " + std::to_string(c.topology->node) + " runs with --gloo-slice-bytes " +
                                      std::to_string(mine.slice_bytes) + ", node " + std::to_string(nodes[n]) +
                                      " with " + std::to_string(all[n].slice_bytes) +
                                      ": every node of a job must use the same");
    }
    if (all[n].integrity_every != mine.integrity_every) {
      return Status::layout_mismatch("node " + std::to_string(c.topology->node) + " runs with --integrity-check-every " +
                                     std::to_string(mine.integrity_every) + ", node " + std::to_string(nodes[n]) +
                                     " with " + std::to_string(all[n].integrity_every) +
                                     ": every node of a job must use the same");
    }
    if (!same(all[n], mine)) {
      return Status::layout_mismatch("sequence mismatch: node " + std::to_string(c.topology->node) + " is at " +
                                     describe(mine) + ", node " + std::to_string(nodes[n]) + " is at " +
                                     describe(all[n]));
    }
  }
  return Status();
}

namespace {

// The sample the integrity check hashes: all of the bytes up to 64 KiB, else 256 stretches of
// 256 bytes spread evenly, shifted by an amount drawn from the operation's sequence number, so
// that successive checks look at different bytes (every node draws the same).
constexpr size_t kStretch = 256, kStretches = 256;

// Stretch k starts at k * sample_step(bytes) + sample_shift(bytes, seq); the shift is below the
// gap between stretches, so the last one ends inside the bytes.
size_t sample_step(size_t bytes) { return (bytes - kStretch) / kStretches; }

size_t sample_shift(size_t bytes, uint64_t seq) {
  if (bytes <= kStretch * kStretches) return 0;
  const size_t step = sample_step(bytes);
  const size_t room = step >= kStretch ? step - kStretch + 1 : 1;
  return static_cast<size_t>((seq * 2654435761ull) % room);
}

// A 64-bit FNV-1a hash of that sample.
uint64_t sample_hash(const std::byte* data, size_t bytes, uint64_t seq) {
  uint64_t hash = 14695981039346656037ull;
  const auto add = [&](const std::byte* from, size_t count) {
    for (size_t i = 0; i < count; ++i) hash = (hash ^ static_cast<uint8_t>(from[i])) * 1099511628211ull;
  };
  if (bytes <= kStretch * kStretches) {
    add(data, bytes);
    return hash;
  }
  const size_t shift = sample_shift(bytes, seq);
  for (size_t k = 0; k < kStretches; ++k) add(data + k * sample_step(bytes) + shift, kStretch);
  return hash;
}

// The integrity check (executor.h): the group's nodes allgather their hashes of the reduced
// bucket; every node sees the same table and reaches the same verdict.
Status compare_results(const BucketCall& c, const std::byte* data, size_t bytes) {
  struct Digest {
    uint64_t seq = 0;
    uint64_t hash = 0;
    uint64_t bucket = 0;
  };
  struct Exchange {
    Digest mine;
    std::vector<Digest> all;
  };
  auto exchange = std::make_shared<Exchange>(
      Exchange{Digest{c.seq, sample_hash(data, bytes, c.seq), c.bucket},
               std::vector<Digest>(static_cast<size_t>(c.engine->nodes()))});
  if (Status s = run_engine_call(
          [&](EngineDone done) {
            c.engine->allgather(&exchange->mine, sizeof(Digest), exchange->all.data(), std::move(done));
          },
          exchange);
      !s.ok()) {
    return s;
  }
  const std::vector<int> nodes = c.topology->nodes_of(c.set->plan.buckets[c.bucket].group);
  std::map<uint64_t, std::vector<int>> by_hash;
  for (size_t n = 0; n < exchange->all.size(); ++n) by_hash[exchange->all[n].hash].push_back(nodes[n]);
  if (by_hash.size() == 1) return Status();
  const auto list = [](const std::vector<int>& ns) {
    std::string text;
    for (size_t i = 0; i < ns.size(); ++i) text += (i ? (i + 1 == ns.size() ? " and " : ", ") : "") + std::to_string(ns[i]);
    return text;
  };
  const std::string what = "silent data corruption: operation " + std::to_string(c.seq) + " (" +
                           describe(c.desc, c.set.get()) + "), bucket " + std::to_string(c.bucket) + ": ";
  const std::string after = " (--integrity-check-every compares a sample of every node's copy); the job is failed "
                            "rather than train on it";
  // The largest agreeing group is taken for the right result; where two groups tie for it (two
  // nodes always do), which copy is wrong cannot be told, and no node is blamed.
  auto majority = by_hash.begin();
  bool tied = false;
  for (auto it = std::next(by_hash.begin()); it != by_hash.end(); ++it) {
    if (it->second.size() > majority->second.size()) {
      majority = it;
      tied = false;
    } else if (it->second.size() == majority->second.size()) {
      tied = true;
    }
  }
  if (tied) {
    std::vector<int> all = nodes;
    std::sort(all.begin(), all.end());
    std::string groups;
    for (const auto& [hash, ns] : by_hash) {
      std::string members;
      for (int n : ns) members += (members.empty() ? "" : ", ") + std::to_string(n);
      groups += (groups.empty() ? "[" : " [") + members + "]";
    }
    return Status::internal(what + "nodes " + list(all) + " reduced it to different bytes (nodes with the same copy: " +
                            groups + "), and no majority tells which copy is wrong" + after +
                            ": check every one of those nodes' memory and CPUs" +
                            (all.size() == 2 ? " (with 3 or more nodes the check names the odd one out)" : ""));
  }
  std::vector<int> odd;
  for (const auto& [hash, ns] : by_hash) {
    if (hash != majority->first) odd.insert(odd.end(), ns.begin(), ns.end());
  }
  std::sort(odd.begin(), odd.end());
  return Status::internal(what + "node" + (odd.size() > 1 ? "s " : " ") + list(odd) +
                          " reduced it to different bytes than node" + (majority->second.size() > 1 ? "s " : " ") +
                          list(majority->second) + after + ": check those nodes' memory and CPUs");
}

}  // namespace

Status execute_across_nodes(const BucketCall& c, ThreadPool& pool, std::shared_ptr<NodeBuffers>& buffers,
                            const IntegrityCheck& integrity) {
  // Only engine calls share the buffers, and only release them: a count above one means a call
  // answered early still holds them, and may still write into them. Seeing one, the fence
  // orders that call's last writes (before its release of the count) before this bucket's use.
  if (!buffers || buffers.use_count() > 1) buffers = std::make_shared<NodeBuffers>();
  std::atomic_thread_fence(std::memory_order_acquire);
  switch (c.desc.kind) {
    case OpKind::kAllreduce:
    case OpKind::kReduceScatter: {
      Reduced reduced;
      const bool checked = integrity.every != 0 && c.seq % integrity.every == 0;
      const Status status = reduce_across(
          c, pool, buffers, c.desc.kind == OpKind::kAllreduce ? Results::kEveryone : Results::kShards, checked,
          &reduced);
      if (!status.ok() || !checked) return status;
      // The test hook flips a byte the sample looks at (a sample misses what it does not touch).
      if (integrity.corrupt_at_seq == c.seq && reduced.bytes > 0) {
        reduced.data[sample_shift(reduced.bytes, c.seq)] ^= std::byte{0x40};
      }
      return compare_results(c, reduced.data, reduced.bytes);
    }
    case OpKind::kReduce: {
      Reduced reduced;
      return reduce_across(c, pool, buffers, Results::kRoot, false, &reduced);
    }
    case OpKind::kBroadcast: return broadcast(c, buffers);
    case OpKind::kAllgather: return allgather(c, buffers);
  }
  return Status::internal("unknown operation kind");
}

}  // namespace gradsync::host
