/* The C API of the gradsync client, in libgradsync_client.so: what the Python package (ctypes)
 * and any other language binding use. It wraps the C++ client (gradsync/client.h) with opaque
 * handles and error codes; no C++ type crosses it, so one build serves every Python.
 *
 * Errors: every function that can fail returns a gs_status; GS_OK is 0. On failure,
 * gs_last_error() returns the message of the last failed call on this thread (valid until the
 * next failing call on it), which names what was wrong, as the daemon said it.
 *
 * Memory: gs_alloc() returns memory the daemon can reach (host shared memory, or a CUDA VMM
 * allocation when device >= 0), owned by the client and valid until gs_client_close(). A
 * gs_tensor must lie inside one such allocation; the library finds which.
 *
 * Threads: a client is used from one thread at a time; works may be waited on from any thread.
 * Calls that wait (gs_register, gs_work_wait, ...) may block up to their timeout; ctypes
 * releases the GIL around them. */
#ifndef GRADSYNC_C_API_H_
#define GRADSYNC_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: gs_register_ex (extensible options), reduce-scatter (gs_reduce_scatter, gs_set_shard), and
 *    gs_allreduce_ex / gs_reduce_ex with gs_op_options: fused health (gs_work_health) and wire
 *    compression
 * 3: gs_set_release
 * 4: gs_free
 * 5: gs_client_abort */
#define GS_C_API_VERSION 5

/* The daemon's status codes (shared/status.h), and so the Python exception classes. */
typedef enum gs_status {
  GS_OK = 0,
  GS_INVALID_ARGUMENT = 1,
  GS_NOT_SUPPORTED = 2,
  GS_LAYOUT_MISMATCH = 3,
  GS_TIMEOUT = 4,
  GS_PEER_LOST = 5,
  GS_PROTOCOL = 6,
  GS_PERMISSION_DENIED = 7,
  GS_ABORTED = 8,
  GS_INTERNAL = 9,
  GS_NOT_FOUND = 10,
  GS_ALREADY_EXISTS = 11,
  GS_RESOURCE_EXHAUSTED = 12
} gs_status;

typedef enum gs_dtype {
  GS_FLOAT32 = 1,
  GS_FLOAT64 = 2,
  GS_FLOAT16 = 3,
  GS_BFLOAT16 = 4,
  GS_INT32 = 5,
  GS_INT64 = 6,
  GS_UINT8 = 7
} gs_dtype;

typedef enum gs_op { GS_SUM = 0, GS_AVG = 1, GS_MIN = 2, GS_MAX = 3 } gs_op;

typedef struct gs_client gs_client;
typedef struct gs_set gs_set;
typedef struct gs_work gs_work;

/* A tensor in memory from gs_alloc(), contiguous. */
typedef struct gs_tensor {
  void* data;
  uint64_t numel;
  int32_t dtype;      /* gs_dtype */
  int32_t device;     /* -1: host memory; else the CUDA device ordinal of its allocation */
  const char* group;  /* the process group; NULL: "dp" (every rank) */
} gs_tensor;

typedef struct gs_reduce_options {
  int32_t op;               /* gs_op */
  int32_t prescale;         /* avg: divide before combining (keeps fp16 sums in range) */
  double divisor;           /* avg: 0 means the world size */
  int32_t fp32_accumulate;  /* float16/bfloat16: accumulate in float32 (1, the default) or not (0) */
} gs_reduce_options;

/* What the _ex calls add to gs_reduce_options (NULL: nothing). `size` is
 * sizeof(gs_op_options) as the caller compiled it: fields past it take their defaults. */
typedef struct gs_op_options {
  uint32_t size;
  int32_t health;     /* allreduce of a floating host set: compute its health (gs_work_health) */
  int32_t wire_dtype; /* 0: none; GS_BFLOAT16 or GS_FLOAT16: float32 tensors and half tensors of
                         that type cross nodes as it (other half types are refused) */
} gs_op_options;

