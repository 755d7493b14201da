#include "core/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/comm/nccl_bootstrap.h"
#include "core/comm/ring_model.h"
#include "core/comm/transport.h"
#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/common/error.h"

namespace terse::comm {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "nccl_bootstrap.h's unique id size must match nccl.h's");

namespace {

using Clock = std::chrono::steady_clock;

std::optional<ncclDataType_t> ncclSumType(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    default:
      return std::nullopt;
  }
}

// ---- The ring model of nccl_communicator.h's byte accounting (the formulas: ring_model.h).

// A broadcast from `root` runs the ring root -> root+1 -> ... -> root-1: every rank but the last forwards the bytes,
// every rank but the root receives them.
void addBroadcast(WireBytes& w, uint64_t bytes, int root, int rank, int n) {
  if (n <= 1 || bytes == 0) return;
  if (rank != (root + n - 1) % n) {
    w.sent_bytes += bytes;
    ++w.sent_frames;
  }
  if (rank != root) {
    w.received_bytes += bytes;
    ++w.received_frames;
  }
}

}  // namespace

// ---- Shared state

struct NcclCommunicator::Shared {
  int rank = 0;
  int size = 1;
  int device = 0;
  std::chrono::milliseconds op_timeout{};

  // Declared before the buffers, which are freed in its order (device_buffer.h), so it outlives them.
  std::optional<cuda::Stream> stream;
  cuda::DeviceBuffer words;       // allgatherSizes' n words, then barrier's one f32 (at offset 8n)
  cuda::PinnedBuffer host_words;  // allgatherSizes' staging, n words
  std::mutex sizes_mutex;         // allgatherSizes holds it from issue to copy-out: host_words is in use meanwhile

  // Held while issuing (an NCCL communicator is not thread-safe) and while polling a completion; never while sleeping.
  mutable std::mutex mutex;
  ncclComm_t comm = nullptr;             // guarded by mutex; null once aborted or destroyed
  bool aborted = false;                  // guarded by mutex
  std::string reason;                    // guarded by mutex: the first failure
  std::vector<cuda::Event> free_events;  // guarded by mutex: recycled, so a steady state creates none

  mutable std::mutex stats_mutex;
  DirectionTraffic sent;      // guarded by stats_mutex
  DirectionTraffic received;  // guarded by stats_mutex
  CommStats stats;            // guarded by stats_mutex

  std::string lastError() const { return comm != nullptr ? ncclGetLastError(comm) : ""; }

  // Requires mutex. Idempotent: the first reason wins.
  void abortLocked(const std::string& why) noexcept {
    if (aborted) return;
    aborted = true;
    reason = why;
    if (comm != nullptr) {
      // ncclCommAbort stops this rank's kernels in flight and frees the communicator; the device must be current.
      int previous = -1;
      cudaGetDevice(&previous);
      cudaSetDevice(device);
      ncclCommAbort(comm);
      comm = nullptr;
      if (previous >= 0) cudaSetDevice(previous);
      (void)cudaGetLastError();
    }
  }

  // Requires mutex: aborts, then throws CommError(what).
  [[noreturn]] void failLocked(const std::string& what) {
    abortLocked(what);
    TERSE_THROW(CommError, "nccl rank " << rank << ": " << what);
  }

  void checkOpenLocked(std::string_view what) const {
    if (aborted) TERSE_THROW(CommError, "nccl rank " << rank << ": " << what << ": communicator aborted: " << reason);
  }

  // Requires mutex. The communicator is non-blocking (ncclConfig_t::blocking = 0, so creation is bounded by a
  // timeout): a call may answer ncclInProgress, and the next NCCL call must wait until ncclCommGetAsyncError no longer
  // says so.
  void ncclLocked(ncclResult_t result, const char* call, Clock::time_point deadline) {
    if (result == ncclSuccess) return;
    if (result == ncclInProgress) {
      settleLocked(call, deadline);
      return;
    }
    failLocked(std::string(call) + " failed: " + ncclGetErrorString(result) + " (" + lastError() + ")");
  }

