// Bulk-synchronous data-parallel training for one worker (DESIGN.md section 2). Every rank runs one SyncTrainer over
// its own Workload replica and Communicator; the replicas start identical (same init seed) and stay identical because
// every rank applies the same averaged gradient with the same optimizer.
//
// The trainer is the worker's side; its communication thread, lanes and negotiation are a GroupScheduler
// (group_scheduler.h) it feeds ready gradients and waits on, and the updates that thread applies are a
// ParameterUpdater's (parameter_updater.h). DESIGN.md section 2 says who does what.
//
// One step on one rank (two threads: the worker's, which calls step(), and the group scheduler's communication thread):
//   1. the rank's batch: ShardSampler (disjoint shards, a seeded shuffle per epoch, the same step count on every rank)
//   2. Workload::forwardBackward. Forward of layer i first waits (Workload::awaitLayer, the gate this trainer installs)
//      for the PREVIOUS step's update of layer i only; later layers may still be on the wire. Each time backward
//      finishes a layer (reverse layer order) its tensors go to the communication thread.
//   3. the communication thread asks the scheduler (core/plugin/scheduler.h; a plugin such as fifo, fusion or priority)
//      how to cut each ready tensor into chunks, sizes every chunk after compression (CompressionPipeline::
//      maxPayloadBytes: exact for fixed-size compressors, their bound otherwise), enqueues them, and then repeatedly
//      takes the scheduler's next group within the credit (wire bytes in flight) and runs it through the aggregation
//      engine (engine.h): per chunk compression, one collective for the group, per chunk decompression. It re-asks
//      after every group, so a high-priority chunk that became ready meanwhile goes next: preemption at chunk
//      boundaries.
//   4. when the last chunk of a tensor is reduced, the communication thread applies the optimizer to that tensor right
//      away (optimizer.h, the step's lr); when every tensor of layer i is applied, the gate of layer i opens.
//   step() returns when backward has handed everything over: communication of this step overlaps the next step's
//   forward. The last step, drain(), checksum(), payloadBytes() and lastIssueOrder() wait until every update is in, so
//   evaluation and checksums always see finished parameters.
//
// Negotiation: a scheduler's answer depends on what was enqueued before it was asked, and backward runs at a different
// pace on every rank, so before each group the communication threads agree in one 8-byte allgather on how many tensors
// ALL ranks have ready (Horovod's coordinator cycle, Sergeev and Del Balso 2018) and enqueue only those. Every rank's
// scheduler thus sees the same history and hands out the same groups: the same collectives in the same order. These
// control frames are labelled kNegotiationTensor in the byte accounting; their number depends on timing.
//
// Groups in flight. With max_groups_in_flight 1 (the default) the communication thread runs each group itself, so
// one collective is in flight at a time and the credit bounds how many bytes a newly ready high-priority chunk may
// have to wait behind (ByteScheduler's credit, Peng et al. SOSP 2019). With N > 1 the communication thread hands a
// group to one of N lane threads and goes back to negotiating: the next group the scheduler hands out within the
// credit left starts while earlier ones are still on the wire, and a newly ready urgent chunk can start without
// waiting for them when the credit allows -- ByteScheduler's sliding window of credit. What keeps every rank's
// scheduler in step is then the completions too: a lane finishes a group at a different moment on every rank, so a
// completion reaches the scheduler (on_complete, which releases its credit) only once every rank has it. The
// negotiation's 8-byte word carries both news, packed as (tensors received - admitted) << 32 | (groups finished, in
// issue order, beyond those the scheduler was told of); every rank takes the minimum of each, tells the scheduler of
// that many completions in issue order, admits that many tensors, then asks for groups while a lane is free. A
// group's update is applied as soon as it finishes here (the math does not wait for the agreement). Rounds are run
// only when they can change something: a completion to agree on, or tensors to admit while a lane and credit are
// free. Concurrent collectives are kept apart on the transport by their tags: a lane's channel takes the group's
// run-wide number (the same on every rank, since every rank hands out the same groups in the same order) as its tag
// namespace, and the negotiation and row-sparse collectives keep the communicator's own sequence on the
// communication thread. The scheduler's order is the issue order, the same on every rank. Only the order and overlap
// of collectives change with N: every group is the same computation on the same bytes, so the parameters are
// bit-identical for any N and credit whenever they are across groupings (below).
//
// A workload whose forward does not call awaitLayer (gatesLayers() false) gets every update applied before its
// forwardBackward starts.
//
// Device workloads (Workload::device() >= 0; DESIGN.md section 2's GPU path): the communicator must work on device
// memory (NCCL) and the pipelines on its stream (CompressionPipeline checks it). The communication thread hands the
// pipelines ParamTensor::device_grad, so compression kernels, the collective and decompression run back to back on
// that one stream; the optimizer enqueues its kernels there too, and the thread waits for the stream once per group
// that finished a tensor before opening that layer's gate, so the next forward on the workload's own stream reads
// finished values. The workload synchronizes its stream before reporting a layer (workload.h), so a gradient is
// complete before any pipeline reads it. checksum() refreshes the workload's host mirror first.
//
// Pipelines: the PipelineFactory builds every one from the TensorInfo core gives it (param_info.h): one per tensor at
// construction, so a compressor that cannot serve a tensor fails before anything runs, and, for a tensor the scheduler
// cuts, one per chunk, built the first time that cut is seen and reused after (its codec state -- error feedback
// residuals -- is per chunk; its id is chunkTensorId's). Elementwise compressors (none, fp16, ...) give the same result
// cut or whole; a non-elementwise one (top-k, QSGD buckets, PowerSGD) compresses each chunk on its own, as
// ByteScheduler does.
//
// Timing per step (seconds, this rank): compute = forwardBackward's wall time minus the time its forward spent waiting
// at layer gates; exposed communication = those gate waits + any full wait (the last step's drain, a non-gating
// workload's wait) -- the communication the worker could not overlap; communication = time the communicator's
// collectives ran on the communication thread (CommStats, negotiation rounds included) and compress and decompress =
// the pipelines' codec time, each counting what finished since the previous step() or drain() counted. A step's
// collectives mostly finish during the next step (its forward waits for them at the gates), so a step's figures are a
// window of time, not its own gradients'; over the totals every collective counts once. drain() calls between steps add
// their wait to the totals as exposed communication, and what finished meanwhile to the totals' communication and
// codec time. Exposed communication waits for the codec and the optimizer's update as well as the collectives: with
// little compute to hide them behind, it exceeds the communication time, up to communication + codec + update.
//
// Determinism: for a fixed seed, world size, workload, compressor and scheduler, every run produces bit-identical
// parameters. Across schedulers the averaged gradient is the same math; it is bit-identical when the summation order
// does not depend on message boundaries (engine.h: ALLGATHER, 1-2 ranks, recursive-doubling allreduce).
//
// Local SGD (SyncTrainerOptions::local_sgd; Stich 2019, Lin et al. ICLR 2020 "post-local SGD"). Steps before
// start_step are the gradient steps above. From start_step on a step is local or averaging:
//   - a local step runs forward and backward, then waits for any update still in flight (the gates have usually seen
//     them all) and applies the rank's own gradient with its own optimizer state (momentum stays per rank, as with
//     torch's PostLocalSGDOptimizer), clipped by its own norm when clip_grad_norm is set. Nothing is sent.
//   - an averaging step does the same local update, then writes into each gradient what the replica moved since the
//     anchor (the parameters every rank shared after the last averaging): delta = anchor - value. It feeds every
//     tensor, last layer first as backward would, to the group scheduler, which runs the deltas through the scheduler,
//     the pipelines (compressor, error feedback) and the collectives like gradients; on the communication thread each
//     averaged delta gives value = anchor - mean(delta), the new anchor (with an outer optimizer, anchor - outer_lr x
//     its momentum step on mean(delta): DiLoCo, SlowMo). With a lossy compressor and error feedback
//     this is Qsparse-local-SGD (Basu et al. 2019); the residual is in parameter units, which is why a phase of
//     gradient steps before (start_step > 0) does not combine with a stateful codec (the config refuses it).
// A step averages when (step + 1 - start_step) is a multiple of period (with qsr_alpha, at the ends of the quadratic
// synchronization rule's rounds: local_sgd_schedule.h), at the last step, and after the steps that end at
// averaging_points (the runner's evaluation points, where it compares the replicas). The next step's forward
// waits at the layer gates for the averaging, as for a gradient step's update, so its communication overlaps that
// forward only. The local update and the deltas are the worker's compute (compute_s); the averaged update is the
// communication thread's. Host workloads, dense tensors. In a step trace a local step is compute alone (its local
// update folded into its last segment) and an averaging step's groups carry the deltas, ready when that segment ends,
// with the averaged updates after them: `terse whatif` replays the schedule as recorded.
//
// Dense warm-up (SyncTrainerOptions::compression_start_step; torch's PowerSGD hook's start_powerSGD_iter, which runs
// plain allreduce first). The early steps, where the gradients change fast, are where a lossy compressor is thought to
// hurt most (Lin et al. ICLR 2018 warm DGC up for that reason); whether a warm-up pays is a study's question
// (results/reference/dense_warmup). The steps before compression_start_step aggregate through a second set of
// pipelines, the caller's uncompressed ones; every later step through the compressor's. The switch is at a step
// boundary, where no group is in flight (a step's tensors are admitted only once the step before is applied), so every
// rank switches between the same two groups, and the warm-up's set is dropped there. The compressor's pipelines have
// seen no gradient before then: error feedback's residual, EF21's estimates and PowerSGD's warm start begin at the
// switch, as they do in torch's hook. The bytes and codec time of both sets count.
//
// Errors: a failing pipeline, communicator or scheduler (a contract violation the checked Scheduler reports, naming the
// plugin) aborts the communicator (every rank's pending and later collectives fail, nothing hangs), the communication
// thread stops running groups, and step() / drain() / a waiting layer gate rethrow the first error -- also a step()
// called after the failure, since a step's communication may fail after step() returned. A failed trainer is done.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/comm/communicator.h"
#include "core/common/runtime.h"
#include "core/compress/pipeline.h"
#include "core/plugin/scheduler.h"
#include "core/train/compute_jitter.h"
#include "core/train/group_scheduler.h"
#include "core/train/local_sgd_schedule.h"
#include "core/train/optimizer.h"
#include "core/train/parameter_updater.h"
#include "core/train/shard_sampler.h"
#include "core/train/step_trace.h"
#include "core/train/trace.h"
#include "core/train/workload.h"