/* How a set is registered (gs_register_ex). `size` is sizeof(gs_register_options) as the caller
 * compiled it: fields past it take their defaults, so a caller built against an older header
 * keeps working when fields are added. */
typedef struct gs_register_options {
  uint32_t size;
  int64_t bucket_cap_bytes; /* < 0: the default (25 MiB); 0: one bucket per (group, dtype) */
  int32_t allgather;        /* reserve allgather's outputs */
  int32_t reduce_scatter;   /* reserve this rank's reduce-scatter shard (one dtype and group) */
  const char* label;        /* what the set is ("DDP bucket 3"); NULL or "": named by its number */
  /* Masked reduction (RegisterOptions::mask): mask_count strictly increasing indices into the
   * set's flat range that reductions keep; NULL / 0: no mask. Copied during the call. */
  const uint64_t* mask;
  uint64_t mask_count;
} gs_register_options;

/* A process group beyond "dp": the global ranks it spans. */
typedef struct gs_group {
  const char* name;
  const int32_t* ranks;
  size_t count;
} gs_group;

int gs_c_api_version(void);
const char* gs_last_error(void);

/* Connects to the daemon's socket (NULL or "": $GRADSYNC_SOCKET, else the default path). */
gs_status gs_connect(const char* socket_path, const char* client_name, int64_t request_timeout_ms, gs_client** out);
/* Closes the connection and frees the client's memory; sets and works of it must not be used
 * after (works already handed out stay safe to free). NULL is allowed. */
void gs_client_close(gs_client* client);
/* Leaves the job at once, callable from any thread, also while another thread waits or calls
 * (Client::abort): the daemon ends the job (its other ranks fail with PeerLost), works not yet
 * completed fail with GS_ABORTED naming `why` (NULL: none given), and later calls on the
 * client fail with it. gs_client_close() is still needed to free the client. */
gs_status gs_client_abort(gs_client* client, const char* why);

/* Joins a job (rendezvous: HOST:PORT of node 0's peer service, or etcd://HOST:PORT[,...]; NULL
 * or "": $GRADSYNC_RENDEZVOUS, else $MASTER_ADDR). timeout_ms 0: the daemon's default. */
gs_status gs_join(gs_client* client, const char* job, int32_t rank, int32_t world_size, int32_t local_rank,
                  int32_t local_world_size, int64_t timeout_ms, const char* rendezvous, const gs_group* groups,
                  size_t group_count);
int64_t gs_job_timeout_ms(const gs_client* client);

/* `bytes` of zero-filled memory the daemon can reach; device -1: host shared memory, else a
 * CUDA VMM allocation on that device. Each tensor carved from it must be aligned to its
 * element size (16 bytes lets the daemon move device memory fastest). */
gs_status gs_alloc(gs_client* client, uint64_t bytes, int32_t device, void** data);

/* Frees memory gs_alloc returned (`data` is what it returned): the daemon unmaps it and gives
 * its charge back to the user's limits, then the client does. GS_INVALID_ARGUMENT, naming the
 * set, while a registered set lies in it; the daemon drops a released set (gs_set_release)
 * once every local client released it, and refuses the free until then. */
gs_status gs_free(gs_client* client, void* data);

/* Registers a set (a barrier across the job's local ranks); bucket_cap_bytes < 0: the default
 * (25 MiB), 0: one bucket per (group, dtype). allgather: reserve its outputs. */
gs_status gs_register(gs_client* client, const gs_tensor* tensors, size_t count, int64_t bucket_cap_bytes,
                      int32_t allgather, gs_set** out);
/* gs_register with a label: what the set is, in the caller's words ("DDP bucket 3", at most 128
 * bytes); every message about the set, the client's and the daemon's, names it so ("DDP bucket
 * 3 (set 0)"). NULL or "": named by its number alone, as gs_register does. */
gs_status gs_register_labeled(gs_client* client, const gs_tensor* tensors, size_t count, int64_t bucket_cap_bytes,
                              int32_t allgather, const char* label, gs_set** out);
