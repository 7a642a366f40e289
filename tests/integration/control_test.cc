// Bad input on the control path: each gets a clear error naming what was wrong, and the daemon
// keeps serving.
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <dlfcn.h>
#include <fcntl.h>

#include <regex>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "client/src/connection.h"
#include "shared/channel_layout.h"
#include "shared/framing.h"
#include "shared/memfd.h"
#include "shared/version.h"
#include "tests/integration/harness.h"
#include "tests/integration/raw_protocol.h"
#include "tests/integration/values.h"

namespace gradsync::test {
namespace {

// Runs `body`, which must throw an Error with `code` whose message contains `text`.
template <class Body>
void expect_error(Body&& body, ErrorCode code, const std::string& text) {
  try {
    body();
    FAIL("expected an error containing '" << text << "'");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.code() == code);
    CHECK_THAT(e.status().message(), Catch::Contains(text));
  }
}

std::string frame_header(uint32_t length) {
  const auto header = encode_frame_header(length);
  return std::string(reinterpret_cast<const char*>(header.data()), header.size());
}


}  // namespace

// Ranks that leave between steps are how a job normally ends: logged as an end, not as a
// lost peer (was "ended: PeerLost: ... disconnected" for every finished job).
TEST_CASE("job: a job whose ranks leave between operations is logged as ended, not as a failure",
          "[integration][control]") {
  TestDaemon daemon;
  check_still_serving(daemon);
  std::string log;
  for (int i = 0; i < 200; ++i) {
    log = daemon.log();
    if (log.find("removed: every rank has left") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  INFO(log);
  CHECK_THAT(log, Catch::Contains("between operations, after 1 operations; the job takes no new work"));
  CHECK_THAT(log, Catch::Contains("removed: every rank has left"));
  CHECK_THAT(log, !Catch::Contains("PeerLost") && !Catch::Contains("failed:"));
}

TEST_CASE("join: a duplicate rank is refused and names the rank", "[integration][control]") {
  TestDaemon daemon;
  const std::string job = unique_job("dup");
  auto first = join(daemon.socket(), job, 0, 2);
  expect_error([&] { join(daemon.socket(), job, 0, 2); }, ErrorCode::kAlreadyExists, "rank 0 already joined");
}

TEST_CASE("join: an absurd world size is refused", "[integration][control]") {
  TestDaemon daemon;
  expect_error([&] { join(daemon.socket(), unique_job("huge"), 0, 1 << 30); }, ErrorCode::kInvalidArgument,
               "world size must be between 1 and 65536");
}

TEST_CASE("ring: a client running far ahead of the job fails it instead of growing the daemon",
          "[integration][control]") {
  TestDaemon daemon;
  const std::string job = unique_job("ahead");
  // Rank 1 registers and then stays silent; rank 0 is a raw client flooding its ring.
  ClientGroup silent(1, [&](int) {
    auto client = join(daemon.socket(), job, 1, 2);
    client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 4, "dp"}}), {});
    ::sleep(20);
    return kOk;
  });
  Connection raw(daemon.socket(), std::nullopt);
  RawJoin joined = raw_join(raw, job, 2);
  const RawSegment memory = raw_segment(raw, 64);
  control::Request reg;
  auto* tensor = reg.mutable_register_()->add_tensors();
  tensor->set_dtype(control::FLOAT32);
  tensor->set_numel(4);
  tensor->set_segment_id(memory.id);
  raw.call(reg, std::chrono::seconds(10));
  RingWriter<SubmitRing> ring(&joined.channel.client()->submit);
  for (uint64_t seq = 1; seq <= 300; ++seq) {
    SubmitEntry entry;
    entry.kind = static_cast<uint32_t>(SubmitKind::kOp);
    entry.op_seq = seq;
    entry.op = static_cast<uint32_t>(OpKind::kBroadcast);
    entry.flags = kSubmitAllReady;
    REQUIRE(ring.try_push(entry));
  }
  joined.channel.doorbell_page()->doorbell.notify();
  const auto [code, message] = wait_for_failure(joined.channel.daemon());
  CHECK(code == static_cast<uint32_t>(ErrorCode::kProtocol));
  CHECK_THAT(message, Catch::Contains("more than 256 operations ahead"));
  check_still_serving(daemon);
}

TEST_CASE("join: a rank outside the world is refused", "[integration][control]") {
  TestDaemon daemon;
  expect_error([&] { join(daemon.socket(), unique_job("range"), 5, 2); }, ErrorCode::kInvalidArgument,
               "rank 5 is outside world size 2");
}

TEST_CASE("join: inconsistent world sizes are refused", "[integration][control]") {
  TestDaemon daemon;
  const std::string job = unique_job("sizes");
  auto first = join(daemon.socket(), job, 0, 2);
  expect_error([&] { join(daemon.socket(), job, 1, 3); }, ErrorCode::kInvalidArgument, "inconsistent world sizes");
}

TEST_CASE("join: a multi-node job without a rendezvous address is refused", "[integration][control]") {
  TestDaemon daemon;
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("GRADSYNC_RENDEZVOUS");
  auto client = Client::connect(ConnectOptions{daemon.socket()});
  expect_error([&] { client->join(JoinOptions{unique_job("multi"), 0, 8, 0, 4}); }, ErrorCode::kInvalidArgument,
               "needs a rendezvous");
}

TEST_CASE("join: ranks that do not fit node-major numbering are refused", "[integration][control]") {
  TestDaemon daemon;
  auto client = Client::connect(ConnectOptions{daemon.socket()});
  expect_error([&] { client->join(JoinOptions{unique_job("layout"), 5, 8, 0, 4, {}, "127.0.0.1:1"}); },
               ErrorCode::kInvalidArgument, "does not fit node-major numbering");
  expect_error([&] { client->join(JoinOptions{unique_job("uneven"), 0, 6, 0, 4, {}, "127.0.0.1:1"}); },
               ErrorCode::kInvalidArgument, "not a multiple of local world size");
}

TEST_CASE("join: bad process group declarations are refused", "[integration][control]") {
  TestDaemon daemon;
  auto client = Client::connect(ConnectOptions{daemon.socket()});
  JoinOptions options{unique_job("groups"), 0, 2, 0, 2};
  options.groups = {{"pair", {0, 7}}};
  expect_error([&] { client->join(options); }, ErrorCode::kInvalidArgument, "group 'pair' names rank 7");
  options.groups = {{"dp", {0}}};
  expect_error([&] { client->join(options); }, ErrorCode::kInvalidArgument, "reserved");
}

TEST_CASE("register: a tensor in an undeclared group is refused", "[integration][control]") {
  TestDaemon daemon;
  auto client = join(daemon.socket(), unique_job("undeclared"), 0, 1);
  const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kFloat32, 4, "tp"})};
  expect_error([&] { client->register_tensors(tensors, {}); }, ErrorCode::kInvalidArgument,
               "process group 'tp' is not declared");
}

