// The group scheduler's books of the step it schedules (group_scheduler.h): which step and at what learning rate, how
// many of its tensors were admitted, the chunks each tensor still waits for, which tensors have started, and, for the
// trainer to read between steps, the order tensors started in and the groups handed out. Only the communication
// thread writes them; the trainer reads issueOrder() and groups() after awaitApplied(), which the update gates order
// after every write of the step (update_gates.h: the step's last update is marked applied after its last group was
// booked), and before it feeds the next step, whose first admission clears them. No lock of their own, then.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/plugin/scheduler.h"

namespace terse::train {

// One group as the communication thread issued it: its chunks as (tensor id, chunk index) in fused order.
struct IssuedGroup {
  std::vector<std::pair<uint64_t, int>> chunks;
  uint64_t wire_bytes = 0;   // the group's wire_bytes as the scheduler saw them
  uint64_t credit_left = 0;  // the credit left once it was handed out (UINT64_MAX: unlimited)
  // Groups handed out before it whose completion the scheduler had not been told of: 0 when one runs at a time.
  uint64_t groups_in_flight = 0;
  // The most urgent (smallest) layer among chunks left pending once it was handed out, -1 when none: a priority
  // scheduler never hands out a chunk of a later layer than this.
  int min_pending_layer = -1;
};

class StepBooks {
 public:
  explicit StepBooks(std::size_t tensors);

  // A tensor of `step`, to be updated with `lr`, is being admitted. When `step` is not the step the books hold, they
  // move to it and start afresh (the step before is complete by then: the trainer feeds a step only once every update
  // of the one before is applied) and this returns true.
  bool begin(int64_t step, double lr);
  int64_t step() const noexcept { return step_; }
  double lr() const noexcept { return lr_; }
  // The admitted tensor is counted; true when it was the step's last.
  bool admitted();
  // A tensor the scheduler partitioned into `chunks` chunks.
  void expect(std::size_t tensor, uint64_t chunks) { chunks_left_[tensor] = chunks; }
  // A chunk of `tensor` is handed out: true the first time in the step, when the tensor joins the issue order.
  bool start(std::size_t tensor);
  void issued(IssuedGroup group) { groups_.push_back(std::move(group)); }
  // A group's chunks are aggregated: the tensors whose last chunk of the step was among them, in the chunks' order.
  std::vector<std::size_t> finish(std::span<const Chunk> chunks);

  // Read between steps (the header comment).
  const std::vector<std::size_t>& issueOrder() const noexcept { return issue_order_; }
  const std::vector<IssuedGroup>& groups() const noexcept { return groups_; }

 private:
  int64_t step_ = -1;
  double lr_ = 0;
  std::size_t admitted_ = 0;           // tensors of step_ admitted
  std::vector<uint64_t> chunks_left_;  // per tensor
  std::vector<bool> started_;          // per tensor
  std::vector<std::size_t> issue_order_;
  std::vector<IssuedGroup> groups_;
};

}  // namespace terse::train