/* gs_register with every option (gs_register_options; NULL: the defaults). */
gs_status gs_register_ex(gs_client* client, const gs_tensor* tensors, size_t count, const gs_register_options* options,
                         gs_set** out);
/* Frees the handle (the set stays registered with the daemon while the client lives, unless
 * gs_set_release released it). */
void gs_set_free(gs_set* set);
/* Releases the set: this client will not use it again (operations on it are refused from now
 * on; those submitted already finish). The daemon drops the set once every local client of the
 * job released it, and the client's registered tensors count no more against its limit. The
 * set's memory stays the client's; the handle still needs gs_set_free. Not a collective, but
 * every local client must release the set before the daemon lets it go: release in the same
 * program order on every rank, like registrations. */
gs_status gs_set_release(gs_client* client, gs_set* set);
uint32_t gs_set_id(const gs_set* set);
size_t gs_set_buckets(const gs_set* set);
/* After an allgather: where tensor `index` as contributed by `rank` is (host or device memory
 * of the client, overwritten by the set's next allgather). */
gs_status gs_set_gathered(const gs_set* set, int32_t rank, size_t index, void** data);
/* After a reduce-scatter: this rank's shard (host or device memory of the client, overwritten
 * by the set's next reduce-scatter), `count` elements of the set's dtype that are elements
 * [first, first + count) of the set's tensors taken as one flat range. Needs the set registered
 * with reduce_scatter. */
gs_status gs_set_shard(const gs_set* set, void** data, uint64_t* first, uint64_t* count);

/* Device sets: the cudaStream_t the next operations and marks are ordered after (NULL: the
 * legacy default stream). */
gs_status gs_set_stream(gs_client* client, void* stream);

gs_status gs_allreduce(gs_client* client, const gs_set* set, const gs_reduce_options* options, gs_work** out);
gs_status gs_allreduce_ex(gs_client* client, const gs_set* set, const gs_reduce_options* options,
                          const gs_op_options* extra, gs_work** out);
gs_status gs_allreduce_deferred(gs_client* client, const gs_set* set, const gs_reduce_options* options,
                                gs_work** out);
/* use_stream 0: the current stream (gs_set_stream); 1: `stream`. */
gs_status gs_mark_ready(gs_client* client, const gs_set* set, uint32_t index, int32_t use_stream, void* stream);
gs_status gs_broadcast(gs_client* client, const gs_set* set, int32_t root, gs_work** out);
gs_status gs_reduce(gs_client* client, const gs_set* set, int32_t root, const gs_reduce_options* options,
                    gs_work** out);
gs_status gs_reduce_ex(gs_client* client, const gs_set* set, int32_t root, const gs_reduce_options* options,
                       const gs_op_options* extra, gs_work** out);
gs_status gs_allgather(gs_client* client, const gs_set* set, gs_work** out);
/* Reduces the set and leaves this rank its shard (gs_set_shard): the flat range split over the
 * group's ranks in rank order, ceil(N / W) elements each, the last shorter. */
gs_status gs_reduce_scatter(gs_client* client, const gs_set* set, const gs_reduce_options* options,
                            const gs_op_options* extra, gs_work** out);

/* *completed: 1 once finished successfully; 0 when the timeout passed first. A failed
 * operation returns its error. */
gs_status gs_work_wait(const gs_work* work, int64_t timeout_ms, int32_t* completed);
gs_status gs_work_wait_stream(const gs_work* work, void* stream, int64_t timeout_ms, int32_t* completed);
/* *done: 1 once finished, successfully or not (its error then comes from gs_work_wait). */
gs_status gs_work_is_completed(const gs_work* work, int32_t* done);
/* After a successful allreduce that asked for health: whether the result holds an inf or a
 * NaN, and its sum of squares in float64 (the same bits on every rank of the set's groups). */
gs_status gs_work_health(const gs_work* work, int32_t* found_inf, double* sq_norm);
void gs_work_free(gs_work* work);

#ifdef __cplusplus
}
#endif

#endif /* GRADSYNC_C_API_H_ */