namespace terse::train {

// Local SGD's schedule (the top of this file, "Local SGD").
struct LocalSgdOptions {
  // Steps between two averagings (>= 1); 0 = off: every step allreduces its gradients.
  int64_t period = 0;
  // Gradient steps before the first local step (>= 0).
  int64_t start_step = 0;
  // Also average after every `every_steps` steps done (0: none) and, per_epoch, after the last step of each epoch: the
  // points where the runner evaluates and checks that the replicas agree.
  int64_t every_steps = 0;
  bool per_epoch = false;
  // The outer optimizer of each averaging (ParameterUpdater::setOuterOptimizer): lr in (0, 100], momentum in [0, 1),
  // nesterov only with momentum. The defaults are plain averaging.
  double outer_lr = 1;
  double outer_momentum = 0;
  bool outer_nesterov = false;
  // > 0: the quadratic synchronization rule's alpha (local_sgd_schedule.h): rounds of max(period, floor((alpha /
  // lr)^2)) steps, lr the rate of the step before each round. 0: every `period` steps. Finite, >= 0.
  double qsr_alpha = 0;
};

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
  // When set, the timeline of this rank is recorded into it (must outlive the trainer).
  TraceRecorder* trace = nullptr;
  // When set, this rank's step trace (step_trace.h) is recorded into it (must outlive the trainer): compute segments
  // on the worker thread, every group with its phases and collectives, every update. The trainer fills in the header's
  // rank, world, batch size, layers and tensors.
  StepTraceRecorder* step_trace = nullptr;
  // Micro-batches per optimizer step (>= 1): forwardBackward runs on this many consecutive batches of batch_size (the
  // sampler's order, so they are one batch of accumulation_steps x batch_size examples cut in pieces), their gradients
  // are averaged weighted by their lengths, and one communication and one update follow. With compressor `none` this
  // is the larger batch's step up to f32 rounding. A step at the end of an epoch takes the micro-batches that are left.
  // Host workloads only.
  int64_t accumulation_steps = 1;
  // > 0: after aggregation, every gradient is scaled by clip_grad_norm / (norm + 1e-6) when that is < 1, norm being
  // the L2 norm over all tensors together (torch.nn.utils.clip_grad_norm_). The updates then wait until every tensor
  // of the step is aggregated. 0 = off. Host workloads only.
  double clip_grad_norm = 0;
  // A straggler's compute-time factor (>= 1): before each forward the trainer sleeps (slowdown - 1) x the previous
  // step's measured compute, counted as compute. Emulates a slower device without changing the math.
  double slowdown = 1.0;
  // Seeded per-step compute noise on top of slowdown (compute_jitter.h): step s's compute takes jitter.factor(s) times
  // as long, slept like slowdown in real time. Off by default.
  ComputeJitter jitter;
  // Fixed shards instead of a global reshuffle every epoch (shard_sampler.h): non-IID data (label_partition.h). Null:
  // the default.
  std::shared_ptr<const Partition> partition;
  // Row-sparse tensors (ParamTensor::row_sparse) are aggregated as (row ids, rows) by RowSparseAllgather
  // (core/compress/row_sparse_allgather.h) as soon as they are admitted, outside the scheduler and the compressor,
  // and updated row by row when that equals the dense update (SgdOptimizer::lazyRowsExact). Host workloads only.
  bool sparse_rows = false;
  // Scheduler groups whose collectives may be in flight at once (>= 1), within the scheduler's credit. 1: the
  // communication thread runs each group itself, one after another. N > 1: N lane threads run groups, each on a
  // communicator channel of its own (communicator.h, CommChannel) selected by the group's run-wide number, while the
  // communication thread goes on negotiating, admitting and handing out the next group the credit allows (see "Groups
  // in flight" above). Host communicators only (NCCL runs one collective at a time on its stream).
  int max_groups_in_flight = 1;
  // Periodic model averaging instead of a gradient exchange every step (off by default). Host workloads, dense
  // tensors; a step trace records it ("Local SGD" above).
  LocalSgdOptions local_sgd;
  // > 0: a dense warm-up ("Dense warm-up" above). Steps before this one run their gradients through the pipelines of
  // `dense_pipelines` (the caller's uncompressed codec: terse's runner gives compressor `none` without decorators)
  // instead of those of the trainer's factory, which take over at this step with their state fresh. Not with local
  // SGD. 0: every step compresses.
  int64_t compression_start_step = 0;
  PipelineFactory dense_pipelines;
};

