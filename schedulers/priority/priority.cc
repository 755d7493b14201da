// priority: priority-based parameter propagation, P3 (Jayarajan et al. SysML 2019, "Priority-based Parameter
// Propagation for Distributed DNN Training") as generalised by ByteScheduler (Peng et al. SOSP 2019, "A Generic
// Communication Scheduler for Distributed DNN Training Acceleration").
//
// Backward makes the LAST layer's gradient ready first, but the next iteration's forward needs the FIRST layer first.
// So tensors are cut into chunks of `partition_bytes` (before compression), each chunk's priority is its layer index
// (lower = sooner), and the communication thread always takes the most urgent ready chunk: when layer 0's gradient
// becomes ready it overtakes whatever later-layer chunks are still queued -- preemption at chunk boundaries, since a
// collective already started is never interrupted. The core applies each layer's update as soon as all its chunks are
// reduced and gates the next forward per layer, so layer 0's forward overlaps the remaining layers' communication.
//
// Credit (ByteScheduler's credit-based preemption): at most `credit_bytes` wire bytes in flight. A group takes the
// most urgent chunks in strict priority order while they fit the credit left; the first one that does not fit ends the
// group (never skipped for a smaller, less urgent one). A larger credit means fewer, larger collectives (less
// per-collective latency) but a longer wait for a newly ready urgent chunk; partition_bytes trades the same way.
//
// Order is strict and deterministic: (layer_index, tensor_id, chunk_index), smallest first. It depends only on what was
// enqueued and the credit, so every rank issues the same groups in the same order.
//
// Math: cutting a tensor does not change elementwise compressors (none, fp16, bf16: bit-identical results up to the
// allreduce's summation order, see core/compress/engine.h) but does change non-elementwise ones: top-k keeps the
// top k of each chunk, QSGD/onebit scale per chunk, PowerSGD factors each chunk -- as ByteScheduler's partitioning
// does.
//
// Parameters:
//   partition_bytes  integer >= 4, default 524288 (512 KiB): chunk size before compression
//   credit_bytes     integer >= 0, default = partition_bytes; 0 = unlimited
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

class Priority final : public sdk::Scheduler {
 public:
  Priority(sdk::Params& params, sdk::Host& /*host*/)
      : partition_bytes_(params.getUint("partition_bytes", uint64_t{512} << 10, sdk::Range::atLeast(4))),
        credit_bytes_(params.getUint("credit_bytes", partition_bytes_)) {}

  terse_scheduler_caps_v1 caps() const override {
    terse_scheduler_caps_v1 c{};
    c.credit_bytes = credit_bytes_;
    return c;
  }

  uint64_t partition(const terse_sched_tensor_v1& tensor) override {
    const uint64_t esize = tensor.numel == 0 ? 1 : tensor.bytes / tensor.numel;
    const uint64_t numel = partition_bytes_ / (esize == 0 ? 1 : esize);
    return numel == 0 ? 1 : numel;
  }

  void enqueue(std::span<const terse_chunk_v1> chunks) override {
    for (const terse_chunk_v1& c : chunks) {
      const Key key{c.layer_index, c.tensor_id, c.chunk_index, c.chunk_id};
      if (!ready_.insert(key).second)
        throw sdk::InvalidArgument("enqueue: chunk " + std::to_string(c.chunk_id) + " twice");
      wire_bytes_[c.chunk_id] = c.wire_bytes;
    }
  }

  size_t next(uint64_t credit_left, uint32_t flags, std::span<uint64_t> out) override {
    const bool idle = (flags & TERSE_SCHED_NOTHING_IN_FLIGHT) != 0;
    size_t n = 0;
    uint64_t bytes = 0;
    for (auto it = ready_.begin(); it != ready_.end() && n < out.size();) {
      const uint64_t id = std::get<3>(*it);
      const uint64_t b = wire_bytes_.at(id);
      const bool fits = b <= credit_left - bytes;
      // The most urgent chunk may exceed the whole credit only when nothing is in flight (it goes alone then).
      if (!fits && !(n == 0 && idle)) break;
      out[n++] = id;
      bytes += b;
      wire_bytes_.erase(id);
      it = ready_.erase(it);
      if (!fits) break;
    }
    return n;
  }

  void onComplete(std::span<const uint64_t> /*chunk_ids*/, uint64_t /*wire_bytes*/) override {}

 private:
  using Key = std::tuple<int32_t, uint64_t, int32_t, uint64_t>;  // layer, tensor, chunk index, chunk id
  uint64_t partition_bytes_;
  uint64_t credit_bytes_;
  std::set<Key> ready_;                                // enqueued, not handed out; most urgent first
  std::unordered_map<uint64_t, uint64_t> wire_bytes_;  // chunk id -> wire bytes
};

}  // namespace

TERSE_EXPORT_SCHEDULER(Priority, "priority",
                       "P3/ByteScheduler: partition_bytes chunks, front layers first, credit_bytes in flight", "1.0.0");