  // Requires mutex: polls until the communicator's pending NCCL call finished, failed or ran past the deadline. The
  // lock stays held: no other NCCL call may be issued meanwhile (only the initialization waits here for long).
  void settleLocked(const char* call, Clock::time_point deadline) {
    for (int spins = 0;; ++spins) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess)
        failLocked(std::string("ncclCommGetAsyncError after ") + call + ": " + ncclGetErrorString(r));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress)
        failLocked(std::string(call) + " failed: " + ncclGetErrorString(state) + " (" + lastError() + ")");
      if (Clock::now() > deadline)
        failLocked(std::string(call) + " did not complete in time (" + std::to_string(op_timeout.count()) +
                   " ms): a peer did not join or is stuck");
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Requires mutex: true once `event` completed; throws CommError after an abort, a device error or an NCCL error
  // reported asynchronously (a peer's failure, a network error).
  bool pollLocked(cudaEvent_t event, std::string_view what) {
    checkOpenLocked(what);
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      failLocked(std::string(what) + ": cudaEventQuery failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
    }
    if (comm != nullptr) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) failLocked(std::string(what) + ": ncclCommGetAsyncError failed: " + ncclGetErrorString(r));
      if (state != ncclSuccess && state != ncclInProgress)
        failLocked(std::string(what) + " failed: " + ncclGetErrorString(state) + " (" + lastError() + ")");
    }
    return false;
  }

  bool pollOnce(cudaEvent_t event, std::string_view what, Clock::time_point deadline) {
    std::lock_guard lock(mutex);
    if (pollLocked(event, what)) return true;
    if (Clock::now() > deadline)
      failLocked(std::string(what) + " did not complete within " + std::to_string(op_timeout.count()) +
                 " ms (a peer may be dead or stuck); the communicator was aborted");
    return false;
  }

  // Spins briefly (a small collective completes in microseconds), then sleeps between polls so a long wait does not
  // burn a core the trainer's host work needs.
  void waitEvent(cudaEvent_t event, std::string_view what, Clock::time_point deadline) {
    for (int spins = 0; !pollOnce(event, what, deadline); ++spins) {
      if (spins < 200) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // Requires mutex.
  cuda::Event takeEventLocked() {
    if (!free_events.empty()) {
      cuda::Event e = std::move(free_events.back());
      free_events.pop_back();
      return e;
    }
    cuda::DeviceGuard guard(device);  // an event records only on a stream of the device it was made on
    return cuda::Event();
  }
  void giveEvent(cuda::Event event) {
    std::lock_guard lock(mutex);
    free_events.push_back(std::move(event));
  }

  void account(OpKind kind, uint64_t tensor, uint64_t bytes, const WireBytes& wire, double seconds) {
    std::lock_guard lock(stats_mutex);
    auto add = [&](DirectionTraffic& d, uint64_t b, uint64_t frames) {
      const FrameCount c{b, frames};
      d.by_kind[static_cast<std::size_t>(kind)] += c;
      d.by_tensor[tensor] += c;
    };
    add(sent, wire.sent_bytes, wire.sent_frames);
    add(received, wire.received_bytes, wire.received_frames);
    OpStats& s = stats.by_kind[static_cast<std::size_t>(kind)];
    ++s.ops;
    s.bytes += bytes;
    s.seconds += seconds;
  }
};

namespace {

// What an operation is, for its completion: accounting and messages.
struct NcclOp {
  OpKind kind;
  uint64_t tensor;
  uint64_t bytes;  // the caller's bytes
  WireBytes wire;
  const char* what;
  Clock::time_point start;
  Clock::time_point deadline;
};

using Shared = NcclCommunicator::Shared;

// TERSE_NCCL_OP(shared, deadline, ncclAllReduce(...)): the call's text goes into the error message.
#define TERSE_NCCL_OP(shared, deadline, call) (shared).ncclLocked((call), #call, (deadline))

// A non-blocking operation: complete when the event recorded after it on the communicator's stream completed.
class NcclRequest final : public CommRequest::State {
 public:
  NcclRequest(std::shared_ptr<Shared> shared, cuda::Event event, const NcclOp& op)
      : shared_(std::move(shared)), event_(std::move(event)), op_(op) {
    wire = op.wire;
  }
  ~NcclRequest() override { shared_->giveEvent(std::move(event_)); }

  bool test() override {
    std::lock_guard lock(mutex_);
    if (!finished_) step(false);
    if (error_) std::rethrow_exception(error_);
    return finished_;
  }
  void wait() override {
    std::lock_guard lock(mutex_);
    if (!finished_) step(true);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void step(bool block) {
    try {
      if (block) {
        shared_->waitEvent(event_.get(), op_.what, op_.deadline);
      } else if (!shared_->pollOnce(event_.get(), op_.what, op_.deadline)) {
        return;
      }
      shared_->account(op_.kind, op_.tensor, op_.bytes, op_.wire,
                       std::chrono::duration<double>(Clock::now() - op_.start).count());
    } catch (...) {
      error_ = std::current_exception();
    }
    finished_ = true;
  }

  std::shared_ptr<Shared> shared_;
  cuda::Event event_;
  NcclOp op_;
  std::mutex mutex_;  // guards finished_ and error_: a handle's copies may be tested from several threads
  bool finished_ = false;
  std::exception_ptr error_;
};

NcclOp makeOp(const Shared& s, OpKind kind, uint64_t tensor, uint64_t bytes, WireBytes wire, const char* what) {
  const auto now = Clock::now();
  return NcclOp{kind, tensor, bytes, wire, what, now, now + s.op_timeout};
}

// Issues op's NCCL calls (body) on the stream under the lock and records `event` after them. Blocking calls are their
// non-blocking twins waited for (complete()), so each collective is written once.
template <class Body>
void issue(Shared& s, const NcclOp& op, cudaEvent_t event, Body&& body) {
  // The lock is held by the caller.
  s.checkOpenLocked(op.what);
  cuda::DeviceGuard guard(s.device);
  try {
    body(s.stream->get());
  } catch (const DeviceError& e) {
    // A CUDA call of the operation failed after part of it may be queued: the peers would wait for the rest.
    s.failLocked(std::string(op.what) + ": " + e.what());
  }
  const cudaError_t e = cudaEventRecord(event, s.stream->get());
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    s.failLocked(std::string(op.what) + ": cudaEventRecord failed: " + cudaGetErrorName(e) + ": " +
                 cudaGetErrorString(e));
  }
}

template <class Body>
CommRequest runAsync(const std::shared_ptr<Shared>& shared, const NcclOp& op, Body&& body) {
  Shared& s = *shared;
  std::lock_guard lock(s.mutex);
  s.checkOpenLocked(op.what);
  cuda::Event event = s.takeEventLocked();
  try {
    issue(s, op, event.get(), body);
  } catch (...) {
    s.free_events.push_back(std::move(event));
    throw;
  }
  return CommRequest(std::make_shared<NcclRequest>(shared, std::move(event), op));
}

// A blocking call: the request's wait accounts the operation and rethrows its failure, as communicator.h promises.
WireBytes complete(CommRequest request) {
  request.wait();
  return request.wire();
}

ncclDataType_t sumType(DType dtype, ReduceOp op) {
  TERSE_CHECK(op == ReduceOp::kSum, Unsupported, "allreduce: only the sum is implemented");
  const auto t = ncclSumType(dtype);
  TERSE_CHECK(t.has_value(), Unsupported, "allreduce: nccl cannot sum " << dtypeName(dtype) << " (f32, f16, bf16)");
  return *t;
}

std::span<std::byte> summedPart(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire) {
  TERSE_CHECK(prefix_bytes <= payload.size(), InvalidArgument,
              "allreduce payload: prefix of " << prefix_bytes << " bytes in a payload of " << payload.size());
  const std::size_t summed = payload.size() - prefix_bytes;
  TERSE_CHECK(summed % dtypeSize(wire) == 0, InvalidArgument,
              "allreduce payload: " << summed << " bytes after the prefix are not a whole number of " << dtypeName(wire)
                                    << " elements");
  return payload.subspan(prefix_bytes);
}

// The arguments of allgatherv, checked: every rank passes the same sizes, its own block is sizes[rank] bytes and recv
// holds them all.
struct GatherPlan {
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
};

GatherPlan planGather(std::span<const std::byte> send, std::span<std::byte> recv, std::span<const uint64_t> sizes,
                      int rank, int n) {
  TERSE_CHECK(sizes.size() == static_cast<std::size_t>(n), InvalidArgument,
              "allgatherv: " << sizes.size() << " sizes for " << n << " ranks");
  GatherPlan p;
  p.sizes.assign(sizes.begin(), sizes.end());
  for (uint64_t b : p.sizes) {
    p.offsets.push_back(p.total);
    p.total += b;
  }
  TERSE_CHECK(send.size() == p.sizes[static_cast<std::size_t>(rank)], InvalidArgument,
              "allgatherv: rank " << rank << " sends " << send.size() << " bytes but sizes says "
                                  << p.sizes[static_cast<std::size_t>(rank)]);
  TERSE_CHECK(recv.size() == p.total, InvalidArgument,
              "allgatherv: recv holds " << recv.size() << " bytes, the blocks add up to " << p.total);
  return p;
}

WireBytes gatherWire(const GatherPlan& p, int rank, int n) {
  WireBytes w;
  for (int i = 0; i < n; ++i) addBroadcast(w, p.sizes[static_cast<std::size_t>(i)], i, rank, n);
  return w;
}

// One grouped ncclBroadcast per nonempty block, each straight into its place in recv (nccl_communicator.h says why).
void enqueueGather(Shared& s, const GatherPlan& p, std::span<const std::byte> send, std::span<std::byte> recv,
                   cudaStream_t stream, Clock::time_point deadline) {
  if (p.total == 0) return;
  TERSE_NCCL_OP(s, deadline, ncclGroupStart());
  ncclResult_t first = ncclSuccess;
  for (int i = 0; i < s.size; ++i) {
    const uint64_t bytes = p.sizes[static_cast<std::size_t>(i)];
    if (bytes == 0) continue;
    std::byte* dst = recv.data() + p.offsets[static_cast<std::size_t>(i)];
    const void* src = i == s.rank ? static_cast<const void*>(send.data()) : dst;
    const ncclResult_t r = ncclBroadcast(src, dst, bytes, ncclUint8, i, s.comm, stream);
    if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
  }
  // The group is closed even after a failed call inside it: aborting a communicator with a group open is undefined.
  const ncclResult_t end = ncclGroupEnd();
  s.ncclLocked(first, "ncclBroadcast (allgatherv, one per rank)", deadline);
  s.ncclLocked(end, "ncclGroupEnd() after ncclBroadcast per rank (allgatherv)", deadline);
}

}  // namespace

// ---- Construction

NcclOptions ncclOptionsFromJob(const JobEnv& env, std::string store_prefix) {
  NcclOptions o;
  o.rank = env.rank;
  o.world_size = env.world_size;
  o.local_rank = env.local_rank;
  o.local_world_size = env.local_world_size;
  o.store_prefix = std::move(store_prefix);
  return o;
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

std::unique_ptr<NcclCommunicator> connectNcclCommunicator(const NcclOptions& options, Store& store) {
  TERSE_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size, InvalidArgument,
              "nccl: rank " << options.rank << " outside a world of " << options.world_size);
  TERSE_CHECK(options.timeout.count() > 0 && options.op_timeout.count() > 0, InvalidArgument,
              "nccl: timeout and op_timeout must be positive");
  // No driver or no device is a configuration problem of this node, said as such (deviceSummary never throws).
  const cuda::DeviceSummary summary = cuda::deviceSummary();
  TERSE_CHECK(summary.count > 0, InvalidArgument,
              "nccl: rank " << options.rank << " has no usable CUDA device (" << summary.reason << ")");
  const int count = summary.count;
  int device = options.device;
  if (device < 0) {
    device = selectCudaDevice(options.local_rank, options.local_world_size, count);
  } else {
    TERSE_CHECK(device < count, InvalidArgument, "nccl: device " << device << " requested, " << count << " visible");
  }
  // Left current for the calling thread: it allocates the buffers it hands to this communicator on this device.
  TERSE_CUDA_CHECK(cudaSetDevice(device));

  ncclUniqueId id;
  if (options.rank == 0) {
    TERSE_NCCL_CHECK(ncclGetUniqueId(&id));
    NcclUniqueIdBytes bytes;
    std::memcpy(bytes.data(), id.internal, bytes.size());
    publishNcclUniqueId(store, options.store_prefix, bytes);
  } else {
    const NcclUniqueIdBytes bytes = fetchNcclUniqueId(store, options.store_prefix, options.rank, options.timeout);
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }

  auto shared = std::make_shared<NcclCommunicator::Shared>();
  shared->rank = options.rank;
  shared->size = options.world_size;
  shared->device = device;
  shared->op_timeout = options.op_timeout;
  shared->stream.emplace();
  const auto n = static_cast<std::size_t>(options.world_size);
  shared->words = cuda::DeviceBuffer(8 * n + 8, shared->stream->get());
  shared->host_words = cuda::PinnedBuffer(8 * n);

  // Non-blocking creation: ncclCommInitRankConfig returns at once and the wait for the peers is ours to bound, so a
  // rank that never arrives is a CommError after options.timeout instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, options.world_size, id, options.rank, &config);
  std::lock_guard lock(shared->mutex);
  shared->comm = comm;
  if (r != ncclSuccess && r != ncclInProgress) {
    shared->failLocked(std::string("ncclCommInitRankConfig(rank ") + std::to_string(options.rank) + " of " +
                       std::to_string(options.world_size) + ", device " + std::to_string(device) +
                       ") failed: " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm) + ")");
  }
  TERSE_CHECK(comm != nullptr, InternalError, "ncclCommInitRankConfig returned no communicator");
  const auto saved = shared->op_timeout;
  shared->op_timeout = options.timeout;  // named in settleLocked's timeout message
  shared->settleLocked("ncclCommInitRankConfig (waiting for every rank to join)", Clock::now() + options.timeout);
  shared->op_timeout = saved;
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(shared)));
}