// Before step `step`'s compute, shared by the sync and async trainers: the straggler's delay, slowdown x the step's
// jitter factor. A simulation takes the factor as the computing actor's step factor (rt::Backend::setStepFactor), so
// the step's own compute is charged that much more (its trainer's slowdown is then 1: the actor carries it); real time
// sleeps (slowdown x factor - 1) x raw_compute_s, the previous step's measured compute, as for slowdown alone.
void stragglerDelay(double slowdown, const ComputeJitter& jitter, int64_t step, double raw_compute_s);
// After the step's compute: a simulated actor's step factor back to 1 (the step's communication is not jittered).
void stragglerDone(const ComputeJitter& jitter);

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
  double loss = 0;            // this rank's mean loss over its batch (all its micro-batches)
  double lr = 0;              // the learning rate applied
  StepTimes times;
  // Tensors whose communication started before forwardBackward returned: the overlap that happened.
  int overlapped_tensors = 0;
  // Local SGD: the step applied this rank's own gradient (local or averaging), and whether it fed the deltas.
  bool local = false;
  bool averaged = false;
  // Of times.exposed_comm_s: the part spent in forward waiting for a layer's update.
  double gate_wait_s = 0;
};

// Sums over the steps run so far.
struct TrainerTotals {
  int64_t steps = 0;
  uint64_t negotiation_rounds = 0;  // 8-byte allgathers the communication thread ran to agree on ready tensors
  double loss_sum = 0;
  StepTimes times;
};