TEST_CASE("register: before joining is refused", "[integration][control]") {
  TestDaemon daemon;
  auto client = Client::connect(ConnectOptions{daemon.socket()});
  const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kFloat32, 4, "dp"})};
  expect_error([&] { client->register_tensors(tensors, {}); }, ErrorCode::kInvalidArgument, "join a job before");
}

TEST_CASE("register: an offset or size outside the segment is refused", "[integration][control]") {
  TestDaemon daemon;
  auto client = join(daemon.socket(), unique_job("bounds"), 0, 1);
  const SharedTensor real = client->allocate(TensorSpec{DType::kFloat32, 16, "dp"});  // 64-byte segment
  const std::vector<SharedTensor> past_end = {
      SharedTensor(DType::kFloat32, 16, "dp", real.data(), real.segment_id(), 4)};
  expect_error([&] { client->register_tensors(past_end, {}); }, ErrorCode::kInvalidArgument, "out of range");
  const std::vector<SharedTensor> huge = {
      SharedTensor(DType::kFloat32, uint64_t{1} << 62, "dp", real.data(), real.segment_id(), 0)};
  expect_error([&] { client->register_tensors(huge, {}); }, ErrorCode::kInvalidArgument, "do not fit");
  const std::vector<SharedTensor> unknown = {SharedTensor(DType::kFloat32, 1, "dp", real.data(), 999, 0)};
  expect_error([&] { client->register_tensors(unknown, {}); }, ErrorCode::kInvalidArgument, "unknown segment 999");
  check_still_serving(daemon);
}

TEST_CASE("register: overlapping tensors are refused", "[integration][control]") {
  TestDaemon daemon;
  auto client = join(daemon.socket(), unique_job("overlap"), 0, 1);
  const SharedTensor real = client->allocate(TensorSpec{DType::kFloat32, 16, "dp"});
  const std::vector<SharedTensor> overlapping = {
      SharedTensor(DType::kFloat32, 8, "dp", real.data(), real.segment_id(), 0),
      SharedTensor(DType::kFloat32, 8, "dp", real.data() + 16, real.segment_id(), 16)};
  expect_error([&] { client->register_tensors(overlapping, {}); }, ErrorCode::kInvalidArgument, "overlaps");
}

TEST_CASE("register: an unknown dtype is refused by the daemon", "[integration][control]") {
  TestDaemon daemon;
  Connection raw(daemon.socket(), std::nullopt);
  raw_join(raw, unique_job("dtype"), 1);
  const uint32_t id = raw_segment(raw, 4096).id;
  control::Request reg;
  auto* tensor = reg.mutable_register_()->add_tensors();
  tensor->set_dtype(static_cast<control::DType>(42));
  tensor->set_numel(4);
  tensor->set_segment_id(id);
  expect_error([&] { raw.call(reg, std::chrono::seconds(5)); }, ErrorCode::kInvalidArgument, "unknown dtype 42");
}

TEST_CASE("register: different layouts across ranks fail every rank, naming the tensor", "[integration][control]") {
  TestDaemon daemon;
  const std::string job = unique_job("mismatch");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    std::vector<TensorSpec> specs = {{DType::kFloat32, 10, "dp"}, {DType::kFloat32, 20, "dp"}};
    if (rank == 1) specs[1].numel = 21;
    try {
      client->register_tensors(client->allocate_flat(specs), RegisterOptions{.label = "the embedding's gradients"});
      return fail("registration should have failed");
    } catch (const Error& e) {
      const std::string message = e.what();
      if (e.code() != ErrorCode::kLayoutMismatch) return fail("wrong code: " + message);
      // The daemon names the set as its maker did (a Python user never made "set 0").
      if (message.find("the embedding's gradients (set 0) layout mismatch") == std::string::npos) {
        return fail("does not name the set by its label: " + message);
      }
      if (message.find("tensor 1 differs") == std::string::npos) return fail("does not name tensor 1: " + message);
      if (message.find("float32[21]") == std::string::npos) return fail("does not describe both: " + message);
    }
    return kOk;
  });
  for (int status : group.wait_all()) CHECK(exit_code(status) == kOk);
}

TEST_CASE("register: a rank that never registers times the others out", "[integration][control]") {
  TestDaemon daemon;
  const std::string job = unique_job("reg-timeout");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2, std::chrono::milliseconds(500));
    if (rank == 1) {
      ::sleep(3);
      return kOk;
    }
    try {
      client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 4, "dp"}}), {});
      return fail("registration should have timed out");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) return fail(std::string("wrong error: ") + e.what());
      if (std::string(e.what()).find("rank(s) 1") == std::string::npos) return fail(std::string("unnamed: ") + e.what());
    }
    return kOk;
  });
  for (int status : group.wait_all()) CHECK(exit_code(status) == kOk);
}

TEST_CASE("operations: avg on integer tensors is refused before it reaches the job", "[integration][control]") {
  TestDaemon daemon;
  auto client = join(daemon.socket(), unique_job("int-avg"), 0, 1);
  const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kInt32, 4, "dp"})};
  const TensorSet set = client->register_tensors(tensors, {});
  expect_error([&] { client->allreduce(set, ReduceOptions{ReduceOp::kAvg}); }, ErrorCode::kInvalidArgument,
               "avg is not defined for integer");
  CHECK(client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(10)));
}