NcclCommunicator::~NcclCommunicator() {
  Shared& s = *shared_;
  bool clean = false;
  {
    std::lock_guard lock(s.mutex);
    if (s.aborted || s.comm == nullptr) return;
  }
  // Work still queued finishes first (bounded), so the destroy below does not free what a kernel still uses.
  try {
    std::optional<cuda::Event> event;
    {
      std::lock_guard lock(s.mutex);
      event.emplace(s.takeEventLocked());
      cuda::DeviceGuard guard(s.device);
      TERSE_CUDA_CHECK(cudaEventRecord(event->get(), s.stream->get()));
    }
    s.waitEvent(event->get(), "waiting for queued work before destroying the communicator",
                Clock::now() + s.op_timeout);
    clean = true;
  } catch (...) {
  }
  std::lock_guard lock(s.mutex);
  if (s.aborted || s.comm == nullptr) return;
  if (!clean) {
    s.abortLocked("communicator destroyed with work that did not complete");
    return;
  }
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(s.device);
  // Finalize flushes NCCL's own pending work (non-blocking: wait for it, bounded), then destroy frees locally.
  bool finalized = false;
  try {
    s.ncclLocked(ncclCommFinalize(s.comm), "ncclCommFinalize", Clock::now() + s.op_timeout);
    finalized = true;
  } catch (...) {
  }
  if (finalized) {
    ncclCommDestroy(s.comm);
    s.comm = nullptr;
  }
  s.aborted = true;
  if (s.reason.empty()) s.reason = "communicator destroyed";
  if (previous >= 0) cudaSetDevice(previous);
  (void)cudaGetLastError();
}

