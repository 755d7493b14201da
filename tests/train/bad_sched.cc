// bad_sched: a scheduler that breaks the contract on purpose (param `mode`), so tests can check that the engine fails
// the run with the plugin's name on every rank instead of hanging or corrupting the step:
//   stall    never hands anything out (the core sees a stall once every tensor is enqueued)
//   unknown  hands out a chunk id the core never assigned
//   repeat   hands the first chunk out again after it completed
//   late     hands chunks out one per group under an unlimited credit, then fails its next() (an error status with a
//            message) once three groups are in flight: a plugin error while several collectives are on the wire
// Built into the fixture directory only: it must never be found by name in the default search path.
#include <cstdint>
#include <deque>
#include <string>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

class BadSched final : public sdk::Scheduler {
 public:
  BadSched(sdk::Params& params, sdk::Host& /*host*/)
      : mode_(params.getChoice("mode", "stall", {"stall", "unknown", "repeat", "late"})) {}

  terse_scheduler_caps_v1 caps() const override { return terse_scheduler_caps_v1{}; }
  uint64_t partition(const terse_sched_tensor_v1& /*tensor*/) override { return 0; }
  void enqueue(std::span<const terse_chunk_v1> chunks) override {
    for (const terse_chunk_v1& c : chunks) pending_.push_back(c.chunk_id);
  }
  size_t next(uint64_t /*credit_left*/, uint32_t /*flags*/, std::span<uint64_t> out) override {
    if (mode_ == "stall" || pending_.empty() || out.empty()) return 0;
    if (mode_ == "late") {
      if (in_flight_ >= 3) throw sdk::InvalidArgument("late: failing on purpose with 3 groups in flight");
      out[0] = pending_.front();
      pending_.pop_front();
      ++in_flight_;
      return 1;
    }
    if (mode_ == "unknown") {
      out[0] = uint64_t{1} << 40;
      return 1;
    }
    // repeat: the first id again once it has completed, else the oldest.
    if (completed_first_) {
      out[0] = first_;
      return 1;
    }
    out[0] = pending_.front();
    pending_.pop_front();
    if (!have_first_) {
      first_ = out[0];
      have_first_ = true;
    }
    return 1;
  }
  void onComplete(std::span<const uint64_t> ids, uint64_t /*wire_bytes*/) override {
    --in_flight_;
    for (uint64_t id : ids)
      if (have_first_ && id == first_) completed_first_ = true;
  }

 private:
  std::string mode_;
  std::deque<uint64_t> pending_;
  uint64_t first_ = 0;
  bool have_first_ = false;
  bool completed_first_ = false;
  int in_flight_ = 0;  // late: groups handed out, not completed
};

}  // namespace

TERSE_EXPORT_SCHEDULER(BadSched, "bad_sched", "test: breaks the scheduler contract on purpose", "1.0.0");