TEST_CASE("operations: wire compression is refused on sets it cannot serve, naming why, and taken by half sets",
          "[integration][control][wire]") {
  TestDaemon daemon;
  auto client = join(daemon.socket(), unique_job("wire-dtypes"), 0, 1);
  ReduceOptions options{ReduceOp::kSum};
  options.wire_dtype = DType::kBFloat16;
  for (DType dtype : {DType::kFloat64, DType::kInt32}) {
    INFO(dtype_name(dtype));
    const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{dtype, 4, "dp"})};
    const TensorSet set = client->register_tensors(tensors, {});
    expect_error([&] { client->allreduce(set, options); }, ErrorCode::kInvalidArgument,
                 "applies to float32, float16 and bfloat16");
  }
  ReduceOptions bad = options;
  bad.wire_dtype = DType::kFloat32;
  // A half tensor crosses only as its own type (bfloat16 rounds float16's 65504 up past its
  // range; float16 overflows bfloat16's large values), and needs float32 accumulation for it.
  ReduceOptions float16_wire{ReduceOp::kSum};
  float16_wire.wire_dtype = DType::kFloat16;
  const std::vector<SharedTensor> float16 = {client->allocate(TensorSpec{DType::kFloat16, 4, "dp"}),
                                             client->allocate(TensorSpec{DType::kFloat32, 4, "dp"})};
  const TensorSet float16_set = client->register_tensors(float16, {});
  const std::vector<SharedTensor> bfloat16 = {client->allocate(TensorSpec{DType::kBFloat16, 4, "dp"})};
  const TensorSet bfloat16_set = client->register_tensors(bfloat16, {});
  expect_error([&] { client->allreduce(float16_set, options); }, ErrorCode::kInvalidArgument,
               "has float16 tensors, which cannot cross nodes as bfloat16");
  expect_error([&] { client->allreduce(bfloat16_set, float16_wire); }, ErrorCode::kInvalidArgument,
               "has bfloat16 tensors, which cannot cross nodes as float16");
  expect_error([&] { client->allreduce(float16_set, bad); }, ErrorCode::kInvalidArgument,
               "bfloat16 or float16, not float32");
  ReduceOptions narrow = float16_wire;
  narrow.fp32_accumulate = false;
  expect_error([&] { client->allreduce(float16_set, narrow); }, ErrorCode::kInvalidArgument,
               "has half-precision tensors, which need fp32_accumulate = true");
  // On one node nothing crosses, so the result is the plain one.
  store(DType::kFloat16, float16[0].data(), 0, 1.5);
  store(DType::kBFloat16, bfloat16[0].data(), 0, 2.5);
  CHECK(client->allreduce(float16_set, float16_wire).wait(std::chrono::seconds(10)));
  CHECK(client->allreduce(bfloat16_set, options).wait(std::chrono::seconds(10)));
  CHECK(half_to_float(float16[0].as<const uint16_t>()[0]) == 1.5f);
  CHECK(bfloat16_to_float(bfloat16[0].as<const uint16_t>()[0]) == 2.5f);
  // A float32 set still takes fp32_accumulate = false beside a wire dtype (it changes nothing).
  const std::vector<SharedTensor> float32 = {client->allocate(TensorSpec{DType::kFloat32, 4, "dp"})};
  const TensorSet float32_set = client->register_tensors(float32, {});
  CHECK(client->allreduce(float32_set, narrow).wait(std::chrono::seconds(10)));
}

TEST_CASE("labels: the client's and the daemon's messages name a set by its label, and a label past 128 bytes is refused",
          "[integration][control]") {
  TestDaemon daemon;
  auto client = join(daemon.socket(), unique_job("label"), 0, 1);
  const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kInt32, 4, "dp"})};
  expect_error([&] { client->register_tensors(tensors, RegisterOptions{.label = std::string(129, 'x')}); },
               ErrorCode::kInvalidArgument, "a tensor set's label is at most 128 bytes; this one has 129");
  const TensorSet set = client->register_tensors(tensors, RegisterOptions{.label = "the step counters"});
  CHECK(set.label() == "the step counters");
  // The client's own checks name it by its label too.
  expect_error([&] { client->allreduce(set, ReduceOptions{ReduceOp::kAvg}); }, ErrorCode::kInvalidArgument,
               "avg is not defined for integer tensors, and the step counters (set 0) has some; use sum");
  expect_error([&] { client->mark_ready(set, 0); }, ErrorCode::kInvalidArgument,
               "the step counters (set 0) has no deferred allreduce open");
  CHECK(client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(10)));

  // A client that skips the library's check: the daemon refuses the label, naming its size.
  Connection raw(daemon.socket(), std::nullopt);
  raw_join(raw, unique_job("label-raw"), 1);
  const uint32_t id = raw_segment(raw, 4096).id;
  control::Request reg;
  reg.mutable_register_()->set_label(std::string(300, 'y'));
  auto* tensor = reg.mutable_register_()->add_tensors();
  tensor->set_dtype(control::FLOAT32);
  tensor->set_numel(4);
  tensor->set_segment_id(id);
  expect_error([&] { raw.call(reg, std::chrono::seconds(5)); }, ErrorCode::kInvalidArgument,
               "set 0: a tensor set's label is at most 128 bytes; this one has 300");
  // Not UTF-8 (as a byte cut of a longer label would be), or a terminal control: refused, by
  // name, and the connection stays (a proto3 string would have failed the frame's parse).
  reg.mutable_register_()->set_label("caf\xc3");
  expect_error([&] { raw.call(reg, std::chrono::seconds(5)); }, ErrorCode::kInvalidArgument,
               "set 0: a tensor set's label must be UTF-8; byte 3 of this one is not");
  reg.mutable_register_()->set_label("evil\xc2\x9b" "[2J");
  expect_error([&] { raw.call(reg, std::chrono::seconds(5)); }, ErrorCode::kInvalidArgument,
               "byte 4 of this one is U+009B");
  expect_error([&] { client->register_tensors(tensors, RegisterOptions{.label = "a\u202Eb"}); },
               ErrorCode::kInvalidArgument, "byte 1 of this one is U+202E");
  check_still_serving(daemon);
}

TEST_CASE("frames: an oversized frame is refused with the sizes", "[integration][control]") {
  TestDaemon daemon;
  RawSocket raw(daemon.socket());
  raw.send(frame_header(100u << 20));
  CHECK_THAT(first_error(raw.read_to_end()), Catch::Contains("exceeds the 16777216-byte limit"));
  check_still_serving(daemon);
}

TEST_CASE("frames: a truncated frame is reported", "[integration][control]") {
  TestDaemon daemon;
  RawSocket raw(daemon.socket());
  raw.send(frame_header(100) + std::string(10, 'x'));
  raw.finish_writing();
  CHECK_THAT(first_error(raw.read_to_end()), Catch::Contains("truncated frame: expected 100 payload bytes, got 10"));
  check_still_serving(daemon);
}

TEST_CASE("frames: garbage is refused and the daemon keeps serving", "[integration][control]") {
  TestDaemon daemon;
  RawSocket raw(daemon.socket());
  std::string garbage = frame_header(64);
  for (int i = 0; i < 64; ++i) garbage.push_back(static_cast<char>(0xff - i));
  raw.send(garbage);
  CHECK_THAT(first_error(raw.read_to_end()), Catch::Contains("malformed request"));
  check_still_serving(daemon);
  CHECK(daemon.running());
}