int NcclCommunicator::rank() const noexcept {
  return shared_->rank;
}
int NcclCommunicator::size() const noexcept {
  return shared_->size;
}
int NcclCommunicator::device() const noexcept {
  return shared_->device;
}
void* NcclCommunicator::stream() const noexcept {
  return shared_->stream->get();
}
bool NcclCommunicator::supportsSum(DType dtype) const noexcept {
  return ncclSumType(dtype).has_value();
}

// ---- Collectives

WireBytes NcclCommunicator::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, uint64_t tensor) {
  return complete(iallreduce(data, count, dtype, op, tensor));
}

CommRequest NcclCommunicator::iallreduce(void* data, std::size_t count, DType dtype, ReduceOp op, uint64_t tensor) {
  const ncclDataType_t t = sumType(dtype, op);
  TERSE_CHECK(data != nullptr || count == 0, InvalidArgument, "allreduce: data is null for " << count << " elements");
  Shared& s = *shared_;
  const uint64_t bytes = count * dtypeSize(dtype);
  const NcclOp o = makeOp(s, OpKind::kAllreduce, tensor, bytes, symmetricWire(ringAllreduceBytes(bytes, s.size)),
                          "iallreduce (ncclAllReduce)");
  return runAsync(shared_, o, [&](cudaStream_t stream) {
    if (count != 0) TERSE_NCCL_OP(s, o.deadline, ncclAllReduce(data, data, count, t, ncclSum, s.comm, stream));
  });
}

