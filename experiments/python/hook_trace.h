// The step trace of a PyTorch run through terse's DDP hook (terse.torch.CompressionState(step_trace=True); the format
// is core/train/step_trace.h, source "pytorch"), for `terse whatif`: what one rank's training step did, recorded from
// what a hook can see without touching the training script.
//
//   compute   forward: one segment per module that owns parameters, in the order the first traced forward ran them
//             (module forward hooks; a segment runs from the previous one's end to its module's end, the first from
//             the model's forward start, the last to the start of backward, so the loss is in it). Each such module
//             is a layer of the trace and its parameters are that layer's tensors.
//             backward: one segment per DDP bucket, from the previous bucket's hand-over (or the start of backward) to
//             this one's, its `ready` tensors the bucket's parameters -- DDP hands a bucket over once all of its
//             gradients are in, which is what a replay needs. A local SGD step's (terse.torch.LocalSGD, whose hook
//             hands DDP its buckets back) make no tensor ready: nothing is exchanged after them.
//   groups    one per bucket, in DDP's hand-over order (the same on every rank), its phases as the aggregation
//             engine ran them (core/train/trace_group.h): compress, the collectives through torch.distributed
//             (algorithm "torch:<backend>"), decompress. Under LocalSGD, a step that averaged holds the averaging's
//             groups instead, issued after its optimizer step: the finiteness check's all-gather and the buffers'
//             allreduce (groups of no tensor), and the deltas' (one per dtype, its tensors the parameters).
//   updates   torch's optimizer step is the training script's, after backward returns: the hook sees only the time
//             from the end of backward (its last bucket done) to the next forward (or the next ResultsLogger.record),
//             less the groups of an averaging in between: optimizer.step(), zero_grad() and the data loader together.
//             It is recorded as one update per tensor, one after the other, each its share of that time by elements;
//             a replay runs a PyTorch trace's updates after the step's last group, as the script does
//             (core/sim/replay.h).
//
// Times come from Python as seconds of the steady clock (monotonic(), the clock the engine stamps its phases with),
// so every event of a step is on one time line. Steps are the tracer's: one per backward pass that reached the hook,
// ending with the bucket DDP marks last; the aggregator records each group into the step open at the time
// (openStep).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/train/step_trace.h"

namespace terse::python {

// Seconds on std::chrono::steady_clock, as Python sees them (terse._terse.monotonic()).
double steadySeconds();
std::chrono::steady_clock::time_point steadyPoint(double seconds);

class HookTrace {
 public:
  // `header`: what the Python state knows (workload, compressor, clock...); rank, world, batch and tensors come with
  // describe(). The run's time zero is now.
  explicit HookTrace(train::TraceHeader header);

  // Once, at the first traced step: the parameters in the module's order (id = index), their names, elements and
  // layers. Throws InvalidArgument for a layer outside [0, layers) or an empty list.
  void describe(int rank, int world, int64_t batch_size, int layers, std::vector<train::TraceTensor> tensors);
  bool described() const noexcept { return described_; }

  void beginStep(int64_t step, double start);
  // The step begun last: where the aggregator records its groups (a DDP bucket's, or terse.torch.LocalSGD's averaging
  // after the optimizer step, while the step is still open). The aggregator's own count of steps is not it: local SGD's
  // local steps aggregate nothing. Read on the hook's worker thread, which aggregates a step's buckets before DDP's
  // backward returns, so before the next step begins.
  int64_t openStep() const noexcept { return open_step_.load(std::memory_order_acquire); }
  void forward(int64_t step, int layer, double start, double end);
  void backward(int64_t step, int layer, double start, double end, std::vector<uint64_t> ready);
  // The time between backward's end and the next forward, split over the tensors by elements (see above).
  void optimizer(int64_t step, double start, double end);
  void endStep(int64_t step, double step_s);

  train::StepTraceRecorder& recorder() noexcept { return recorder_; }
  // Writes steps.rank<R>.jsonl into `dir` (created when missing; results::writeStepTrace).
  void write(const std::filesystem::path& dir) const;
  // The trace so far (tests).
  train::StepTrace snapshot() const { return recorder_.snapshot(); }

 private:
  train::StepTraceRecorder recorder_;
  std::vector<uint64_t> elements_;  // by tensor id
  uint64_t total_elements_ = 0;
  bool described_ = false;
  std::atomic<int64_t> open_step_{0};
};

}  // namespace terse::python