// A Hello frame, then `request` with `fds` attached; returns the first error the daemon sent
// before it closed the connection, or the error reply of the request if it stayed open.
std::string error_for(const TestDaemon& daemon, control::Request request, const std::vector<int>& fds,
                      uint32_t declared_fds) {
  RawSocket raw(daemon.socket());
  control::Request hello;
  hello.set_id(1);
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  request.set_id(2);
  request.set_fd_count(declared_fds);
  raw.send(frame_of(hello));
  raw.send(frame_of(request), fds);
  raw.finish_writing();
  const std::string bytes = raw.read_to_end();
  // Skip the Hello reply: the second frame answers the request.
  FrameDecoder decoder;
  decoder.feed(std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  std::optional<std::string> payload;
  for (int frame = 0; frame < 2; ++frame) {
    payload.reset();
    REQUIRE(decoder.next(&payload).ok());
    REQUIRE(payload);
  }
  control::Reply reply;
  REQUIRE(reply.ParseFromString(*payload));
  return reply.error().message();
}

control::Request segment_request(uint64_t bytes) {
  control::Request request;
  request.mutable_segment()->set_kind(control::HOST_MEMFD);
  request.mutable_segment()->set_bytes(bytes);
  return request;
}

control::Request device_segment(control::MemoryKind kind, uint64_t bytes, size_t uuid_bytes, size_t handle_bytes) {
  control::Request request;
  request.mutable_segment()->set_kind(kind);
  request.mutable_segment()->set_bytes(bytes);
  request.mutable_segment()->set_device_uuid(std::string(uuid_bytes, '\x5a'));
  if (handle_bytes > 0) request.mutable_segment()->set_ipc_handle(std::string(handle_bytes, '\x11'));
  return request;
}

TEST_CASE("device memory on a daemon without a usable GPU is refused clearly, and host jobs go on",
          "[integration][control][device]") {
  // No machine here (nor CI) has a GPU: whether gradsyncd was built with the CUDA backend or
  // not, it says why it cannot take device memory. (On a machine with a GPU the made-up UUID
  // names no GPU, and that is the answer.)
  TestDaemon daemon;
  if (daemon.log().find("serving host memory only") == std::string::npos) {
    WARN("this machine has a usable GPU: the no-GPU answers are not what it gives");  // Catch2 v2: no SKIP
    return;
  }
  CHECK_THAT(daemon.log(), Catch::Contains("CUDA: ") && Catch::Contains("serving host memory only"));
  // (Catch2 v2 composes matchers by reference, so each CHECK_THAT builds its own.)
  MappedMemfd stand_in = MappedMemfd::create("test", 4096);  // any descriptor: it is refused first
  const std::string vmm = error_for(daemon, device_segment(control::CUDA_VMM, 2 << 20, 16, 0), {stand_in.fd().get()}, 1);
  CHECK_THAT(vmm, Catch::StartsWith("segment: CUDA VMM memory: ") && Catch::Contains("host memory only") &&
                      (Catch::Contains("no usable GPU here") || Catch::Contains("built without the CUDA backend") ||
                       Catch::Contains("no GPU with the client's UUID")));
  // Legacy handles are refused by policy first, naming the setting that would trust this user.
  const std::string uid = std::to_string(::getuid());
  const std::string untrusted = error_for(daemon, device_segment(control::CUDA_LEGACY_IPC, 4096, 16, 64), {}, 0);
  CHECK_THAT(untrusted, Catch::StartsWith("segment: CUDA legacy IPC memory from uid " + uid + " is not accepted") &&
                            Catch::Contains("--legacy-ipc-uid " + uid));
  check_still_serving(daemon);
  // Trusted, it meets the missing GPU.
  TestDaemon trusting({"--legacy-ipc-uid", uid});
  const std::string ipc = error_for(trusting, device_segment(control::CUDA_LEGACY_IPC, 4096, 16, 64), {}, 0);
  CHECK_THAT(ipc, Catch::StartsWith("segment: CUDA legacy IPC memory: ") &&
                      (Catch::Contains("no usable GPU here") || Catch::Contains("built without the CUDA backend") ||
                       Catch::Contains("no GPU with the client's UUID")));
  check_still_serving(trusting);
}

TEST_CASE("client: a tensor size whose bytes would wrap around is refused before any memory is made",
          "[integration][control]") {
  // 2^62 float32 elements are 2^64 bytes: once 0, rounded up to a 64-byte segment that the
  // returned tensor claimed 2^62 elements of, so writes through it ran past the mapping.
  TestDaemon daemon;
  auto client = join(daemon.socket(), unique_job("wrap"), 0, 1);
  expect_error([&] { client->allocate(TensorSpec{DType::kFloat32, uint64_t{1} << 62, "dp"}); },
               ErrorCode::kInvalidArgument, "a tensor of 4611686018427387904 float32 elements is more than any memory");
  const TensorSpec half_of_most{DType::kFloat64, uint64_t{1} << 53, "dp"};  // 2^56 bytes each
  expect_error([&] { client->allocate_flat(std::vector<TensorSpec>{half_of_most, half_of_most}); },
               ErrorCode::kInvalidArgument, "a flat set of more than");
  const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kFloat32, 4, "dp"})};
  const TensorSet set = client->register_tensors(tensors, {});
  CHECK(client->allreduce(set, {}).wait(std::chrono::seconds(10)));
}

TEST_CASE("client: device memory without a usable CUDA driver is refused clearly, host memory goes on",
          "[integration][control][device]") {
  TestDaemon daemon;
  auto client = join(daemon.socket(), unique_job("device"), 0, 1);
  const TensorSpec spec{DType::kFloat32, 1024, "dp"};
  // No machine here has a driver: the client library says so (or that it has no CUDA at all),
  // before the daemon is even asked.
  expect_error([&] { client->allocate_device(spec, 0); }, ErrorCode::kNotSupported, "device memory: ");
  try {
    client->allocate_device_flat(std::vector<TensorSpec>{spec, spec}, 0);
    FAIL("allocate_device_flat succeeded without a GPU");
  } catch (const Error& e) {
    const std::string text = e.what();
    CHECK(e.code() == ErrorCode::kNotSupported);
    CHECK((text.find("no usable CUDA driver") != std::string::npos ||
           text.find("built without CUDA support") != std::string::npos));
  }
  expect_error([&] { client->allocate_device(spec, -1); }, ErrorCode::kInvalidArgument,
               "device must be a CUDA device ordinal, got -1");
  // Memory from another allocator: the same answer, before anything is sent.
  int not_device_memory = 0;
  expect_error([&] { client->share_device(spec, &not_device_memory, 0); }, ErrorCode::kNotSupported, "device memory: ");
  // The same client goes on with host memory.
  const std::vector<SharedTensor> tensors = {client->allocate(spec)};
  const TensorSet set = client->register_tensors(tensors, {});
  tensors[0].as<float>()[0] = 2.0f;
  CHECK(client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(10)));
  CHECK(tensors[0].as<float>()[0] == 2.0f);
}

TEST_CASE("device segments with malformed fields are refused, naming the field", "[integration][control][device]") {
  TestDaemon daemon;
  MappedMemfd stand_in = MappedMemfd::create("test", 4096);
  CHECK_THAT(error_for(daemon, device_segment(control::CUDA_VMM, 4096, 3, 0), {stand_in.fd().get()}, 1),
             Catch::Contains("device_uuid must be the GPU's 16-byte UUID, got 3 bytes"));
  CHECK_THAT(error_for(daemon, device_segment(control::CUDA_LEGACY_IPC, 4096, 16, 10), {}, 0),
             Catch::Contains("ipc_handle must be a 64-byte cudaIpcMemHandle_t, got 10 bytes"));
  CHECK_THAT(error_for(daemon, device_segment(control::CUDA_VMM, 0, 16, 0), {stand_in.fd().get()}, 1),
             Catch::Contains("a segment must not have zero bytes"));
  // The legacy kind travels as a handle: a descriptor with it is a protocol mistake.
  CHECK_THAT(error_for(daemon, device_segment(control::CUDA_LEGACY_IPC, 4096, 16, 64), {stand_in.fd().get()}, 1),
             Catch::Contains("carries no file descriptors, got 1 (a CUDA legacy IPC segment travels as its handle)"));
  // And the VMM kind needs its descriptor.
  CHECK_THAT(error_for(daemon, device_segment(control::CUDA_VMM, 4096, 16, 0), {}, 0),
             Catch::Contains("a Segment request carries exactly one file descriptor, got 0"));
  check_still_serving(daemon);
}

