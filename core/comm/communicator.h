// The communicator the trainer and the compression pipeline use (DESIGN.md section 2): collectives on the gradient
// path, blocking and non-blocking, plus what they cost on the wire. HostCommunicator (host_communicator.h) runs the
// algorithms of this folder over a Transport (inproc or tcp); NcclCommunicator (nccl_communicator.h) implements the
// same interface with NCCL's collectives on device memory.
//
// Rules every implementation keeps:
//  - Collectives are issued in the same order on every rank (blocking and non-blocking ones share that order); each
//    gets the next tag of the communicator's sequence, so operations in flight at once never mix.
//  - Buffers passed to a non-blocking call must stay valid and untouched until its request completed.
//  - A failure on any rank aborts the communicator on every rank: the failing call throws its error, every pending and
//    later call on any rank throws CommError naming the first failure. Nothing hangs.
//  - `tensor` labels the operation's frames in the byte accounting (traffic.h); kNoTensor when it serves no tensor.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/comm/collective.h"
#include "core/comm/request.h"
#include "core/comm/traffic.h"
#include "core/common/dtype.h"

namespace terse::comm {

enum class ReduceOp { kSum };

enum class AllreduceAlgorithm {
  kAuto,
  kRing,
  kRecursiveDoubling,
  kHierarchical,
  kTree,
  kHalvingDoubling,
  kReduceBroadcast
};
// "auto", "ring", "rd", "hierarchical", "tree", "hd", "reduce_broadcast"
std::string_view allreduceAlgorithmName(AllreduceAlgorithm a) noexcept;
// A name above, or the long forms "recursive_doubling", "halving_doubling" (also "rabenseifner"); nullopt otherwise.
std::optional<AllreduceAlgorithm> parseAllreduceAlgorithm(std::string_view name) noexcept;
// The accepted names for messages: "ring, rd, hd, tree, reduce_broadcast, hierarchical or auto".
std::string_view allreduceAlgorithmChoices() noexcept;

// The allgatherv algorithm: the ring (allgatherv_ring.h), Bruck's (allgather_bruck.h), the two-level one
// (allgatherv_hierarchical.h), or auto (allgather_auto.h) by world, node size and gathered bytes.
enum class AllgatherAlgorithm { kAuto, kRing, kBruck, kHierarchical };
// "auto", "ring", "bruck", "hierarchical"
std::string_view allgatherAlgorithmName(AllgatherAlgorithm a) noexcept;
// A name above; nullopt otherwise.
std::optional<AllgatherAlgorithm> parseAllgatherAlgorithm(std::string_view name) noexcept;
// The accepted names for messages: "ring, bruck, hierarchical or auto".
std::string_view allgatherAlgorithmChoices() noexcept;

// A non-blocking collective in flight. wait() rethrows the operation's error.
class CommRequest {
 public:
  struct State : RequestImpl {
    Completion done;
    WireBytes wire;  // written before done completes
    bool test() override { return done.test(); }
    void wait() override { done.wait(); }
  };

  CommRequest() = default;
  explicit CommRequest(std::shared_ptr<State> state) : state_(std::move(state)) {}
  bool valid() const noexcept { return state_ != nullptr; }
  bool test() { return state_ == nullptr || state_->test(); }
  void wait() {
    if (state_) state_->wait();
  }
  // What the operation put on the wire from this rank; valid once complete.
  const WireBytes& wire() const { return state_->wire; }

 private:
  std::shared_ptr<State> state_;
};

// Per operation kind: how many ran and how long they took on the thread that ran them.
struct OpStats {
  uint64_t ops = 0;
  uint64_t bytes = 0;  // the caller's bytes (message sizes), not wire bytes
  double seconds = 0;
};
struct CommStats {
  std::array<OpStats, kNumOpKinds> by_kind{};
  const OpStats& kind(OpKind k) const { return by_kind[static_cast<std::size_t>(k)]; }
};

class CommChannel;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::string_view backend() const noexcept = 0;  // "inproc", "tcp", "nccl"
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // Whether allreduce can sum elements of this type (the pipeline checks a SUM compressor's wire dtype with it).
  virtual bool supportsSum(DType dtype) const noexcept = 0;
  // Where the data of every call lives: host memory (false; the transports' communicators) or CUDA device memory
  // (true; NCCL), ordered on deviceStream(). Host-side words (sizes, allgatherSizes) are host memory either way.
  virtual bool deviceMemory() const noexcept { return false; }
  // The cudaStream_t (as void*) a device communicator orders its operations on; null for a host communicator. Work
  // that produces a collective's input on this stream needs no further synchronization with it.
  virtual void* deviceStream() const noexcept { return nullptr; }
  // The algorithm an allreduce of `bytes` summed bytes runs here, auto resolved, as allreduceAlgorithmName spells it;
  // the backend's name where a library picks its own (NCCL). A step trace (core/train/step_trace.h) records it per
  // collective, since what `auto` chose is what a replay must run again.
  virtual std::string_view allreduceAlgorithmRun(uint64_t /*bytes*/) const noexcept { return backend(); }
  // The same for an allgatherv gathering `total_bytes` in all (a size exchange: 8 bytes per rank).
  virtual std::string_view allgatherAlgorithmRun(uint64_t /*total_bytes*/) const noexcept { return backend(); }
  // The same for allgatherControl's exchange (below): by default it is allgatherSizes'.
  virtual std::string_view controlAlgorithmRun() const noexcept {
    return allgatherAlgorithmRun(8 * static_cast<uint64_t>(size()));
  }