// FNV-1a 64 over the bytes of every tensor's values, in order: equal checksums = bit-identical replicas (with
// overwhelming probability), cheap enough to compute at every evaluation.
uint64_t parameterChecksum(std::span<const ParamTensor> params);

class SyncTrainer {
 public:
  // Builds one pipeline per parameter tensor through `pipelines` (tensor id i for params()[i]). Throws
  // InvalidArgument for a factory that returns a pipeline of the wrong tensor, size or rank, a null scheduler (fifo,
  // the default, is a plugin like any other), a batch size < 1, epochs < 1, a shard too small for one batch, or invalid
  // optimizer options; what the factory throws (a compressor that cannot serve a tensor). Starts the communication
  // thread.
  SyncTrainer(Workload& workload, comm::Communicator& comm, PipelineFactory pipelines,
              const SyncTrainerOptions& options, std::unique_ptr<Scheduler> scheduler);
  // Stops and joins the communication thread (groups not started are dropped: drain() first to finish them).
  ~SyncTrainer();
  SyncTrainer(const SyncTrainer&) = delete;
  SyncTrainer& operator=(const SyncTrainer&) = delete;

  int64_t stepsPerEpoch() const noexcept { return steps_per_epoch_; }
  // Local SGD: whether the schedule (period, or the quadratic synchronization rule's rounds) averages after `done`
  // steps; the forced averagings at the evaluation points and the last step aside.
  bool onSchedule(int64_t done) const noexcept { return schedule_.averagesAfter(done); }
  const LocalSgdSchedule& localSgdSchedule() const noexcept { return schedule_; }
  int64_t totalSteps() const noexcept { return steps_per_epoch_ * options_.epochs; }
  // Local SGD: whether step `step` (0-based) applies its own gradient, and whether it averages the models after.
  bool localStep(int64_t step) const noexcept;
  bool averagingStep(int64_t step) const noexcept;
  int64_t nextStep() const noexcept { return next_step_; }
  bool finished() const noexcept { return next_step_ >= totalSteps(); }
  const SyncTrainerOptions& options() const noexcept { return options_; }
  const LrScheduleOptions& lrSchedule() const noexcept { return lr_; }
  const Scheduler& scheduler() const noexcept { return groups_->scheduler(); }