TEST_CASE("fds: a descriptor that is not a memfd is refused, naming what it is", "[integration][control][fds]") {
  TestDaemon daemon;
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  CHECK_THAT(error_for(daemon, segment_request(4096), {pipe_fds[0]}, 1), Catch::Contains("is a pipe, not a memfd"));
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  char path[] = "/tmp/gradsync-file-XXXXXX";
  const int file = ::mkstemp(path);
  REQUIRE(::ftruncate(file, 4096) == 0);
  CHECK_THAT(error_for(daemon, segment_request(4096), {file}, 1), Catch::Contains("not a memfd"));
  ::close(file);
  ::unlink(path);
  check_still_serving(daemon);
}

TEST_CASE("fds: a lingering socket sent as a descriptor is closed without blocking the daemon",
          "[integration][control][fds]") {
  // A TCP socket with unsent data its peer never reads and SO_LINGER of an hour: its last
  // close() blocks that long. Sent with a request, the daemon closed it on its io thread, and
  // no other client was served (and SIGTERM, served there too, did nothing). (Resetting the
  // linger as it arrives does not stop a sender who sets it again afterwards: not fixed.)
  TestDaemon daemon;
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int small = 4096;
  REQUIRE(::setsockopt(listener.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)) == 0);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(listener.get(), 1) == 0);
  socklen_t length = sizeof(address);
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
  UniqueFd lingering(::socket(AF_INET, SOCK_STREAM, 0));
  REQUIRE(::setsockopt(lingering.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)) == 0);
  REQUIRE(::connect(lingering.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  UniqueFd peer(::accept(listener.get(), nullptr, nullptr));  // never reads
  REQUIRE(peer);
  const std::string chunk(65536, 'x');
  size_t unsent = 0;
  for (ssize_t n = 0; (n = ::send(lingering.get(), chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL)) > 0;) {
    unsent += static_cast<size_t>(n);
  }
  REQUIRE(unsent > 0);
  const struct linger hour {1, 3600};
  REQUIRE(::setsockopt(lingering.get(), SOL_SOCKET, SO_LINGER, &hour, sizeof(hour)) == 0);
  {
    RawSocket attacker(daemon.socket());
    control::Request hello;
    hello.set_id(1);
    hello.set_fd_count(1);  // a Hello carries none: refused, the connection and descriptor closed
    hello.mutable_hello()->set_protocol_version(kProtocolVersion);
    attacker.send(frame_of(hello), {lingering.get()});
    lingering.reset();  // the daemon holds the last reference now
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  const auto began = std::chrono::steady_clock::now();
  check_still_serving(daemon);
  CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(5));
}

TEST_CASE("fds: a memfd of huge pages is refused, sealed or not", "[integration][control][fds]") {
  // Its size seals do not stop a page being punched out (FALLOC_FL_PUNCH_HOLE); with no free
  // huge page left to fault one back in, the daemon reading it died of SIGBUS. Creating one
  // needs no huge pages reserved (they are taken when it is mapped, which this test does not).
  TestDaemon daemon;
  constexpr size_t kHugePage = 2u << 20;
  UniqueFd huge(::memfd_create("test-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB));
  REQUIRE(huge);  // every Linux since 4.14 with hugetlbfs, as Debian 12's
  REQUIRE(::ftruncate(huge.get(), kHugePage) == 0);
  REQUIRE(::fcntl(huge.get(), F_ADD_SEALS, kSizeSeals) == 0);
  CHECK_THAT(error_for(daemon, segment_request(kHugePage), {huge.get()}, 1),
             Catch::Contains("is a memfd of huge pages (MFD_HUGETLB); only ordinary memfds are taken"));
  check_still_serving(daemon);
}

TEST_CASE("fds: a memfd without the size seals is refused, naming the missing seals", "[integration][control][fds]") {
  TestDaemon daemon;
  MappedMemfd unsealed = MappedMemfd::create("test", 4096);
  CHECK_THAT(error_for(daemon, segment_request(4096), {unsealed.fd().get()}, 1),
             Catch::Contains("without the seals F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL"));
  MappedMemfd half = MappedMemfd::create("test", 4096);
  half.seal(F_SEAL_SHRINK);
  CHECK_THAT(error_for(daemon, segment_request(4096), {half.fd().get()}, 1),
             Catch::Contains("without the seals F_SEAL_GROW | F_SEAL_SEAL"));
  MappedMemfd sealed = MappedMemfd::create("test", 4096);
  sealed.seal(kSizeSeals);
  CHECK_THAT(error_for(daemon, segment_request(8192), {sealed.fd().get()}, 1),
             Catch::Contains("has 4096 bytes, but 8192 were announced"));
  check_still_serving(daemon);
}

TEST_CASE("fds: more descriptors in one message than the limit are refused", "[integration][control][fds]") {
  TestDaemon daemon;
  std::vector<MappedMemfd> many;
  std::vector<int> fds;
  for (int i = 0; i < 20; ++i) {
    many.push_back(MappedMemfd::create("test", 4096));
    fds.push_back(many.back().fd().get());
  }
  RawSocket raw(daemon.socket());
  control::Request hello;
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  hello.set_fd_count(20);
  raw.send(frame_of(hello), fds);
  raw.finish_writing();
  CHECK_THAT(first_error(raw.read_to_end()), Catch::Contains("more than 16 file descriptors were sent in one message"));
  check_still_serving(daemon);
}

TEST_CASE("fds: descriptors that no request claims end the connection", "[integration][control][fds]") {
  TestDaemon daemon;
  MappedMemfd memory = MappedMemfd::create("test", 4096);
  memory.seal(kSizeSeals);
  control::Request join;
  join.mutable_join()->set_job_id(unique_job("stray"));
  join.mutable_join()->set_world_size(1);
  join.mutable_join()->set_local_world_size(1);
  CHECK_THAT(error_for(daemon, join, {memory.fd().get()}, 0),
             Catch::Contains("declares 0 file descriptor(s), but 1 were sent with it"));
  // Declared but of a request that takes none: refused by the request, the connection stays.
  CHECK_THAT(error_for(daemon, join, {memory.fd().get()}, 1),
             Catch::Contains("this request carries no file descriptors, got 1"));
  check_still_serving(daemon);
}

TEST_CASE("fds: a request naming a descriptor that was never sent is refused", "[integration][control][fds]") {
  TestDaemon daemon;
  CHECK_THAT(error_for(daemon, segment_request(4096), {}, 1),
             Catch::Contains("names 1 file descriptor(s), but 0 were sent with it"));
  CHECK_THAT(error_for(daemon, segment_request(4096), {}, 0),
             Catch::Contains("a Segment request carries exactly one file descriptor, got 0"));
  check_still_serving(daemon);
}

TEST_CASE("hello: a different protocol version is refused", "[integration][control]") {
  TestDaemon daemon;
  Connection raw(daemon.socket(), std::nullopt);
  control::Request hello;
  hello.mutable_hello()->set_protocol_version(kProtocolVersion + 98);
  expect_error([&] { raw.call(hello, std::chrono::seconds(5)); }, ErrorCode::kNotSupported, "protocol version");
}

TEST_CASE("hello: a protocol 1 client (shared-memory names) gets a clear version error", "[integration][control]") {
  TestDaemon daemon;
  Connection raw(daemon.socket(), std::nullopt);
  control::Request hello;
  hello.mutable_hello()->set_protocol_version(1);
  expect_error([&] { raw.call(hello, std::chrono::seconds(5)); }, ErrorCode::kNotSupported,
               "protocol version 1 is not supported; this daemon speaks version " + std::to_string(kProtocolVersion));
}

TEST_CASE("connect: a user outside the allow-list is refused", "[integration][control]") {
  TestDaemon daemon({"--allow-uid", std::to_string(::geteuid() + 12345)});
  expect_error([&] { Client::connect(ConnectOptions{daemon.socket()}); }, ErrorCode::kPermissionDenied,
               "is not allowed");
}

// The refusal races the client's first write: the daemon refuses at accept and closes, and a
// client still writing gets a broken pipe. A hello of 4 MiB, far more than the socket buffers
// hold, loses that race every time; the client must still report the daemon's reason.
TEST_CASE("connect: a refused user whose write loses the race with the close still hears why",
          "[integration][control]") {
  TestDaemon daemon({"--allow-uid", std::to_string(::geteuid() + 12345)});
  Connection raw(daemon.socket(), std::nullopt);
  control::Request hello;
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  hello.mutable_hello()->set_client_name(std::string(4 << 20, 'x'));
  expect_error([&] { raw.call(hello, std::chrono::seconds(5)); }, ErrorCode::kPermissionDenied, "is not allowed");
}

TEST_CASE("ring: an unknown operation from a hostile client fails its job with a clear error", "[integration][control]") {
  TestDaemon daemon;
  Connection raw(daemon.socket(), std::nullopt);
  RawJoin joined = raw_join(raw, unique_job("hostile"), 1);
  RingWriter<SubmitRing> ring(&joined.channel.client()->submit);
  auto ring_doorbell = [&] { joined.channel.doorbell_page()->doorbell.notify(); };
  auto failure = [&] { return wait_for_failure(joined.channel.daemon()); };

  SECTION("unknown operation") {
    SubmitEntry entry;
    entry.kind = static_cast<uint32_t>(SubmitKind::kOp);
    entry.op_seq = 1;
    entry.op = 99;
    REQUIRE(ring.try_push(entry));
    ring_doorbell();
    const auto [code, message] = failure();
    CHECK(code == static_cast<uint32_t>(ErrorCode::kInvalidArgument));
    CHECK_THAT(message, Catch::Contains("unknown operation 99"));
  }
  SECTION("operation on a set that was never registered") {
    SubmitEntry entry;
    entry.kind = static_cast<uint32_t>(SubmitKind::kOp);
    entry.op_seq = 1;
    entry.op = static_cast<uint32_t>(OpKind::kBroadcast);
    entry.set_id = 7;
    REQUIRE(ring.try_push(entry));
    ring_doorbell();
    CHECK_THAT(failure().second, Catch::Contains("set 7 is not registered"));
  }
  SECTION("unknown entry kind") {
    SubmitEntry entry;
    entry.kind = 12345;
    REQUIRE(ring.try_push(entry));
    ring_doorbell();
    CHECK_THAT(failure().second, Catch::Contains("unknown ring entry kind 12345"));
  }
  check_still_serving(daemon);
}

}  // namespace gradsync::test

namespace gradsync::test {
namespace {

// Runs gradsyncd with `args` to completion; returns (exit code, output).
std::pair<int, std::string> run_daemon_command(const std::vector<std::string>& args) {
  char pattern[] = "/tmp/gradsync-out-XXXXXX";
  const int fd = ::mkstemp(pattern);
  ::close(fd);
  std::vector<std::string> argv = {GRADSYNCD_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess process(argv, pattern);
  const int status = process.wait_for(std::chrono::seconds(10));
  std::ifstream file(pattern);
  std::stringstream text;
  text << file.rdbuf();
  ::unlink(pattern);
  return {exit_code(status), text.str()};
}

}  // namespace

TEST_CASE("gradsyncd: --help describes the flags and exits 0", "[integration][daemon]") {
  const auto [code, output] = run_daemon_command({"--help"});
  CHECK(code == 0);
  CHECK_THAT(output, Catch::Contains("--socket") && Catch::Contains("--timeout-ms") && Catch::Contains("--allow-uid"));
}

TEST_CASE("gradsyncd: an unknown flag or bad value exits 2 naming it", "[integration][daemon]") {
  const auto [code, output] = run_daemon_command({"--no-such-flag"});
  CHECK(code == 2);
  CHECK_THAT(output, Catch::Contains("no-such-flag"));
  const auto [level_code, level_output] = run_daemon_command({"--log-level", "loud"});
  CHECK(level_code == 2);
  CHECK_THAT(level_output, Catch::Contains("--log-level must be debug, info, warning or error, not 'loud'"));
  // "-1" would wrap to 2^64 - 1 ms and overflow every deadline: bounds are at most a day.
  const auto [wrap_code, wrap_output] = run_daemon_command({"--execution-timeout-ms", "-1"});
  CHECK(wrap_code == 2);
  CHECK_THAT(wrap_output, Catch::Contains("--execution-timeout-ms must be an integer from 1 to 86400000 (a day), not '-1'"));
  const auto [scheme_code, scheme_output] = run_daemon_command({"--admin", "unix-abstract:x"});
  CHECK(scheme_code == 2);
  CHECK_THAT(scheme_output, Catch::Contains("--admin must be unix:PATH, none or HOST:PORT, not 'unix-abstract:x'"));
  // Other nodes read the advertised host from this node's formation record: one printable word.
  const auto [advertise_code, advertise_output] = run_daemon_command({"--peer-advertise", "node 1"});
  CHECK(advertise_code == 2);
  CHECK_THAT(advertise_output, Catch::Contains("--peer-advertise must be a host name or address (printable ASCII, "
                                               "no spaces, at most 255 bytes), not 'node 1'"));
  // Refused as it is read, before any socket exists, with the usage status (was: exit 1 once
  // every socket was up).
  const auto [metrics_code, metrics_output] = run_daemon_command({"--metrics", "9090"});
  CHECK(metrics_code == 2);
  CHECK_THAT(metrics_output, Catch::Contains("--metrics must be HOST:PORT") && Catch::Contains("not '9090'"));
  CHECK_THAT(metrics_output, !Catch::Contains("listening on"));
  // A user is named by uid or by name; a name nobody has is refused saying what is accepted.
  const auto [user_code, user_output] = run_daemon_command({"--allow-uid", "no-such-user-here"});
  CHECK(user_code == 2);
  CHECK_THAT(user_output, Catch::Contains("--allow-uid must be a uid or a user name, and 'no-such-user-here' is neither a uid nor a user"));
}

TEST_CASE("gradsyncd: --allow-uid takes user names as well as uids", "[integration][daemon]") {
  TestDaemon daemon({"--allow-uid", "root", "--allow-uid", "nobody"});
  const std::string config = gradsyncctl(daemon, "config get").output;
  INFO(config);
  CHECK(std::regex_search(config, std::regex(R"(allow-uid\s+0,65534\n)")));
}

TEST_CASE("harness: a daemon that does not come up is reported with its log, and its folder is removed",
          "[integration][daemon]") {
  // A setting refused before any socket exists (a bad --metrics address is refused only once
  // the control socket listens, so a loaded machine could see that daemon up for a moment).
  std::string message;
  try {
    TestDaemon daemon({"--max-jobs", "0"});
    FAIL("the daemon came up");
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK_THAT(message, Catch::Contains("did not come up") && Catch::Contains("its log:") &&
                          Catch::Contains("--max-jobs must be an integer from 1 to 4096"));
  std::smatch folder;
  REQUIRE(std::regex_search(message, folder, std::regex(R"(did not come up on (\S+)/gradsync\.sock)")));
  CHECK_FALSE(std::filesystem::exists(folder[1].str()));
}

TEST_CASE("gradsyncd: settings come from a TOML config file, flags win, bad files are errors naming the line",
          "[integration][daemon]") {
  char pattern[] = "/tmp/gradsync-conf-XXXXXX";
  const auto write_config = [&](const std::string& text) {
    const int fd = ::open(pattern, O_WRONLY | O_TRUNC);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    ::close(fd);
  };
  ::close(::mkstemp(pattern));
  write_config("# gradsyncd settings\ntimeout-ms = 1234\nreduce-threads = 1\nlog-level = \"debug\"\n"
               "allow-uid = [0, 1000]\n");
  {
    TestDaemon daemon({"--config", pattern});
    CHECK_THAT(daemon.log(), Catch::Contains("1 reduce threads, default timeout 1234 ms"));
    CHECK(std::regex_search(gradsyncctl(daemon, "config get").output, std::regex(R"(allow-uid\s+0,1000)")));
  }
  {
    // A flag wins, repeatable ones too: the file's allow-uid list is not merged into the flag's.
    TestDaemon daemon({"--config", pattern, "--timeout-ms", "4321", "--allow-uid", "7"});
    CHECK_THAT(daemon.log(), Catch::Contains("default timeout 4321 ms"));
    const std::string config = gradsyncctl(daemon, "config get").output;
    INFO(config);
    CHECK(std::regex_search(config, std::regex(R"(allow-uid\s+7\n)")));
  }
  const std::string file = pattern;
  const auto refused = [&](const std::string& text, const std::string& why) {
    write_config(text);
    const auto [code, output] = run_daemon_command({"--config", file});
    INFO(output);
    CHECK(code == 2);
    CHECK_THAT(output, Catch::Contains(why));
  };
  refused("timeout-ms = 5\nno-such-setting = 3\n", "config file " + file + ":2: unknown setting 'no-such-setting'");
  refused("timeout-ms = 5\n\n[peer]\nlisten = \"x\"\n", ":3: [peer] is a table");
  refused("timeout-ms = = 5\n", "config file " + file + ":1");
  refused("timeout-ms = 1.5\n", "timeout-ms must be a string, a non-negative integer or a boolean");
  refused("execution-timeout-ms = -1\n", "execution-timeout-ms must be a string, a non-negative integer");
  refused("allow-uid = [1000, -1]\n", "allow-uid must hold strings or non-negative integers");
  // Every value is checked at its line, by the same declaration as the flag's.
  refused("timeout-ms = 100000000\n",
          "config file " + file + ":1: timeout-ms must be an integer from 1 to 86400000 (a day), not '100000000'");
  refused("log-level = \"info\"\nmetrics = \"9090\"\n", "config file " + file + ":2: metrics must be HOST:PORT, not '9090'");
  refused("reduce-threads = [1, 2]\n", "config file " + file + ":1: reduce-threads: takes one value, not 2");
  // A rule that joins two settings names where each came from.
  refused("timeout-ms = 5000\n\nmax-timeout-ms = 4000\n",
          "--max-timeout-ms must be at least --timeout-ms (max-timeout-ms at " + file + ":3, timeout-ms at " + file +
              ":1)");
  // A value the flag cannot take, and a setting given twice (in its two spellings), are named
  // at their line (were: no file or line, and "cannot be specified more than once").
  refused("log-level = \"info\"\ntimeout-ms = \"soon\"\n",
          "config file " + file + ":2: timeout-ms must be an integer from 1 to 86400000 (a day), not 'soon'");
  refused("timeout-ms = 5\ntimeout_ms = 6\n",
          "config file " + file + ":2: timeout-ms is set twice: here and at " + file + ":1");
  // A file other users could change would hand them the daemon's settings (who may connect).
  write_config("timeout-ms = 1234\n");
  REQUIRE(::chmod(pattern, 0666) == 0);
  {
    const auto [code, output] = run_daemon_command({"--config", file});
    INFO(output);
    CHECK(code == 2);
    CHECK_THAT(output, Catch::Contains("config file '" + file + "' is writable by other users (mode 0666)"));
  }
  REQUIRE(::chmod(pattern, 0620) == 0);  // group-writable: refused too
  CHECK(run_daemon_command({"--config", file}).first == 2);
  REQUIRE(::chmod(pattern, 0644) == 0);
  REQUIRE(::chown(pattern, 65534, 65534) == 0);  // nobody's
  {
    const auto [code, output] = run_daemon_command({"--config", file});
    INFO(output);
    CHECK(code == 2);
    CHECK_THAT(output, Catch::Contains("belongs to uid 65534, not to root or gradsyncd's user"));
  }
  REQUIRE(::chown(pattern, 0, 0) == 0);
  {
    TestDaemon daemon({"--config", pattern});  // 0644, root's: fine
    CHECK_THAT(daemon.log(), Catch::Contains("default timeout 1234 ms"));
  }
  ::unlink(pattern);
  const auto [code, output] = run_daemon_command({"--config", "/nonexistent/gradsyncd.toml"});
  CHECK(code == 2);
  CHECK_THAT(output, Catch::Contains("cannot read config file '/nonexistent/gradsyncd.toml'"));
}

// Was "CUDA driver version is insufficient", which sends an operator to upgrade a driver that
// is not there. Checked where the machine has no driver (CI, this test's machines).
TEST_CASE("gradsyncd: a machine with no NVIDIA driver is told so, and host jobs are served", "[integration][daemon]") {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY);
  TestDaemon daemon;
  check_still_serving(daemon);
  if (driver != nullptr) {
    ::dlclose(driver);
    WARN("this machine has an NVIDIA driver: the no-driver message is not checked");
    return;
  }
#if GRADSYNC_HAVE_CUDA
  CHECK_THAT(daemon.log(), Catch::Contains("CUDA: no usable GPU (no NVIDIA driver is installed"));
  CHECK_THAT(daemon.log(), !Catch::Contains("insufficient"));
#endif
}

// The peer port is the daemon's own listener: a busy one is one line naming the flag, not a
// dump of gRPC's internals.
TEST_CASE("gradsyncd: a peer port in use is refused in one line naming --peer-listen", "[integration][daemon]") {
  TestDaemon first({"--peer-listen", "127.0.0.1:0"});
  std::smatch port;
  const std::string log = first.log();
  REQUIRE(std::regex_search(log, port, std::regex(R"(peer service listening on 127\.0\.0\.1:\d+ \(port (\d+))")));
  const auto [code, output] = run_daemon_command({"--peer-listen", "127.0.0.1:" + port[1].str()});
  INFO(output);
  CHECK(code == 1);
  CHECK_THAT(output, Catch::Contains("cannot serve the peer service on 127.0.0.1:" + port[1].str() +
                                     ": Address already in use") && Catch::Contains("--peer-listen"));
  CHECK_THAT(output, !Catch::Contains("grpc") && !Catch::Contains("chttp2"));
  CHECK(first.running());
}

TEST_CASE("gradsyncd: a socket that another daemon serves is not taken over", "[integration][daemon]") {
  TestDaemon daemon;
  const auto [code, output] = run_daemon_command({"--socket", daemon.socket()});
  CHECK(code == 1);
  CHECK_THAT(output, Catch::Contains("another gradsyncd is already serving"));
  CHECK(daemon.running());
}

TEST_CASE("gradsyncd: SIGTERM fails running jobs, telling clients it shuts down, removes the socket and exits 0",
          "[integration][daemon]") {
  TestDaemon daemon;
  const std::string job = unique_job("sigterm");
  Latch pending;
  // Rank 0 has an operation waiting for rank 1, which registered and then stays away.
  ClientGroup ranks(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 4, "dp"}}), {});
    if (rank == 1) {
      ::pause();
      return kOk;
    }
    Work work = client->allreduce(set, ReduceOptions{});
    pending.open();
    try {
      work.wait(std::chrono::seconds(20));
      return fail("the pending operation succeeded");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kAborted) return fail(std::string("wrong code: ") + e.what());
      if (std::string(e.what()).find("gradsyncd is shutting down") == std::string::npos) {
        return fail(std::string("the client was not told why: ") + e.what());
      }
    }
    return kOk;
  });
  REQUIRE(pending.wait(std::chrono::seconds(20)));
  CHECK(exited_ok(daemon.terminate()));
  CHECK(exit_code(ranks.wait(0, std::chrono::seconds(20))) == kOk);
  CHECK(::access(daemon.socket().c_str(), F_OK) != 0);
  CHECK_THAT(daemon.log(), Catch::Contains("received SIGTERM"));
}

}  // namespace gradsync::test

