// The C API (gradsync/c_api.h) over the C++ client: handles own the C++ objects, every call
// catches what the client throws and turns it into a status plus a thread-local message.
#include "gradsync/c_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "gradsync/client.h"
#include "shared/version.h"

struct gs_client {
  std::unique_ptr<gradsync::Client> client;
  // What gs_alloc handed out: tensors are found in these by address.
  struct Allocation {
    std::byte* base = nullptr;
    uint64_t bytes = 0;
    uint32_t segment = 0;
    int device = -1;
  };
  std::vector<Allocation> allocations;
};

struct gs_set {
  gradsync::TensorSet set;
};

struct gs_work {
  gradsync::Work work;
};

namespace {

using gradsync::Error;
using gradsync::Status;

thread_local std::string last_error;

gs_status fail(const Status& status) {
  last_error = status.message();
  return static_cast<gs_status>(status.code());
}

// Runs `body`, turning what it throws into a status.
template <class F>
gs_status guarded(F&& body) {
  try {
    body();
    return GS_OK;
  } catch (const Error& e) {
    return fail(e.status());
  } catch (const std::bad_alloc&) {
    return fail(Status(gradsync::ErrorCode::kResourceExhausted, "out of memory in the gradsync client"));
  } catch (const std::exception& e) {
    return fail(Status::internal(e.what()));
  }
}

gs_status null_argument(const char* what) { return fail(Status::invalid_argument(std::string(what) + " is NULL")); }

std::string text(const char* s) { return s ? s : ""; }

gradsync::ReduceOptions reduce_options(const gs_reduce_options* o) {
  gradsync::ReduceOptions options;
  if (!o) return options;
  if (o->op < GS_SUM || o->op > GS_MAX) {
    throw Error(Status::invalid_argument("op must be sum, avg, min or max, not " + std::to_string(o->op)));
  }
  static constexpr gradsync::ReduceOp kOps[] = {gradsync::ReduceOp::kSum, gradsync::ReduceOp::kAvg,
                                                gradsync::ReduceOp::kMin, gradsync::ReduceOp::kMax};
  options.op = kOps[o->op];
  options.scaling = o->prescale ? gradsync::Scaling::kBefore : gradsync::Scaling::kAfter;
  options.divisor = o->divisor;
  options.fp32_accumulate = o->fp32_accumulate != 0;
  return options;
}

// A versioned struct (`size` first) from a caller built against a newer header may carry fields
// this library does not know: refused when any of them is set, rather than silently ignored (a
// mask or an option dropped would change results without a word).
template <class T>
Status unknown_fields(const T* given, const char* name) {
  if (given->size <= sizeof(T)) return Status::ok_status();
  const auto* bytes = reinterpret_cast<const unsigned char*>(given);
  for (size_t i = sizeof(T); i < given->size; ++i) {
    if (bytes[i] != 0) {
      return Status::not_supported(std::string(name) + " sets fields past the " + std::to_string(sizeof(T)) +
                                   " bytes this gradsync library (" + gradsync::kGradsyncVersion +
                                   ") knows; use a library at least as new as the header");
    }
  }
  return Status::ok_status();
}

// gs_reduce_options and, when given, what gs_op_options adds (fields past its size: defaults).
gradsync::ReduceOptions reduce_options(const gs_reduce_options* o, const gs_op_options* given) {
  gradsync::ReduceOptions options = reduce_options(o);
  if (!given) return options;
  if (given->size < sizeof(uint32_t)) throw Error(Status::invalid_argument("gs_op_options.size is not set"));
  if (Status s = unknown_fields(given, "gs_op_options"); !s.ok()) throw Error(s);
  gs_op_options extra{};
  std::memcpy(&extra, given, std::min<size_t>(given->size, sizeof(extra)));
  options.health = extra.health != 0;
  if (extra.wire_dtype == GS_BFLOAT16) {
    options.wire_dtype = gradsync::DType::kBFloat16;
  } else if (extra.wire_dtype == GS_FLOAT16) {
    options.wire_dtype = gradsync::DType::kFloat16;
  } else if (extra.wire_dtype != 0) {
    throw Error(Status::invalid_argument("gs_op_options.wire_dtype must be 0, GS_BFLOAT16 or GS_FLOAT16, not " +
                                         std::to_string(extra.wire_dtype)));
  }
  return options;
}

// The SharedTensor for a C tensor: it must lie inside one of the client's allocations.
gradsync::SharedTensor shared_tensor(const gs_client& c, const gs_tensor& t, size_t index) {
  const auto dtype = gradsync::dtype_from_raw(static_cast<uint32_t>(t.dtype));
  if (!dtype) {
    throw Error(Status::invalid_argument("tensor " + std::to_string(index) + ": unknown dtype " +
                                         std::to_string(t.dtype)));
  }
  const auto* at = static_cast<const std::byte*>(t.data);
  if (t.numel == 0 || t.numel > UINT64_MAX / gradsync::dtype_size(*dtype)) {
    throw Error(Status::invalid_argument("tensor " + std::to_string(index) + ": " + std::to_string(t.numel) +
                                         " elements is not a size"));
  }
  const uint64_t bytes = t.numel * gradsync::dtype_size(*dtype);
  for (const auto& a : c.allocations) {
    if (at < a.base || at >= a.base + a.bytes) continue;
    const auto offset = static_cast<uint64_t>(at - a.base);
    if (bytes > a.bytes - offset) {
      throw Error(Status::invalid_argument("tensor " + std::to_string(index) + ": its " + std::to_string(bytes) +
                                           " bytes run past the end of its gradsync allocation"));
    }
    if (t.device != a.device) {
      throw Error(Status::invalid_argument(
          "tensor " + std::to_string(index) + " says device " + std::to_string(t.device) +
          " but lies in an allocation on " + (a.device < 0 ? "the host" : "device " + std::to_string(a.device))));
    }
    return gradsync::SharedTensor(*dtype, t.numel, t.group && *t.group ? t.group : "dp", const_cast<std::byte*>(at),
                                  a.segment, offset, a.device);
  }
  throw Error(Status::invalid_argument("tensor " + std::to_string(index) +
                                       " is not in memory gradsync allocated (gs_alloc); the daemon cannot reach it"));
}

gs_status new_work(gradsync::Work work, gs_work** out) {
  *out = new gs_work{std::move(work)};
  return GS_OK;
}

}  // namespace

