// Bulk-synchronous data-parallel training for one worker (DESIGN.md section 2). Every rank runs one SyncTrainer over
// its own Workload replica and Communicator; the replicas start identical (same init seed) and stay identical because
// every rank applies the same averaged gradient with the same optimizer.
//
// One step on one rank:
//   1. the rank's batch: ShardSampler (disjoint shards, a seeded shuffle per epoch, the same step count on every rank)
//   2. Workload::forwardBackward; each time a layer's gradients are final (reverse layer order) the callback hands its
//      tensors to this trainer's communication thread, which runs their CompressionPipelines in ready order (FIFO --
//      the only scheduler for now). Communication of the last layers thus overlaps backward of the first ones. The
//      issue order is the same on every rank because backward's order is, as the collectives inside require.
//   3. wait until every tensor's pipeline is done: the averaged gradients are in the grad buffers (step(grad, grad))
//   4. the optimizer (optimizer.h) updates every tensor with lr_t
//
// Timing per step (seconds, this rank): compute = forwardBackward's wall time; communication = time the
// communicator's collectives ran (its CommStats, all on the communication thread); compress and decompress = the
// pipelines' encode and decode time (PipelineStats::encode_s with error feedback, decode_s with a CUSTOM reduce
// fold), measured around the codec calls rather than derived from busy time, so a slow link cannot leak into them;
// exposed communication = how long the worker waited after backward returned until the last pipeline finished --
// the part overlap did not hide.
//
// Determinism: for a fixed seed, world size, workload and compressor, every run produces bit-identical parameters --
// data order comes from the seed, the issue order from backward, and the collectives sum in a fixed order.
//
// Errors: a pipeline that throws aborts the communicator (every rank's pending and later collectives fail, nothing
// hangs), the communication thread drains without running further pipelines, and step() rethrows the first error.
// A trainer whose step() threw must not be stepped again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/compress/pipeline.h"
#include "core/train/optimizer.h"
#include "core/train/shard_sampler.h"
#include "core/train/workload.h"

namespace terse::train {

struct SyncTrainerOptions {
  int64_t batch_size = 32;  // examples per worker per step
  int64_t epochs = 1;
  bool drop_last = false;  // ShardSampler's remainder policy
  uint64_t seed = 1;       // data order (ShardSampler)
  SgdOptions sgd;
  // lr, schedule, warm-up, milestones, gamma, scale_by_world_size. world_size, steps_per_epoch and total_steps are
  // filled in by the trainer; warmup_epochs > 0 (at most one of it and lr.warmup_steps) becomes
  // round(warmup_epochs * steps_per_epoch) warm-up steps.
  LrScheduleOptions lr;
  double warmup_epochs = 0;
};

struct StepTimes {
  double compute_s = 0;
  double compress_s = 0;    // encode, error feedback included
  double decompress_s = 0;  // decode (and a CUSTOM reduce fold)
  double comm_s = 0;
  double exposed_comm_s = 0;
  double step_s = 0;  // the whole step, optimizer included
};

struct StepRecord {
  int64_t step = 0;           // global step index just run, 0-based
  int64_t epoch = 0;          // 0-based
  int64_t step_in_epoch = 0;  // 0-based
  double loss = 0;            // this rank's mean loss over its batch
  double lr = 0;              // the learning rate applied
  StepTimes times;
  // Tensors whose communication started before forwardBackward returned: the overlap that happened.
  int overlapped_tensors = 0;
};

// Sums over the steps run so far.
struct TrainerTotals {
  int64_t steps = 0;
  double loss_sum = 0;
  StepTimes times;
};

// FNV-1a 64 over the bytes of every tensor's values, in order: equal checksums = bit-identical replicas (with
// overwhelming probability), cheap enough to compute at every evaluation.
uint64_t parameterChecksum(std::span<const ParamTensor> params);

class SyncTrainer {
 public:
  // pipelines[i] serves params()[i] (tensor id i, same numel). Throws InvalidArgument for a count or size mismatch,
  // a communicator whose size differs from the pipelines', a batch size < 1, epochs < 1, a shard too small for one
  // batch, or invalid optimizer options. Starts the communication thread.
  SyncTrainer(Workload& workload, comm::Communicator& comm, std::vector<std::unique_ptr<CompressionPipeline>> pipelines,
              const SyncTrainerOptions& options);
  // Stops and joins the communication thread.
  ~SyncTrainer();
  SyncTrainer(const SyncTrainer&) = delete;
  SyncTrainer& operator=(const SyncTrainer&) = delete;

  int64_t stepsPerEpoch() const noexcept { return steps_per_epoch_; }
  int64_t totalSteps() const noexcept { return steps_per_epoch_ * options_.epochs; }
  int64_t nextStep() const noexcept { return next_step_; }
  bool finished() const noexcept { return next_step_ >= totalSteps(); }
  const SyncTrainerOptions& options() const noexcept { return options_; }
  const LrScheduleOptions& lrSchedule() const noexcept { return lr_; }

  // Runs the next step (see the top of this file). Throws when finished() or on any error.
  StepRecord step();

  const TrainerTotals& totals() const noexcept { return totals_; }
  // Compressor output of this rank so far, all tensors (PipelineStats::payload_bytes).
  uint64_t payloadBytes() const;
  const CompressionPipeline& pipeline(std::size_t tensor) const { return *pipelines_.at(tensor); }
  // Tensor ids in the order the communication thread started them in the last step.
  const std::vector<std::size_t>& lastIssueOrder() const noexcept { return issue_order_; }
  uint64_t checksum() const { return parameterChecksum(workload_.params()); }

 private:
  void commLoop();
  void enqueue(std::span<const std::size_t> tensors);
  // Waits until nothing is queued or running on the communication thread.
  void waitIdle(std::unique_lock<std::mutex>& lock);

  Workload& workload_;
  comm::Communicator& comm_;
  std::vector<std::unique_ptr<CompressionPipeline>> pipelines_;
  SyncTrainerOptions options_;
  LrScheduleOptions lr_;
  ShardSampler sampler_;
  SgdOptimizer optimizer_;
  int64_t steps_per_epoch_ = 0;
  int64_t next_step_ = 0;
  std::vector<std::vector<int64_t>> epoch_batches_;  // the current epoch's batches
  TrainerTotals totals_;

  // The communication thread's state. mutex_ guards everything down to error_.
  std::mutex mutex_;
  std::condition_variable work_cv_;  // the communication thread waits here for tensors
  std::condition_variable idle_cv_;  // step() waits here for the last pipeline
  std::deque<std::size_t> queue_;
  bool running_ = false;  // a pipeline is running now
  bool stop_ = false;
  uint64_t current_step_ = 0;  // the step the queued tensors belong to
  std::vector<std::size_t> issue_order_;
  std::exception_ptr error_;  // the first failure; later tensors are skipped
  std::atomic<bool> backward_done_{false};
  std::atomic<int> overlapped_{0};
  std::thread comm_thread_;
};

}  // namespace terse::train
