// fifo: gradients communicated whole, one tensor per collective, in the order backward made them ready -- what a
// data-parallel trainer does without a scheduler, and terse's default. Later layers' gradients are ready first, so the
// first layer, which the next forward needs first, goes last: the baseline priority scheduling (P3, Jayarajan et al.
// 2019; ByteScheduler, Peng et al. SOSP 2019) improves on.
//
// Parameters: none. Credit: unlimited (one tensor per group, so nothing to limit).
#include <cstdint>
#include <deque>
#include <string>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

class Fifo final : public sdk::Scheduler {
 public:
  Fifo(sdk::Params& /*params*/, sdk::Host& /*host*/) {}

  terse_scheduler_caps_v1 caps() const override { return terse_scheduler_caps_v1{}; }

  uint64_t partition(const terse_sched_tensor_v1& /*tensor*/) override { return 0; }  // whole tensors

  void enqueue(std::span<const terse_chunk_v1> chunks) override {
    for (const terse_chunk_v1& c : chunks) pending_.push_back(c.chunk_id);
  }

  size_t next(uint64_t /*credit_left*/, uint32_t /*flags*/, std::span<uint64_t> out) override {
    // Unlimited credit: credit_left is UINT64_MAX, so the oldest always fits.
    if (pending_.empty() || out.empty()) return 0;
    out[0] = pending_.front();
    pending_.pop_front();
    return 1;
  }

  void onComplete(std::span<const uint64_t> /*chunk_ids*/, uint64_t /*wire_bytes*/) override {}

 private:
  std::deque<uint64_t> pending_;  // chunk ids in ready order
};

}  // namespace

TERSE_EXPORT_SCHEDULER(Fifo, "fifo", "whole tensors, one per collective, in gradient-ready order (the default)",
                       "1.0.0");