  // Runs the next step (see the top of this file). Throws when finished() or on any error.
  StepRecord step();
  // Waits until every update handed to the communication thread is applied; rethrows its error. The wait counts as
  // exposed communication in totals(), and the collectives and codec time that finished up to here count in its
  // communication and codec time.
  void drain();

  const TrainerTotals& totals() const noexcept { return totals_; }
  // Compressor output this rank sent so far, all tensors and chunks: PipelineStats::payload_bytes less the SUM headers
  // that stay on the rank (unsent_header_bytes), so payload bytes count what travels, frame headers aside; drains
  // first.
  uint64_t payloadBytes();
  // The negotiation so far, rounds and bytes counted together as each round completes. Call after drain() at an
  // evaluation point: the communication thread may already be in the next round, which is not in yet.
  Negotiation negotiation() const;
  const CompressionPipeline& pipeline(std::size_t tensor) const { return groups_->pipeline(tensor); }
  // Tensor ids in the order their first chunk started in the last step; drains first.
  const std::vector<std::size_t>& lastIssueOrder();
  // The groups of the last step in issue order; drains first.
  const std::vector<IssuedGroup>& lastGroups();
  // Drains, then parameterChecksum.
  uint64_t checksum();

 private:
  // The communication and codec time that finished since counted_, into `times`; counted_ moves up to now.
  void countCommSince(StepTimes& times);
  // The gate the trainer installs in the workload: charges the forward up to `layer`, waits for its update.
  void gate(int layer);
  // The FLOP model's forward charges up to `layer` (rt::charge), each a compute segment of the step trace.
  void chargeForwardUpTo(int layer);
  // Local SGD, worker thread, after forwardBackward: waits for the updates in flight (returns the seconds waited),
  // applies the rank's own gradient and, averaging, feeds the deltas.
  double localUpdate(const StepRecord& rec);
  // Gradient accumulation: `weight` x this micro-batch's gradients into accumulated_; the last one writes the sum back.
  void accumulate(std::span<const std::size_t> tensors, float weight, bool first, bool last);

  Workload& workload_;
  SyncTrainerOptions options_;
  LrScheduleOptions lr_;
  ShardSampler sampler_;
  ParameterUpdater updater_;                // the optimizer, on the communication thread
  std::unique_ptr<GroupScheduler> groups_;  // the communication thread, its lanes and the negotiation
  int64_t steps_per_epoch_ = 0;
  int64_t next_step_ = 0;
  std::vector<std::vector<int64_t>> epoch_batches_;  // the current epoch's batches
  TrainerTotals totals_;
  int64_t handed_step_ = -1;   // the last step whose forwardBackward returned (all its tensors fed)
  LocalSgdSchedule schedule_;  // local SGD's averagings on schedule (off without local SGD)
  int64_t drained_step_ = -1;  // the last step drain() has waited for
  // The communication counters as last added to totals_ (at the end of step() or in drain()): each step and drain adds
  // what finished since, so time that finishes between steps -- a drain's wait, a non-gating workload's wait before
  // its pass -- still counts once.
  CommCounters counted_;
  // Gradient accumulation (accumulation_steps > 1): the weighted sum of the step's micro-batch gradients so far.
  std::vector<std::vector<float>> accumulated_;

  // ---- The step in progress, worker thread. This step's gate waits and the previous step's compute without the
  // straggler sleep.
  double gate_wait_s_ = 0;
  double last_raw_compute_s_ = 0;
  // The FLOP model of a simulation (rt::charge): per layer and example, and this step's progress through it. Forward of
  // layer l is charged when the gate of a later layer (or the first report) shows it is done; backward of l when l
  // is reported. Only inside forwardBackward: evaluate() also passes the gates.
  std::vector<LayerFlops> layer_flops_;
  bool in_step_ = false;
  int forward_charged_ = 0;
  double batch_examples_ = 0;
  // Chrome trace: the last gated layer and when its forward began.
  int gate_layer_ = -1;
  rt::Clock::time_point gate_mark_;
  // Step trace: where the current compute segment began (the last charge's end or a gate's wait's), and whether the
  // current gate charged a forward.
  rt::Clock::time_point seg_mark_;
  int64_t trace_step_ = -1;
  bool gate_charged_ = false;
};

}  // namespace terse::train