  // ---- Blocking. Each returns what this rank put on the wire for the operation (headers included).

  // data (count elements of dtype) = elementwise sum over ranks, in place.
  virtual WireBytes allreduce(void* data, std::size_t count, DType dtype, ReduceOp op = ReduceOp::kSum,
                              uint64_t tensor = kNoTensor) = 0;
  // The SUM path of a compressor payload (compressor_v1.h): bytes [prefix_bytes, size) are summed as `wire` elements
  // in place; the first prefix_bytes are identical on every rank by the ABI's contract, so they are neither sent nor
  // summed and keep this rank's copy. They are not compared across ranks either (that would cost the bytes SUM exists
  // to save); the plugin validates the header when it decompresses the aggregate.
  virtual WireBytes allreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                     uint64_t tensor = kNoTensor) = 0;
  // recv = every rank's block in rank order; sizes[i] = rank i's block bytes (0 allowed), identical on every rank.
  virtual WireBytes allgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                               std::span<const uint64_t> sizes, uint64_t tensor = kNoTensor) = 0;
  // all[i] = rank i's `mine` (an allgather of 8-byte words): how allgatherv's sizes are learned when they vary.
  virtual WireBytes allgatherSizes(uint64_t mine, std::span<uint64_t> all, uint64_t tensor = kNoTensor) = 0;
  // The same exchange for control decisions (the sync trainer's negotiation before each group): latency-bound, so the
  // host communicator takes Bruck's ceil(log2 n) rounds (allgather_bruck.h) instead of the ring's n - 1. The sizes
  // of allgatherv keep the ring, whose frames the wire-byte models count (DESIGN.md section 6).
  virtual WireBytes allgatherControl(uint64_t mine, std::span<uint64_t> all, uint64_t tensor = kNoTensor) {
    return allgatherSizes(mine, all, tensor);
  }
  virtual WireBytes broadcast(std::span<std::byte> data, int root, uint64_t tensor = kNoTensor) = 0;
  virtual WireBytes barrier() = 0;

  // ---- Non-blocking versions: the operation runs while the caller computes; its tag is drawn now.
  virtual CommRequest iallreduce(void* data, std::size_t count, DType dtype, ReduceOp op = ReduceOp::kSum,
                                 uint64_t tensor = kNoTensor) = 0;
  virtual CommRequest iallreducePayload(std::span<std::byte> payload, std::size_t prefix_bytes, DType wire,
                                        uint64_t tensor = kNoTensor) = 0;
  // `sizes` is copied.
  virtual CommRequest iallgatherv(std::span<const std::byte> send, std::span<std::byte> recv,
                                  std::span<const uint64_t> sizes, uint64_t tensor = kNoTensor) = 0;
  virtual CommRequest ibroadcast(std::span<std::byte> data, int root, uint64_t tensor = kNoTensor) = 0;
  virtual CommRequest ibarrier() = 0;

  // Fails every pending and later operation of every rank with CommError(reason) (NCCL: ncclCommAbort). Idempotent.
  virtual void abort(const std::string& reason) = 0;

  // This rank's byte accounting as the transport counted it; thread-safe.
  virtual RankTraffic traffic() const = 0;
  virtual void resetTraffic() = 0;
  virtual CommStats stats() const = 0;

  // A door for one more thread that runs blocking collectives while others run theirs (the sync trainer's groups in
  // flight at once, sync_trainer.h); nullptr when this communicator runs one collective at a time (NCCL on its one
  // stream). See CommChannel.
  virtual std::unique_ptr<CommChannel> openChannel() { return nullptr; }
};

// Collectives of one thread beside the communicator's own sequence. The parent's tags come from one sequence drawn in
// issue order, which threads racing for it would draw in a different order on every rank; a channel's operations
// instead take their tags from the namespace of the id last passed to select() (0, 1, 2, ... within it), so two
// operations in flight at once never share a tag as long as every rank selects the same id for the same operations
// and no two channels use one id at a time. The sync trainer selects the run-wide number of the group a channel
// runs, which the negotiation makes the same on every rank. A channel has its own scratch and its own stats (only its
// operations; the parent's stats count them too); byte accounting, abort and failures are the parent's. Blocking calls
// only: its non-blocking ones run at once and return a completed request. One thread at a time; the parent must
// outlive it.
class CommChannel : public Communicator {
 public:
  virtual void select(uint64_t id) = 0;
};

}  // namespace terse::comm