extern "C" {

int gs_c_api_version(void) { return GS_C_API_VERSION; }

const char* gs_last_error(void) { return last_error.c_str(); }

gs_status gs_connect(const char* socket_path, const char* client_name, int64_t request_timeout_ms, gs_client** out) {
  if (!out) return null_argument("out");
  *out = nullptr;
  return guarded([&] {
    gradsync::ConnectOptions options;
    options.socket_path = text(socket_path);
    if (client_name && *client_name) options.client_name = client_name;
    if (request_timeout_ms > 0) options.request_timeout = std::chrono::milliseconds(request_timeout_ms);
    auto client = std::make_unique<gs_client>();
    client->client = gradsync::Client::connect(options);
    *out = client.release();
  });
}

void gs_client_close(gs_client* client) { delete client; }

gs_status gs_client_abort(gs_client* client, const char* why) {
  if (!client) return null_argument("client");
  return guarded([&] { client->client->abort(text(why)); });
}

gs_status gs_join(gs_client* client, const char* job, int32_t rank, int32_t world_size, int32_t local_rank,
                  int32_t local_world_size, int64_t timeout_ms, const char* rendezvous, const gs_group* groups,
                  size_t group_count) {
  if (!client) return null_argument("client");
  if (group_count && !groups) return null_argument("groups");
  return guarded([&] {
    gradsync::JoinOptions options;
    options.job_id = text(job);
    options.rank = rank;
    options.world_size = world_size;
    options.local_rank = local_rank;
    options.local_world_size = local_world_size;
    options.timeout = std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms));
    options.rendezvous = text(rendezvous);
    for (size_t g = 0; g < group_count; ++g) {
      gradsync::GroupSpec spec;
      spec.name = text(groups[g].name);
      if (groups[g].count && !groups[g].ranks) throw Error(Status::invalid_argument("group " + spec.name + ": ranks is NULL"));
      spec.ranks.assign(groups[g].ranks, groups[g].ranks + groups[g].count);
      options.groups.push_back(std::move(spec));
    }
    client->client->join(options);
  });
}

int64_t gs_job_timeout_ms(const gs_client* client) {
  return client ? client->client->job_timeout().count() : 0;
}

gs_status gs_alloc(gs_client* client, uint64_t bytes, int32_t device, void** data) {
  if (!client) return null_argument("client");
  if (!data) return null_argument("data");
  return guarded([&] {
    if (bytes == 0) throw Error(Status::invalid_argument("gs_alloc of 0 bytes"));
    const gradsync::TensorSpec spec{gradsync::DType::kUInt8, bytes, "dp"};
    const std::vector<gradsync::SharedTensor> made =
        device < 0 ? client->client->allocate_flat(std::span(&spec, 1))
                   : client->client->allocate_device_flat(std::span(&spec, 1), device);
    const gradsync::SharedTensor& t = made.front();
    client->allocations.push_back({t.data(), bytes, t.segment_id(), t.device()});
    *data = t.data();
  });
}

