// test_fifo: the simplest correct scheduler, for tests of the scheduling plumbing. Chunks go out one per group in the
// order they were enqueued; the oldest waits (nothing overtakes it) until it fits the credit left, or goes alone when
// nothing is in flight (the ABI's escape for a chunk larger than the whole credit).
//
// Parameters: chunk_numel (default 0: whole tensors) is what partition answers; credit_bytes (default 0: unlimited)
// is what caps reports. Every id passed to on_complete must have been handed out and not yet completed.
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_set>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

class TestFifo final : public sdk::Scheduler {
 public:
  TestFifo(sdk::Params& params, sdk::Host& /*host*/)
      : chunk_numel_(params.getUint("chunk_numel", 0)), credit_bytes_(params.getUint("credit_bytes", 0)) {}

  terse_scheduler_caps_v1 caps() const override {
    terse_scheduler_caps_v1 caps{};
    caps.credit_bytes = credit_bytes_;
    return caps;
  }

  uint64_t partition(const terse_sched_tensor_v1& /*tensor*/) override { return chunk_numel_; }

  void enqueue(std::span<const terse_chunk_v1> chunks) override {
    for (const terse_chunk_v1& c : chunks) {
      if (!known_.insert(c.chunk_id).second) {
        throw sdk::InvalidArgument("enqueue: chunk " + std::to_string(c.chunk_id) + " is already pending or in flight");
      }
      pending_.push_back(c);
    }
  }

  size_t next(uint64_t credit_left, uint32_t flags, std::span<uint64_t> out) override {
    if (pending_.empty() || out.empty()) return 0;
    const terse_chunk_v1& oldest = pending_.front();
    if (oldest.wire_bytes > credit_left && (flags & TERSE_SCHED_NOTHING_IN_FLIGHT) == 0) return 0;
    out[0] = oldest.chunk_id;
    in_flight_.insert(oldest.chunk_id);
    pending_.pop_front();
    return 1;
  }

  void onComplete(std::span<const uint64_t> chunk_ids, uint64_t /*wire_bytes*/) override {
    for (uint64_t id : chunk_ids) {
      if (in_flight_.erase(id) == 0) {
        throw sdk::InvalidArgument("on_complete: chunk " + std::to_string(id) + " is not in flight");
      }
      known_.erase(id);
    }
  }

 private:
  uint64_t chunk_numel_;
  uint64_t credit_bytes_;
  std::deque<terse_chunk_v1> pending_;
  std::unordered_set<uint64_t> in_flight_;
  std::unordered_set<uint64_t> known_;  // pending or in flight
};

}  // namespace

TERSE_EXPORT_SCHEDULER(TestFifo, "test_fifo", "test: one chunk per group in enqueue order, within credit", "1.0.0");
