// The synchronous trainer's update side (sync_trainer.h): what the group scheduler's communication thread does with a
// tensor whose gradient is aggregated -- the optimizer's update at the step's learning rate, after a global clip when
// one is set -- and the update's place in the Chrome trace and the step trace.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "core/common/runtime.h"
#include "core/train/group_scheduler.h"
#include "core/train/optimizer.h"
#include "core/train/step_trace.h"
#include "core/train/trace.h"
#include "core/train/workload.h"

namespace terse::train {

class ParameterUpdater final : public GradientSink {
 public:
  // `stream` orders a device workload's updates (the communicator's, where its pipelines run; null on the host).
  // clip_grad_norm > 0: SyncTrainerOptions::clip_grad_norm. Throws what SgdOptimizer throws for bad options.
  ParameterUpdater(Workload& workload, const SgdOptions& sgd, void* stream, double clip_grad_norm, TraceRecorder* trace,
                   StepTraceRecorder* step_trace);

  std::vector<std::size_t> aggregated(int64_t step, double lr, std::vector<std::size_t> tensors) override;
  void aggregatedRows(int64_t step, double lr, std::size_t tensor, std::span<const int64_t> rows) override;

  // ---- Local SGD (sync_trainer.h, "Local SGD"), on the worker's thread while no update is in flight.
  // The rank's own update of every tensor at `lr`, clipped by its own gradient's norm when clip_grad_norm is set. The
  // first call first takes the anchor: the parameters as they are, which every rank shares then.
  void localUpdate(int64_t step, double lr);
  // Writes anchor - value (what this replica moved since the anchor) into every gradient and makes `step` an averaging
  // step: aggregated() then sets each tensor to anchor - its averaged delta, the new anchor.
  void writeDeltas(int64_t step);
  // The averaging's outer SGD (before the communication thread starts): with d the averaged delta, u = momentum u + d
  // and the new anchor is anchor - lr u (anchor - lr (d + momentum u) with nesterov). Default lr 1, momentum 0: anchor
  // - d, bit for bit. Throws InvalidArgument outside lr in (0, 100], momentum in [0, 1), or nesterov without momentum.
  void setOuterOptimizer(double lr, double momentum, bool nesterov);

 private:
  // Scales every gradient by clip / (norm + 1e-6) when that is < 1 (torch.nn.utils.clip_grad_norm_).
  void clipGradients();
  // Records tensor t's update of `step`, begun at u0 and ending now, in the timeline ("<verb> <name>") and the step
  // trace (its updates: after the tensor's last group), when either is attached.
  void traceUpdate(int64_t step, std::size_t t, const char* verb, rt::Clock::time_point u0);

  Workload& workload_;
  SgdOptimizer optimizer_;
  void* stream_;
  const bool device_;  // the workload computes on a CUDA device: updates are enqueued on stream_
  const double clip_grad_norm_;
  TraceRecorder* trace_;
  StepTraceRecorder* step_trace_;
  // Clipping: tensors of the step aggregated and waiting for the rest before the norm is known.
  std::vector<std::size_t> clip_ready_;
  // Local SGD: the parameters at the last averaging (empty before the first local step), and the step whose
  // aggregated tensors are averaged deltas (-1: none). The worker writes both before it feeds the step's tensors and
  // reads the anchor only once their updates are applied: the group scheduler's hand-overs order the two threads.
  std::vector<std::vector<float>> anchor_;
  std::atomic<int64_t> averaging_step_{-1};
  // The outer optimizer and its momentum buffer (per tensor, allocated at the first averaging when momentum > 0;
  // the communication thread's alone).
  float outer_lr_ = 1;
  float outer_momentum_ = 0;
  bool outer_nesterov_ = false;
  std::vector<std::vector<float>> outer_buf_;
};

}  // namespace terse::train