WireBytes NcclCommunicator::allreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                             uint64_t tensor) {
  return complete(iallreducePayload(payload, prefix_bytes, wire, tensor));
}

CommRequest NcclCommunicator::iallreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                                uint64_t tensor) {
  sumType(wire, ReduceOp::kSum);
  const std::span<std::byte> body = summedPart(payload, prefix_bytes, wire);
  return iallreduce(body.data(), body.size() / dtypeSize(wire), wire, ReduceOp::kSum, tensor);
}

WireBytes NcclCommunicator::allgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                                       std::span<const uint64_t> sizes, uint64_t tensor) {
  return complete(iallgatherv(send, recv, sizes, tensor));
}

CommRequest NcclCommunicator::iallgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                                          std::span<const uint64_t> sizes, uint64_t tensor) {
  Shared& s = *shared_;
  const GatherPlan p = planGather(send, recv, sizes, s.rank, s.size);
  const NcclOp o =
      makeOp(s, OpKind::kAllgather, tensor, p.total, gatherWire(p, s.rank, s.size), "iallgatherv (ncclBroadcast x n)");
  // The plan is used only while issuing, under the lock: the copy of `sizes` the interface promises is its use here.
  return runAsync(shared_, o, [&](cudaStream_t stream) { enqueueGather(s, p, send, recv, stream, o.deadline); });
}