namespace gradsync::test {

TEST_CASE("connections: a half-open frame and an idle connection that never joined are closed, a joined trainer is not",
          "[integration][control]") {
  TestDaemon daemon({"--connection-timeout-ms", "500"});
  // A frame header promising 1000 bytes (under the 64 KiB a request before joining may have),
  // one of them, then nothing: closed after the bound, told why.
  RawSocket half_open(daemon.socket());
  half_open.send(std::string("\xe8\x03\x00\x00\x00", 5));
  const auto start = std::chrono::steady_clock::now();
  const std::string reply = half_open.read_to_end();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_THAT(first_error(reply), Catch::Contains("a request frame was not completed within 500 ms"));
  CHECK(seconds < 5.0);
  // Connected, never a request: closed as idle.
  RawSocket idle(daemon.socket());
  CHECK_THAT(first_error(idle.read_to_end()), Catch::Contains("idle without joining a job for 500 ms"));
  // A trainer that joined stays connected however quiet it is, and then still steps.
  auto client = join(daemon.socket(), unique_job("quiet"), 0, 1);
  const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 8}}), {});
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(client->allreduce(set, ReduceOptions{}).wait(std::chrono::seconds(10)));
  CHECK_THAT(daemon.log(), Catch::Contains("--connection-timeout-ms 500"));
  CHECK(daemon.running());
}

}  // namespace gradsync::test

