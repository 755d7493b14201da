// The worker side of the asynchronous modes (DESIGN.md section 2, issue 7).
//
// AsyncWorker drives one Workload against a parameter server (param_server_client.h): each step pulls the parameters
// (the shards hold a pull back while SSP says this worker is too far ahead), runs forward and backward on this worker's
// batch, and pushes the compressed gradient with the versions it was computed on. The data order is the sync
// trainer's (ShardSampler with rank = worker, world = workers), so with staleness bound 0 the run sees the same
// batches as a sync run of the same seed and ends with the same parameters up to the order in which the shards sum
// the workers' gradients. There is no overlap of communication with compute (a worker needs the pulled parameters
// before its forward), so all of a step's communication is exposed.
//
// HogwildWorker is mode HOGWILD (Niu, Recht, Re, Wright, "HOGWILD!: A Lock-Free Approach to Parallelizing Stochastic
// Gradient Descent", NIPS 2011): threads of one process read and update one shared parameter vector with no lock
// at all. Each element is accessed through a relaxed std::atomic_ref<float> -- a plain load or store on x86-64 and
// ARM, but defined behaviour in C++ -- so reads may mix values of different updates and a read-modify-write may lose
// a concurrent one: exactly Hogwild's semantics. Staleness is counted by a version that every completed update bumps.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "core/train/optimizer.h"
#include "core/train/param_server_client.h"
#include "core/train/shard_sampler.h"
#include "core/train/sync_trainer.h"
#include "core/train/workload.h"

namespace terse::train {

struct AsyncTrainerOptions {
  int64_t batch_size = 32;  // examples per worker per step
  int64_t epochs = 1;
  bool drop_last = false;
  uint64_t seed = 1;      // data order (ShardSampler)
  double slowdown = 1.0;  // straggler factor (SyncTrainerOptions::slowdown)
  ComputeJitter jitter;   // per-step compute noise (SyncTrainerOptions::jitter)
  // > 0: the worker's gradient is scaled by clip_grad_norm / (norm + 1e-6) when that is < 1 before it is pushed
  // (applied, in Hogwild), norm being its L2 norm over all tensors (torch.nn.utils.clip_grad_norm_ on the worker's
  // gradient). Sync clips the aggregate instead (SyncTrainerOptions::clip_grad_norm): the same with one worker.
  double clip_grad_norm = 0;
  // Micro-batches of batch_size examples per step: their gradients are accumulated on the worker (weighted by their
  // lengths, as the sync trainer does) and pushed (applied, in Hogwild) once, so a step is one batch of
  // accumulation_steps x batch_size examples and staleness counts pushes. >= 1.
  int64_t accumulation_steps = 1;
  // Fixed shards, worker w owning partition[w] (SyncTrainerOptions::partition). Null: the default.
  std::shared_ptr<const Partition> partition;
};

// Per-step accounting. times.comm_s is the time in pull and push minus the encoding inside push
// (times.compress_s) and a compressed pull's decoding (times.decompress_s); it is all exposed (times.exposed_comm_s ==
// times.comm_s).
struct AsyncStepRecord {
  int64_t step = 0;  // this worker's step index just run, 0-based
  int64_t epoch = 0;
  double loss = 0;
  StepTimes times;
};

// A worker's batch losses by step, appended on the worker's thread the moment forward/backward returns -- before its
// push and clock, so a shard snapshot of step t (param_server_shard.h) finds every loss of the steps before t logged --
// and read by the runner's monitor.
class LossLog {
 public:
  void append(double loss);
  // Sum and count of the losses of steps [from, to) logged so far.
  std::pair<double, int64_t> sum(int64_t from, int64_t to) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> losses_;
};

// Steps per epoch and total steps of one worker, as the sync trainer counts them; throws InvalidArgument like it.
struct StepPlan {
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
};
// With accumulation_steps k, a step is k consecutive batches (fewer at an epoch's end, as in the sync trainer).
StepPlan planSteps(int64_t num_examples, int num_workers, int64_t batch_size, int64_t epochs, bool drop_last,
                   int64_t accumulation_steps = 1);

// A worker's batches in the sync trainer's order (ShardSampler with rank = worker, world = workers) and its step
// plan; checks the options both async workers share.
class WorkerBatches {
 public:
  WorkerBatches(int64_t num_examples, int worker, int num_workers, const AsyncTrainerOptions& options);
  const StepPlan& plan() const { return plan_; }
  // The micro-batches of this worker's step `step` (drawing the epoch's batches when an epoch starts).
  std::span<const std::vector<int64_t>> micro(int64_t step);

