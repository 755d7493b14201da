// The NCCL communicator (DESIGN.md section 6): the Communicator interface (communicator.h) over NCCL's collectives,
// one process per GPU, bootstrapped through the rendezvous store (nccl_bootstrap.h). Built only with CUDA and NCCL
// (TERSE_HAVE_NCCL); this header does not include nccl.h, so its users need only the CUDA runtime headers.
//
// Buffers. Every data pointer and span handed to this communicator is DEVICE memory on its device() (cudaMalloc,
// cudaMallocAsync or managed memory); `sizes` and allgatherSizes' host-side words are host memory. The data must be
// ready when the call is issued as seen from stream(): the communicator's stream does not wait on other streams, so a
// producer either runs on stream() or the caller makes stream() wait on its event first.
//
// Streams and completion. Every operation is enqueued on the communicator's one non-blocking stream, in issue order
// (the same order on every rank, as communicator.h requires). A blocking call returns once its work finished on the
// device; a non-blocking one returns a CommRequest that completes when a CUDA event recorded after the operation
// completes. While waiting, the communicator polls ncclCommGetAsyncError (a peer's failure surfaces as an error instead
// of a hang) and bounds the wait by NcclOptions::op_timeout (NCCL's watchdog habit: a silent peer becomes a CommError
// on every rank whose wait expires, after ncclCommAbort).
//
// Abort. abort() calls ncclCommAbort, which stops the kernels in flight and frees the communicator; every pending and
// later call throws CommError naming the first reason. A failed NCCL call or an expired wait aborts the same way, so
// the next call on that rank fails fast; the peers see NCCL's own remote error, or their own timeout.
//
// Byte accounting. NCCL does not report what it moved, so traffic() and the WireBytes of each call count what NCCL's
// ring algorithms move per rank, the model nccl-tests' busbw uses: an allreduce of B bytes sends and receives 2(n-1)/n
// x B (reduce-scatter then allgather); an allgather of n blocks of b sends and receives (n-1) x b; a broadcast of B
// sends B on every rank but the ring's last (the one before the root) and receives B on every rank but the root.
// Integer division rounds down. There are no frame headers: each NCCL collective that moves bytes counts as one frame
// per direction. Trees, NVLS and the LL protocols' flag words move other amounts; the model is what results compare
// across transports, and world size 1 moves nothing.
//
// Variable-size allgather. allgatherv runs one ncclBroadcast per rank with a nonzero block, grouped (ncclGroupStart /
// ncclGroupEnd: one launch, the broadcasts share the channels) straight into the caller's recv at each rank's offset.
// The alternative, padding every block to the largest and running one ncclAllGather into scratch, moves n x max bytes
// instead of the sum and needs a scratch buffer of n x max plus a compaction copy; sparsified payloads are exactly the
// case where sizes differ (a rank may send nothing), so the grouped broadcasts move the exact bytes and allocate
// nothing. The sizes themselves come from allgatherSizes (one ncclAllGather of 8-byte words).
//
// Threads. Calls may come from several threads; issuing is serialized by a mutex (an NCCL communicator is not
// thread-safe), and the order in which calls are issued is the order on the wire.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "core/comm/communicator.h"
#include "core/comm/job.h"
#include "core/comm/store.h"

namespace terse::comm {

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // picks the device (selectCudaDevice) when device is -1
  int local_world_size = 1;  // processes on this node
  int device = -1;           // the CUDA device; -1: by local rank
  // Namespaces the unique id's key in a shared store (nccl_bootstrap.h), like TcpOptions::store_prefix.
  std::string store_prefix;
  // Bounds the bootstrap: rank > 0 waiting for the unique id, and every rank waiting for ncclCommInitRank.
  std::chrono::milliseconds timeout{60000};
  // Bounds every wait for an operation; past it the communicator is aborted. Generous: nothing legitimate on a
  // gradient path takes minutes, and a hung job costs more than a slow one.
  std::chrono::milliseconds op_timeout{300000};
};

// Rank, world size and local rank from a detected job (job.h: terse launch, OpenMPI or SLURM).
NcclOptions ncclOptionsFromJob(const JobEnv& env, std::string store_prefix = {});

class NcclCommunicator;

// Collective: every rank of the job calls it with the same world size, store and prefix. Picks and makes current the
// rank's device (cudaSetDevice, left set for the calling thread, which allocates its buffers there), exchanges the
// unique id through the store (rank 0 publishes it) and creates the NCCL communicator. Throws InvalidArgument for bad
// options or a missing device, CommError when the unique id or the peers do not arrive within options.timeout,
// DeviceError naming the failed CUDA or NCCL call.
std::unique_ptr<NcclCommunicator> connectNcclCommunicator(const NcclOptions& options, Store& store);

class NcclCommunicator final : public Communicator {
 public:
  // Waits (bounded by op_timeout) for the work still queued, then destroys the NCCL communicator; aborts it instead
  // when that work fails or an abort already happened (a destructor must not hang on a dead peer).
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string_view backend() const noexcept override { return "nccl"; }
  int rank() const noexcept override;
  int size() const noexcept override;
  // f32, f16 and bf16: the sums the pipeline needs; NCCL has more, but a wire dtype outside these is not a SUM wire.
  bool supportsSum(DType dtype) const noexcept override;
  int device() const noexcept;
  // The stream every operation runs on (a cudaStream_t).
  void* stream() const noexcept;
  bool deviceMemory() const noexcept override { return true; }
  void* deviceStream() const noexcept override { return stream(); }

  WireBytes allreduce(void* data, std::size_t count, DType dtype, ReduceOp op = ReduceOp::kSum,
                      uint64_t tensor = kNoTensor) override;
  WireBytes allreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                             uint64_t tensor = kNoTensor) override;
  WireBytes allgatherv(std::span<const std::byte> send, std::span<std::byte> recv, std::span<const uint64_t> sizes,
                       uint64_t tensor = kNoTensor) override;
  // `mine` and `all` are host values; the exchange goes through a device buffer the communicator owns.
  WireBytes allgatherSizes(uint64_t mine, std::span<uint64_t> all, uint64_t tensor = kNoTensor) override;
  WireBytes broadcast(std::span<std::byte> data, int root, uint64_t tensor = kNoTensor) override;
  WireBytes barrier() override;

  CommRequest iallreduce(void* data, std::size_t count, DType dtype, ReduceOp op = ReduceOp::kSum,
                         uint64_t tensor = kNoTensor) override;
  CommRequest iallreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                uint64_t tensor = kNoTensor) override;
  CommRequest iallgatherv(std::span<const std::byte> send, std::span<std::byte> recv, std::span<const uint64_t> sizes,
                          uint64_t tensor = kNoTensor) override;
  CommRequest ibroadcast(std::span<std::byte> data, int root, uint64_t tensor = kNoTensor) override;
  CommRequest ibarrier() override;

  void abort(const std::string& reason) override;
  bool aborted() const;

  RankTraffic traffic() const override;
  void resetTraffic() override;
  CommStats stats() const override;

  // State shared with the requests in flight, which may outlive the communicator.
  struct Shared;

 private:
  friend std::unique_ptr<NcclCommunicator> connectNcclCommunicator(const NcclOptions& options, Store& store);
  explicit NcclCommunicator(std::shared_ptr<Shared> shared);

  std::shared_ptr<Shared> shared_;
};

}  // namespace terse::comm
