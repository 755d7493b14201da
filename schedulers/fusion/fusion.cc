// fusion: tensor fusion into buckets of up to `bucket_bytes` wire bytes, each bucket one collective -- PyTorch DDP's
// gradient buckets (Li et al. VLDB 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training") and
// Horovod's fusion buffer (Sergeev and Del Balso 2018). Fewer, larger collectives pay the per-collective latency
// (2(n-1) ring steps) once per bucket instead of once per tensor, which matters for many small tensors (biases).
//
// Order: gradient-ready order, whole tensors. A bucket is handed out when it is full -- the next ready tensor would
// overflow it -- or when every tensor of the step is enqueued (the flush); a tensor larger than the cap goes alone.
// Sizes are wire bytes after compression (what the fused collective moves). The core concatenates the bucket's payloads
// and compresses per tensor (core/compress/engine.h), so fusion never changes the math.
//
// Parameters:
//   bucket_bytes  integer >= 1, default 4194304 (4 MiB; DDP's default cap is 25 MiB, sized for far larger models)
//   credit_bytes  integer >= 0, default 0 (unlimited): most wire bytes in flight; a bucket is cut to fit it
#include <cstdint>
#include <deque>
#include <string>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

class Fusion final : public sdk::Scheduler {
 public:
  Fusion(sdk::Params& params, sdk::Host& /*host*/)
      : bucket_bytes_(params.getUint("bucket_bytes", uint64_t{4} << 20, sdk::Range::atLeast(1))),
        credit_bytes_(params.getUint("credit_bytes", 0)) {}

  terse_scheduler_caps_v1 caps() const override {
    terse_scheduler_caps_v1 c{};
    c.credit_bytes = credit_bytes_;
    return c;
  }

  uint64_t partition(const terse_sched_tensor_v1& /*tensor*/) override { return 0; }  // whole tensors

  void enqueue(std::span<const terse_chunk_v1> chunks) override {
    for (const terse_chunk_v1& c : chunks) pending_.push_back(Item{c.chunk_id, c.wire_bytes});
  }

  size_t next(uint64_t credit_left, uint32_t flags, std::span<uint64_t> out) override {
    if (pending_.empty() || out.empty()) return 0;
    const bool flush = (flags & TERSE_SCHED_ALL_ENQUEUED) != 0;
    const bool idle = (flags & TERSE_SCHED_NOTHING_IN_FLIGHT) != 0;
    const uint64_t cap = bucket_bytes_ < credit_left ? bucket_bytes_ : credit_left;
    // The bucket: the longest prefix of ready tensors within the cap (at least the first one).
    size_t n = 0;
    uint64_t bytes = 0;
    while (n < pending_.size() && n < out.size()) {
      const uint64_t next_bytes = pending_[n].wire_bytes;
      if (n > 0 && next_bytes > cap - bytes) break;
      if (n == 0 && next_bytes > cap) {
        // Larger than a whole bucket: alone. Over the credit it may go only when nothing is in flight (the ABI rule).
        if (next_bytes > credit_left && !idle) return 0;
        n = 1;
        bytes = next_bytes;
        break;
      }
      bytes += next_bytes;
      ++n;
    }
    // Full when the next ready tensor does not fit; otherwise wait for more unless this is the step's flush.
    const bool full = n < pending_.size() || bytes == cap;
    if (!full && !flush) return 0;
    for (size_t i = 0; i < n; ++i) {
      out[i] = pending_.front().id;
      pending_.pop_front();
    }
    return n;
  }

  void onComplete(std::span<const uint64_t> /*chunk_ids*/, uint64_t /*wire_bytes*/) override {}

 private:
  struct Item {
    uint64_t id;
    uint64_t wire_bytes;
  };
  uint64_t bucket_bytes_;
  uint64_t credit_bytes_;
  std::deque<Item> pending_;  // ready order
};

}  // namespace

TERSE_EXPORT_SCHEDULER(Fusion, "fusion", "DDP/Horovod-style buckets of whole tensors up to bucket_bytes, ready order",
                       "1.0.0");