gs_status gs_free(gs_client* client, void* data) {
  if (!client) return null_argument("client");
  return guarded([&] {
    auto found = std::find_if(client->allocations.begin(), client->allocations.end(),
                              [&](const gs_client::Allocation& a) { return a.base == data; });
    if (found == client->allocations.end()) {
      throw Error(Status::invalid_argument("gs_free: the address is not the start of memory gs_alloc returned (or "
                                           "it was freed already)"));
    }
    client->client->free_memory(gradsync::SharedTensor(gradsync::DType::kUInt8, found->bytes, "dp", found->base,
                                                       found->segment, 0, found->device));
    client->allocations.erase(found);
  });
}

gs_status gs_register(gs_client* client, const gs_tensor* tensors, size_t count, int64_t bucket_cap_bytes,
                      int32_t allgather, gs_set** out) {
  return gs_register_labeled(client, tensors, count, bucket_cap_bytes, allgather, nullptr, out);
}

gs_status gs_register_labeled(gs_client* client, const gs_tensor* tensors, size_t count, int64_t bucket_cap_bytes,
                              int32_t allgather, const char* label, gs_set** out) {
  gs_register_options options{};
  options.size = sizeof(options);
  options.bucket_cap_bytes = bucket_cap_bytes;
  options.allgather = allgather;
  options.label = label;
  return gs_register_ex(client, tensors, count, &options, out);
}

gs_status gs_register_ex(gs_client* client, const gs_tensor* tensors, size_t count, const gs_register_options* given,
                         gs_set** out) {
  if (!client) return null_argument("client");
  if (!out) return null_argument("out");
  if (count && !tensors) return null_argument("tensors");
  *out = nullptr;
  // Fields the caller's struct does not reach keep their defaults.
  gs_register_options options{};
  options.size = sizeof(options);
  options.bucket_cap_bytes = -1;
  if (given) {
    if (given->size < sizeof(uint32_t)) return fail(Status::invalid_argument("gs_register_options.size is not set"));
    if (Status s = unknown_fields(given, "gs_register_options"); !s.ok()) return fail(s);
    std::memcpy(&options, given, std::min<size_t>(given->size, sizeof(options)));
  }
  return guarded([&] {
    std::vector<gradsync::SharedTensor> shared;
    shared.reserve(count);
    for (size_t i = 0; i < count; ++i) shared.push_back(shared_tensor(*client, tensors[i], i));
    gradsync::RegisterOptions register_options;
    if (options.bucket_cap_bytes >= 0) register_options.bucket_cap_bytes = static_cast<uint64_t>(options.bucket_cap_bytes);
    register_options.allgather = options.allgather != 0;
    register_options.reduce_scatter = options.reduce_scatter != 0;
    if (options.label) register_options.label = options.label;
    if (options.mask_count > 0) {
      if (!options.mask) throw gradsync::Error(Status::invalid_argument("gs_register_options.mask is NULL"));
      register_options.mask.assign(options.mask, options.mask + options.mask_count);
    }
    auto set = std::make_unique<gs_set>();
    set->set = client->client->register_tensors(shared, register_options);
    *out = set.release();
  });
}

void gs_set_free(gs_set* set) { delete set; }

gs_status gs_set_release(gs_client* client, gs_set* set) {
  if (!client) return null_argument("client");
  if (!set) return null_argument("set");
  return guarded([&] { client->client->release(set->set); });
}

uint32_t gs_set_id(const gs_set* set) { return set ? set->set.id() : 0; }

size_t gs_set_buckets(const gs_set* set) { return set ? set->set.buckets().size() : 0; }

gs_status gs_set_gathered(const gs_set* set, int32_t rank, size_t index, void** data) {
  if (!set) return null_argument("set");
  if (!data) return null_argument("data");
  return guarded([&] { *data = set->set.gathered(rank, index).data(); });
}

gs_status gs_set_shard(const gs_set* set, void** data, uint64_t* first, uint64_t* count) {
  if (!set || !data || !first || !count) return null_argument(!set ? "set" : !data ? "data" : !first ? "first" : "count");
  return guarded([&] {
    const gradsync::SharedTensor shard = set->set.shard();
    *data = shard.data();
    *first = set->set.shard_first();
    *count = shard.numel();
  });
}