namespace gradsync::test {

TEST_CASE("hygiene: a client's string echoed in an error or logged is one bounded line, whatever it holds",
          "[integration][control]") {
  ClusterToken token;
  // The daemon is its own job's rendezvous, so the job waits for its second node (and stays)
  // rather than failing at once.
  const std::string rendezvous = "127.0.0.1:" + std::to_string(free_loopback_port());
  TestDaemon daemon({"--peer-token-file", token.path(), "--peer-listen", rendezvous});
  const std::string job = unique_job("hygiene");
  auto first = Client::connect(ConnectOptions{daemon.socket()});
  JoinOptions options{job, 0, 4, 0, 2};
  options.rendezvous = rendezvous;
  first->join(options);
  // The second rank names another rendezvous: 60 KB (a larger request is refused before it is
  // parsed) with a forged log line and a terminal escape in it.
  const std::string hostile = "x\n2026-01-01T00:00:00.000Z E gradsyncd: FORGED\x1b[31m" + std::string(60'000, 'y');
  auto second = Client::connect(ConnectOptions{daemon.socket()});
  JoinOptions other{job, 1, 4, 1, 2};
  other.rendezvous = hostile;
  try {
    second->join(other);
    FAIL("an inconsistent rendezvous was accepted");
  } catch (const Error& e) {
    const std::string message = e.status().message();
    CHECK_THAT(message, Catch::Contains("inconsistent rendezvous") && Catch::Contains("\\x0a2026") &&
                            Catch::Contains("\\x1b[31m") && Catch::Contains("more bytes)"));
    CHECK(message.size() < 2200);
  }
  std::istringstream log(daemon.log());
  size_t longest = 0;
  for (std::string line; std::getline(log, line);) {
    longest = std::max(longest, line.size());
    CHECK(line.find("E gradsyncd: FORGED") != 0);  // no line of the hostile's making
    CHECK(line.find('\x1b') == std::string::npos);
  }
  CHECK(longest < 4300);
  CHECK(daemon.running());
}

}  // namespace gradsync::test