WireBytes NcclCommunicator::allgatherSizes(uint64_t mine, std::span<uint64_t> all, uint64_t tensor) {
  Shared& s = *shared_;
  const auto n = static_cast<uint64_t>(s.size);
  TERSE_CHECK(all.size() == n, InvalidArgument, "allgatherSizes: " << all.size() << " slots for " << n << " ranks");
  const NcclOp o = makeOp(s, OpKind::kAllgather, tensor, 8 * n, symmetricWire(ringAllgatherBytes(8, s.size)),
                          "allgatherSizes (ncclAllGather)");
  std::lock_guard sizes_lock(s.sizes_mutex);  // host_words is this call's until the copy-out below
  auto* host = s.host_words.as<uint64_t>();
  auto* dev = s.words.as<uint64_t>();
  host[0] = mine;
  const WireBytes w = complete(runAsync(shared_, o, [&](cudaStream_t stream) {
    // In place (sendbuff = recvbuff + rank): NCCL then copies nothing locally.
    uint64_t* slot = dev + s.rank;
    TERSE_CUDA_CHECK(cudaMemcpyAsync(slot, host, 8, cudaMemcpyHostToDevice, stream));
    TERSE_NCCL_OP(s, o.deadline, ncclAllGather(slot, dev, 1, ncclUint64, s.comm, stream));
    TERSE_CUDA_CHECK(cudaMemcpyAsync(host, dev, 8 * n, cudaMemcpyDeviceToHost, stream));
  }));
  std::memcpy(all.data(), host, 8 * n);
  return w;
}