gs_status gs_set_stream(gs_client* client, void* stream) {
  if (!client) return null_argument("client");
  return guarded([&] { client->client->set_stream(stream); });
}

gs_status gs_allreduce(gs_client* client, const gs_set* set, const gs_reduce_options* options, gs_work** out) {
  if (!client || !set || !out) return null_argument(!client ? "client" : !set ? "set" : "out");
  return guarded([&] { new_work(client->client->allreduce(set->set, reduce_options(options)), out); });
}

gs_status gs_allreduce_ex(gs_client* client, const gs_set* set, const gs_reduce_options* options,
                          const gs_op_options* extra, gs_work** out) {
  if (!client || !set || !out) return null_argument(!client ? "client" : !set ? "set" : "out");
  return guarded([&] { new_work(client->client->allreduce(set->set, reduce_options(options, extra)), out); });
}

gs_status gs_allreduce_deferred(gs_client* client, const gs_set* set, const gs_reduce_options* options,
                                gs_work** out) {
  if (!client || !set || !out) return null_argument(!client ? "client" : !set ? "set" : "out");
  return guarded([&] { new_work(client->client->allreduce_deferred(set->set, reduce_options(options)), out); });
}

gs_status gs_mark_ready(gs_client* client, const gs_set* set, uint32_t index, int32_t use_stream, void* stream) {
  if (!client || !set) return null_argument(!client ? "client" : "set");
  return guarded([&] {
    if (use_stream) {
      client->client->mark_ready(set->set, index, stream);
    } else {
      client->client->mark_ready(set->set, index);
    }
  });
}

gs_status gs_broadcast(gs_client* client, const gs_set* set, int32_t root, gs_work** out) {
  if (!client || !set || !out) return null_argument(!client ? "client" : !set ? "set" : "out");
  return guarded([&] { new_work(client->client->broadcast(set->set, root), out); });
}

gs_status gs_reduce(gs_client* client, const gs_set* set, int32_t root, const gs_reduce_options* options,
                    gs_work** out) {
  if (!client || !set || !out) return null_argument(!client ? "client" : !set ? "set" : "out");
  return guarded([&] { new_work(client->client->reduce(set->set, root, reduce_options(options)), out); });
}

gs_status gs_reduce_ex(gs_client* client, const gs_set* set, int32_t root, const gs_reduce_options* options,
                       const gs_op_options* extra, gs_work** out) {
  if (!client || !set || !out) return null_argument(!client ? "client" : !set ? "set" : "out");
  return guarded([&] { new_work(client->client->reduce(set->set, root, reduce_options(options, extra)), out); });
}

gs_status gs_allgather(gs_client* client, const gs_set* set, gs_work** out) {
  if (!client || !set || !out) return null_argument(!client ? "client" : !set ? "set" : "out");
  return guarded([&] { new_work(client->client->allgather(set->set), out); });
}

gs_status gs_reduce_scatter(gs_client* client, const gs_set* set, const gs_reduce_options* options,
                            const gs_op_options* extra, gs_work** out) {
  if (!client || !set || !out) return null_argument(!client ? "client" : !set ? "set" : "out");
  return guarded([&] { new_work(client->client->reduce_scatter(set->set, reduce_options(options, extra)), out); });
}

gs_status gs_work_wait(const gs_work* work, int64_t timeout_ms, int32_t* completed) {
  if (!work || !completed) return null_argument(!work ? "work" : "completed");
  return guarded([&] { *completed = work->work.wait(std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms))); });
}

gs_status gs_work_wait_stream(const gs_work* work, void* stream, int64_t timeout_ms, int32_t* completed) {
  if (!work || !completed) return null_argument(!work ? "work" : "completed");
  return guarded([&] {
    *completed = work->work.wait_stream(stream, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
  });
}

gs_status gs_work_is_completed(const gs_work* work, int32_t* done) {
  if (!work || !done) return null_argument(!work ? "work" : "done");
  return guarded([&] { *done = work->work.is_completed(); });
}

gs_status gs_work_health(const gs_work* work, int32_t* found_inf, double* sq_norm) {
  if (!work || !found_inf || !sq_norm) return null_argument(!work ? "work" : !found_inf ? "found_inf" : "sq_norm");
  return guarded([&] {
    *found_inf = work->work.found_inf() ? 1 : 0;
    *sq_norm = work->work.sq_norm();
  });
}

void gs_work_free(gs_work* work) { delete work; }

}  // extern "C"
