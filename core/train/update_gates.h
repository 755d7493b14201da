// The updates a synchronous trainer waits for (group_scheduler.h): per tensor the last step whose update is applied,
// per layer the oldest of its tensors' (a layer's gate opens once every tensor of the layer has the step's update), and
// the run's first failure, which every wait rethrows from then on. The group scheduler's communication thread marks
// updates applied and records failures; the trainer's worker waits on a layer (forward gating) or on every update of a
// step (the drain before the next step, or the end).
//
// Its own lock: the waits never hold the group scheduler's, and the scheduler takes this one inside its own (to read
// failed()), never the other way round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <utility>
#include <vector>

#include "core/common/runtime.h"
#include "core/train/workload.h"

namespace terse::train {

class UpdateGates {
 public:
  // No update applied yet (every tensor at step -1). `workload` must outlive this.
  explicit UpdateGates(const Workload& workload);

  // Tensors whose update of `step` is applied; wakes the waits they open.
  void markApplied(int64_t step, std::span<const std::size_t> tensors);
  // Waits until every tensor's update of `step` is applied; rethrows the first failure. Returns the seconds waited.
  double awaitStep(int64_t step);
  // Waits until every tensor of `layer` has its update of `step` applied; rethrows the first failure. Returns when the
  // wait began and ended. InvalidArgument, naming the workload, for a layer it does not have.
  std::pair<rt::Clock::time_point, rt::Clock::time_point> awaitLayer(int layer, int64_t step);

  // Records `failure` unless one is already in (the first wins); returns whether it was the first. The waits see it at
  // their next wake-up: wake() them once what must come first is done (the group scheduler aborts the communicator
  // first, so that the peers learn this rank's reason rather than whatever the woken worker does next).
  bool record(std::exception_ptr failure);
  void wake();
  bool failed() const;
  void throwIfFailed() const;

 private:
  bool appliedLocked(int64_t step) const;
  // mutex_ held by `lock`: waits until open() or a failure, which it rethrows; returns when the wait began and ended.
  template <class Open>
  std::pair<rt::Clock::time_point, rt::Clock::time_point> waitLocked(std::unique_lock<rt::Mutex>& lock, Open open);

  const Workload& workload_;
  mutable rt::Mutex mutex_;             // the runtime's: in a simulation the waits block in simulated time
  rt::CondVar cv_;                      // the waits
  std::vector<int64_t> applied_;        // per tensor: the last step whose update is applied
  std::vector<int64_t> layer_applied_;  // per layer: min of applied_ over its tensors
  std::exception_ptr error_;            // the first failure
};

}  // namespace terse::train