WireBytes NcclCommunicator::broadcast(std::span<std::byte> data, int root, uint64_t tensor) {
  return complete(ibroadcast(data, root, tensor));
}

CommRequest NcclCommunicator::ibroadcast(std::span<std::byte> data, int root, uint64_t tensor) {
  Shared& s = *shared_;
  TERSE_CHECK(root >= 0 && root < s.size, InvalidArgument,
              "broadcast: root must be in [0, " << s.size << "), got " << root);
  WireBytes w;
  addBroadcast(w, data.size(), root, s.rank, s.size);
  const NcclOp o = makeOp(s, OpKind::kBroadcast, tensor, data.size(), w, "ibroadcast (ncclBroadcast)");
  return runAsync(shared_, o, [&](cudaStream_t stream) {
    if (!data.empty())
      TERSE_NCCL_OP(s, o.deadline,
                    ncclBroadcast(data.data(), data.data(), data.size(), ncclUint8, root, s.comm, stream));
  });
}

// A barrier is an allreduce of one f32 on the communicator's own word: NCCL has no barrier, and an allreduce returns on
// no rank before every rank contributed. The word's value is never read.
WireBytes NcclCommunicator::barrier() {
  return complete(ibarrier());
}

CommRequest NcclCommunicator::ibarrier() {
  Shared& s = *shared_;
  const NcclOp o = makeOp(s, OpKind::kBarrier, kNoTensor, 0, symmetricWire(ringAllreduceBytes(4, s.size)),
                          "ibarrier (ncclAllReduce of one f32)");
  return runAsync(shared_, o, [&](cudaStream_t stream) {
    float* word = reinterpret_cast<float*>(s.words.as<uint64_t>() + s.size);
    TERSE_NCCL_OP(s, o.deadline, ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, s.comm, stream));
  });
}

// ---- Abort, accounting

void NcclCommunicator::abort(const std::string& reason) {
  std::lock_guard lock(shared_->mutex);
  shared_->abortLocked(reason);
}

bool NcclCommunicator::aborted() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->aborted;
}

RankTraffic NcclCommunicator::traffic() const {
  std::lock_guard lock(shared_->stats_mutex);
  RankTraffic t;
  t.rank = shared_->rank;
  t.sent = shared_->sent;
  t.received = shared_->received;
  return t;
}

void NcclCommunicator::resetTraffic() {
  std::lock_guard lock(shared_->stats_mutex);
  shared_->sent = DirectionTraffic{};
  shared_->received = DirectionTraffic{};
}

CommStats NcclCommunicator::stats() const {
  std::lock_guard lock(shared_->stats_mutex);
  return shared_->stats;
}

}  // namespace terse::comm