 private:
  AsyncTrainerOptions options_;
  ShardSampler sampler_;
  StepPlan plan_;
  std::vector<std::vector<int64_t>> epoch_batches_;
  int64_t batches_epoch_ = -1;
};

// What both kinds of async worker keep and report: the workload, its batches and steps so far, the flat vector its
// parameters and gradients pass through, and the sums the results want.
class AsyncWorkerBase {
 public:
  bool finished() const { return next_step_ >= batches_.plan().total_steps; }
  int64_t totalSteps() const { return batches_.plan().total_steps; }
  int64_t stepsPerEpoch() const { return batches_.plan().steps_per_epoch; }
  int64_t stepsDone() const { return next_step_; }
  const StepTimes& totals() const { return totals_; }
  const LossLog& losses() const { return losses_; }

 protected:
  // flat_ holds every parameter of the workload. Throws what WorkerBatches throws.
  AsyncWorkerBase(Workload& workload, int worker, int num_workers, const AsyncTrainerOptions& options);
  // The next step's record with its step and epoch; InvalidArgument once finished().
  AsyncStepRecord nextRecord() const;

  Workload& workload_;
  AsyncTrainerOptions options_;
  WorkerBatches batches_;
  int64_t next_step_ = 0;
  std::vector<float> flat_;  // pulled parameters, then gradients
  double last_raw_compute_s_ = 0;
  StepTimes totals_;
  LossLog losses_;
};

class AsyncWorker : public AsyncWorkerBase {
 public:
  // The client must be this worker's (client worker index == worker). Throws InvalidArgument for a model whose
  // parameter count differs from the plan's, a tensor the plan has row-sparse that the workload does not report so
  // (with the same row length), or a shard too small for one batch.
  //
  // Row-sparse tensors (the plan's, PsPlan::row_length): the worker pushes the rows the workload reports in grad_rows
  // (the union over a step's micro-batches) and, when the workload can say which rows the step's forward reads
  // (Workload::forwardRows), pulls only those; otherwise it pulls them whole.
  AsyncWorker(Workload& workload, ParamServerClient& client, int worker, int num_workers, AsyncTrainerOptions options);

  // Pull, compute, push. Throws PsRefused when a shard refused the push, CommError when the transport failed.
  AsyncStepRecord step();
  // Leaves the job cleanly (the shards stop counting this worker at once).
  void leave() { client_.bye(); }

 private:
  ParamServerClient& client_;
  bool sparse_ = false;                                                // the plan has row-sparse tensors
  std::vector<std::vector<int64_t>> pull_rows_, push_rows_, scratch_;  // per tensor
};

// Staleness counts kept the way the results want them: tau -> updates (shared by HOGWILD's workers).
class StalenessHistogram {
 public:
  void add(uint64_t tau);
  std::map<uint64_t, uint64_t> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<uint64_t, uint64_t> counts_;
};

// The one parameter vector HOGWILD's workers share, with the update rule. Plain SGD only (momentum would be one more
// shared, racy buffer with no agreed meaning): w -= lr_t / W * (g + weight_decay * w).
class HogwildParams {
 public:
  HogwildParams(std::vector<float> initial, int num_workers, LrScheduleOptions lr, double weight_decay);

  uint64_t size() const { return values_.size(); }
  // Relaxed element-wise copy of the current values (a read may see a mix of updates: Hogwild's semantics).
  void read(std::span<float> out) const;
  // The version a read saw: updates completed before it started.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  // Applies one worker's gradient of its step `step` computed on version `read_version`, without a lock.
  void apply(std::span<const float> grad, int64_t step, uint64_t read_version);
  double learningRate(int64_t step) const { return train::learningRate(lr_, step); }
  std::map<uint64_t, uint64_t> staleness() const { return staleness_.snapshot(); }

 private:
  std::vector<float> values_;
  int num_workers_;
  LrScheduleOptions lr_;
  float weight_decay_;
  std::atomic<uint64_t> version_{0};
  StalenessHistogram staleness_;
};

class HogwildWorker : public AsyncWorkerBase {
 public:
  HogwildWorker(Workload& workload, HogwildParams& shared, int worker, int num_workers, AsyncTrainerOptions options);

  AsyncStepRecord step();

 private:
  HogwildParams& shared_;
};

// Copies between a workload's tensors and one flat vector (tensors concatenated in order).
void copyValuesIn(std::span<ParamTensor> params, std::span<const float> flat);
void copyGradsOut(std::span<const ParamTensor> params, std::span<float> flat);
void copyValuesOut(std::span<const ParamTensor> params, std::span<float> flat);

}  // namespace terse::train
