// The synchronous trainer's compute side (sync_trainer.h): construction, the step (forward, backward, the per-layer
// gates that wait for the group scheduler) and gradient accumulation. The communication thread, its lanes and the
// negotiation are group_scheduler.cc; the updates they trigger, parameter_updater.cc.
#include "core/train/sync_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/common/device_memory.h"
#include "core/common/error.h"
#include "core/common/fnv.h"
#include "core/train/local_sgd_schedule.h"
#include "core/train/param_info.h"

namespace terse::train {
namespace {

using Clock = rt::Clock;
using rt::seconds;

std::string layerName(int layer) {
  return "L" + std::to_string(layer);
}

// Sleeps (slowdown - 1) x raw_compute_s (nothing for slowdown <= 1).
void stragglerSleep(double slowdown, double raw_compute_s) {
  if (slowdown > 1 && raw_compute_s > 0) rt::sleepFor(std::chrono::duration<double>((slowdown - 1) * raw_compute_s));
}

}  // namespace

void stragglerDelay(double slowdown, const ComputeJitter& jitter, int64_t step, double raw_compute_s) {
  // sigma 0 leaves the runtime untouched, so a run without jitter is the run it was before jitter existed.
  if (jitter.sigma == 0) return stragglerSleep(slowdown, raw_compute_s);
  const double factor = jitter.factor(step);
  const bool charged = rt::backend().setStepFactor(factor);
  stragglerSleep(charged ? slowdown : slowdown * factor, raw_compute_s);
}

void stragglerDone(const ComputeJitter& jitter) {
  if (jitter.sigma != 0) rt::backend().setStepFactor(1.0);
}

uint64_t parameterChecksum(std::span<const ParamTensor> params) {
  uint64_t h = kFnv1aBasis;
  for (const auto& p : params) h = fnv1a(h, p.value.data(), p.value.size() * sizeof(float));
  return h;
}

SyncTrainer::SyncTrainer(Workload& workload, comm::Communicator& comm, PipelineFactory pipelines,
                         const SyncTrainerOptions& options, std::unique_ptr<Scheduler> scheduler)
    : workload_(workload),
      options_(options),
      sampler_(workload.numTrainExamples(), comm.rank(), comm.size(), options.seed, options.partition),
      updater_(workload, options.sgd, workload.device() >= 0 ? comm.deviceStream() : nullptr, options.clip_grad_norm,
               options.trace, options.step_trace) {
  TERSE_CHECK(options.batch_size >= 1, InvalidArgument, "batch_size must be >= 1, got " << options.batch_size);
  TERSE_CHECK(options.epochs >= 1, InvalidArgument, "epochs must be >= 1, got " << options.epochs);
  TERSE_CHECK(options.slowdown >= 1 && std::isfinite(options.slowdown), InvalidArgument,
              "slowdown must be a finite factor >= 1, got " << options.slowdown);
  options.jitter.validate();
  const bool device = workload.device() >= 0;
  TERSE_CHECK(device == comm.deviceMemory(), InvalidArgument,
              "workload '" << workload.name() << "' computes on "
                           << (device ? "CUDA device " + std::to_string(workload.device()) : "the host") << " but the '"
                           << comm.backend() << "' communicator works on " << (comm.deviceMemory() ? "device" : "host")
                           << " memory (a GPU workload needs the NCCL transport, a host one a host transport)");
  groups_ =
      std::make_unique<GroupScheduler>(workload, comm, std::move(pipelines), std::move(scheduler),
                                       GroupSchedulerOptions{.max_groups_in_flight = options.max_groups_in_flight,
                                                             .sparse_rows = options.sparse_rows,
                                                             .trace = options.trace,
                                                             .step_trace = options.step_trace,
                                                             .compression_start_step = options.compression_start_step,
                                                             .dense = options.dense_pipelines},
                                       updater_);
  TERSE_CHECK(options.accumulation_steps >= 1, InvalidArgument,
              "gradient_accumulation_steps must be >= 1, got " << options.accumulation_steps);
  TERSE_CHECK(std::isfinite(options.clip_grad_norm) && options.clip_grad_norm >= 0, InvalidArgument,
              "optimizer.clip_grad_norm must be finite and >= 0, got " << options.clip_grad_norm);
  TERSE_CHECK(!groups_->anyRowSparse() || (options.accumulation_steps == 1 && options.clip_grad_norm == 0),
              InvalidArgument,
              "gradient_accumulation_steps (" << options.accumulation_steps << ") and optimizer.clip_grad_norm ("
                                              << options.clip_grad_norm
                                              << ") do not combine with sparse_rows: row-sparse tensors are applied "
                                                 "as their rows arrive");
  TERSE_CHECK(!device || (options.accumulation_steps == 1 && options.clip_grad_norm == 0), InvalidArgument,
              "gradient_accumulation_steps (" << options.accumulation_steps << ") and optimizer.clip_grad_norm ("
                                              << options.clip_grad_norm << ") are host-only; workload '"
                                              << workload.name() << "' computes on a CUDA device");
  const auto params = workload.params();
  const int64_t micro_batches = sampler_.batchesPerEpoch(options.batch_size, options.drop_last);
  steps_per_epoch_ = (micro_batches + options.accumulation_steps - 1) / options.accumulation_steps;
  if (options.accumulation_steps > 1)
    for (const auto& p : params) accumulated_.emplace_back(p.numel());
  TERSE_CHECK(steps_per_epoch_ >= 1, InvalidArgument,
              "a shard of " << sampler_.shardSize() << " examples holds no full batch of " << options.batch_size
                            << " (drop_last)");
  lr_ = options.lr;
  lr_.world_size = comm.size();
  lr_.steps_per_epoch = steps_per_epoch_;
  lr_.total_steps = totalSteps();
  TERSE_CHECK(options.warmup_epochs >= 0 && !(options.warmup_epochs > 0 && lr_.warmup_steps > 0), InvalidArgument,
              "warm-up: give steps (" << lr_.warmup_steps << ") or epochs (" << options.warmup_epochs
                                      << "), not both, and not negative");
  if (options.warmup_epochs > 0) {
    lr_.warmup_steps = std::llround(options.warmup_epochs * static_cast<double>(steps_per_epoch_));
  }
  validateLrSchedule(lr_);
  const LocalSgdOptions& local = options.local_sgd;
  TERSE_CHECK(local.period >= 0 && local.start_step >= 0 && local.every_steps >= 0, InvalidArgument,
              "local SGD: period (" << local.period << "), start_step (" << local.start_step << ") and every_steps ("
                                    << local.every_steps << ") must be >= 0");
  if (local.period > 0) {
    TERSE_CHECK(!device && !groups_->anyRowSparse(), InvalidArgument,
                "local SGD (period " << local.period << ") runs host workloads with dense tensors; workload '"
                                     << workload.name() << "' "
                                     << (device ? "computes on a CUDA device" : "has row-sparse tensors"));
    // Local SGD's own gradient phase is start_step; a dense warm-up would also decide how its deltas are averaged.
    TERSE_CHECK(options.compression_start_step == 0, InvalidArgument,
                "local SGD (period " << local.period << ") with compression_start_step "
                                     << options.compression_start_step
                                     << ": local SGD's gradient steps before its start_step are its warm-up");
    TERSE_CHECK(std::isfinite(local.qsr_alpha) && local.qsr_alpha >= 0, InvalidArgument,
                "local SGD: qsr_alpha must be finite and >= 0, got " << local.qsr_alpha);
    // EF21's sum of the estimates follows gradients (core/compress/ef21.h); the averagings compress parameter deltas.
    // The config refuses the pair (rule `error-feedback`); this is for a caller that builds the trainer itself.
    for (std::size_t t = 0; t < params.size(); ++t)
      TERSE_CHECK(!groups_->pipeline(t).codec().keepsAggregateState(), InvalidArgument,
                  "local SGD (period " << local.period << ") with EF21 (tensor " << t
                                       << "): EF21's estimates follow each rank's gradient, and the averagings "
                                          "compress parameter deltas; use error feedback's rule EF "
                                          "(Qsparse-local-SGD)");
    updater_.setOuterOptimizer(local.outer_lr, local.outer_momentum, local.outer_nesterov);
    schedule_ = LocalSgdSchedule(local.period, local.start_step, local.qsr_alpha, totalSteps(),
                                 [this](int64_t step) { return learningRate(lr_, step); });
    // The averaging feeds every tensor layer by layer: each must belong to one layer.
    std::size_t in_layers = 0;
    for (int l = 0; l < workload.numLayers(); ++l) in_layers += workload.layerTensors(l).size();
    TERSE_CHECK(
        in_layers == params.size(), InternalError,
        "workload '" << workload.name() << "' has " << params.size() << " tensors but its layers list " << in_layers);
  }
  for (int l = 0; l < workload.numLayers(); ++l) layer_flops_.push_back(workload.layerFlops(l));
  if (options.step_trace) {
    std::vector<TraceTensor> tensors;
    for (std::size_t i = 0; i < params.size(); ++i)
      tensors.push_back(TraceTensor{i, params[i].name, static_cast<uint64_t>(params[i].numel()), params[i].layer});
    options.step_trace->describe(comm.rank(), comm.size(), options.batch_size * options.accumulation_steps,
                                 workload.numLayers(), std::move(tensors));
  }
  workload_.setLayerGate([this](int layer) { gate(layer); });
  groups_->start();
}

bool SyncTrainer::localStep(int64_t step) const noexcept {
  return options_.local_sgd.period > 0 && step >= options_.local_sgd.start_step;
}

bool SyncTrainer::averagingStep(int64_t step) const noexcept {
  if (!localStep(step)) return false;
  const LocalSgdOptions& l = options_.local_sgd;
  const int64_t done = step + 1;
  return onSchedule(done) || done == totalSteps() || (l.every_steps > 0 && done % l.every_steps == 0) ||
         (l.per_epoch && done % steps_per_epoch_ == 0);
}

SyncTrainer::~SyncTrainer() {
  groups_.reset();  // joins the communication thread and the lanes, which call into updater_
  workload_.setLayerGate({});
}

Negotiation SyncTrainer::negotiation() const {
  return groups_->counters().negotiation;
}

uint64_t SyncTrainer::payloadBytes() {
  drain();
  return groups_->payloadBytes();
}

const std::vector<std::size_t>& SyncTrainer::lastIssueOrder() {
  drain();
  return groups_->issueOrder();
}

const std::vector<IssuedGroup>& SyncTrainer::lastGroups() {
  drain();
  return groups_->groups();
}

uint64_t SyncTrainer::checksum() {
  drain();
  workload_.copyValuesToHost();  // a device workload's host mirror is refreshed only on request
  return parameterChecksum(workload_.params());
}

void SyncTrainer::accumulate(std::span<const std::size_t> tensors, float weight, bool first, bool last) {
  const auto params = workload_.params();
  for (std::size_t t : tensors) {
    std::vector<float>& g = params[t].grad;
    std::vector<float>& a = accumulated_[t];
    const auto n = static_cast<double>(g.size());
    rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = n, .flops = 2 * n});
    for (std::size_t i = 0; i < g.size(); ++i) {
      a[i] = first ? weight * g[i] : a[i] + weight * g[i];
      if (last) g[i] = a[i];
    }
  }
}

double SyncTrainer::localUpdate(const StepRecord& rec) {
  // The gates saw every update of the last exchange that the forward reads; the optimizer writes every tensor.
  const double waited = groups_->awaitApplied(handed_step_);
  updater_.localUpdate(rec.step, rec.lr);
  if (rec.averaged) updater_.writeDeltas(rec.step);
  return waited;
}

void SyncTrainer::chargeForwardUpTo(int layer) {
  if (!in_step_) return;
  for (; forward_charged_ < layer; ++forward_charged_) {
    rt::charge({.kind = rt::CostKind::kForward,
                .layer = forward_charged_,
                .size = batch_examples_,
                .flops = layer_flops_[static_cast<std::size_t>(forward_charged_)].forward * batch_examples_});
    if (options_.step_trace) {
      // now() turns the charge into simulated time first, so the segment is the layer's modeled forward. In real time
      // the charge is nothing: the forward of a gated layer runs up to the next gate, and the last layer's up to the
      // first report, its backward included (a workload's pass cannot be timed layer by layer from outside).
      const auto now = rt::now();
      options_.step_trace->compute(trace_step_, TraceCompute::Kind::kForward, forward_charged_, {seg_mark_, now});
      seg_mark_ = now;
      gate_charged_ = true;
    }
  }
}

void SyncTrainer::gate(int layer) {
  gate_charged_ = false;
  chargeForwardUpTo(layer);
  // Waiting for the layer's update is the trainer's, not the forward pass's (the region forwardBackward runs in).
  const rt::OutsideKernel glue;
  const auto [t0, t1] = groups_->awaitLayer(layer, handed_step_);
  gate_wait_s_ += seconds(t0, t1);
  if (options_.step_trace && in_step_) {
    // The segments tile the step's compute exactly: what ran since the last mark up to the wait belongs to the forward
    // just charged, or, before the first charge, to this layer's (a straggler's sleep, the pass's start).
    if (t0 > seg_mark_) {
      if (gate_charged_) {
        options_.step_trace->extendLastCompute(trace_step_, t0);
      } else {
        options_.step_trace->compute(trace_step_, TraceCompute::Kind::kForward, layer, {seg_mark_, t0});
      }
    }
    seg_mark_ = t1;
  }
  if (options_.trace) {
    const auto now = rt::now();
    if (t1 - t0 > std::chrono::microseconds(1))
      options_.trace->span(TraceRecorder::kComputeThread, "wait " + layerName(layer), "wait", t0, t1);
    // The compute between two gates is the forward of the previous gated layer.
    if (gate_layer_ >= 0)
      options_.trace->span(TraceRecorder::kComputeThread, "forward " + layerName(gate_layer_), "compute", gate_mark_,
                           t0);
    gate_layer_ = layer;
    gate_mark_ = now;
  }
}

void SyncTrainer::countCommSince(StepTimes& times) {
  const CommCounters now = groups_->counters();
  times.comm_s += now.comm_s - counted_.comm_s;
  times.compress_s += now.encode_s - counted_.encode_s;
  times.decompress_s += now.decode_s - counted_.decode_s;
  counted_ = now;
}

void SyncTrainer::drain() {
  if (drained_step_ >= handed_step_ && !groups_->failed()) return;
  const double waited = groups_->awaitApplied(handed_step_);
  drained_step_ = handed_step_;
  totals_.times.exposed_comm_s += waited;
  totals_.times.step_s += waited;
  // The previous step's collectives that finished during this wait: the next step's window starts after them, so
  // left out here they would count nowhere (an evaluation point's drain lost one step's collectives per record).
  countCommSince(totals_.times);
}

StepRecord SyncTrainer::step() {
  TERSE_CHECK(!finished(), InvalidArgument, "training finished after " << totalSteps() << " steps");
  StepRecord rec;
  rec.step = next_step_;
  rec.epoch = next_step_ / steps_per_epoch_;
  rec.step_in_epoch = next_step_ % steps_per_epoch_;
  if (rec.step_in_epoch == 0)
    epoch_batches_ = sampler_.epochBatches(rec.epoch, options_.batch_size, options_.drop_last);
  // This step's micro-batches: accumulation_steps consecutive batches, fewer at the end of an epoch.
  const auto first_batch = static_cast<std::size_t>(rec.step_in_epoch * options_.accumulation_steps);
  const std::size_t micro =
      std::min(static_cast<std::size_t>(options_.accumulation_steps), epoch_batches_.size() - first_batch);
  std::size_t examples = 0;
  for (std::size_t m = 0; m < micro; ++m) examples += epoch_batches_[first_batch + m].size();
  rec.lr = learningRate(lr_, rec.step);
  rec.local = localStep(rec.step);
  rec.averaged = averagingStep(rec.step);

  const auto t0 = rt::now();
  if (options_.step_trace) options_.step_trace->beginStep(rec.step, t0);
  trace_step_ = rec.step;
  double full_wait = 0;
  // The communication thread may have failed after the previous step returned (step() does not wait for the step's
  // communication): report that first failure, not a misuse of the API.
  groups_->throwIfFailed();
  // A workload that does not gate its forward per layer reads every layer: every update must be in first.
  if (!workload_.gatesLayers()) full_wait = groups_->awaitApplied(handed_step_);
  groups_->backwardStarts();
  gate_wait_s_ = 0;
  gate_layer_ = -1;

  const auto t1 = rt::now();
  seg_mark_ = t1;  // compute (metrics and trace alike) starts here, a straggler's sleep included
  stragglerDelay(options_.slowdown, options_.jitter, rec.step, last_raw_compute_s_);
  const auto t1_work = rt::now();
  std::exception_ptr compute_error;
  Clock::time_point last_mark = t1;
  try {
    const int64_t step_index = rec.step;
    const double lr = rec.lr;
    in_step_ = true;
    for (std::size_t m = 0; m < micro; ++m) {
      const std::vector<int64_t>& batch = epoch_batches_[first_batch + m];
      // The mean loss over all the step's examples is the micro-batches' means weighted by their lengths; so is its
      // gradient.
      const double weight = micro == 1 ? 1.0 : static_cast<double>(batch.size()) / static_cast<double>(examples);
      const bool last = m + 1 == micro;
      forward_charged_ = 0;
      batch_examples_ = static_cast<double>(batch.size());
      // The workload is one region: its CPU time (MEASURED) is the pass's, less the gates and callbacks, which step
      // out of it; the modeled costs are charged per layer as the pass reaches it (chargeForwardUpTo, below), since a
      // workload cannot run one layer alone.
      const rt::Kernel pass(rt::Cost{});
      rec.loss += weight * workload_.forwardBackward(batch, [&](int layer, std::span<const std::size_t> tensors) {
        chargeForwardUpTo(workload_.numLayers());
        rt::charge({.kind = rt::CostKind::kBackward,
                    .layer = layer,
                    .size = batch_examples_,
                    .flops = layer_flops_[static_cast<std::size_t>(layer)].backward * batch_examples_});
        const rt::OutsideKernel glue;
        if (micro > 1) accumulate(tensors, static_cast<float>(weight), m == 0, last);
        if (options_.step_trace) {
          // The backward of `layer` with the accumulation of its gradient; its tensors are ready on the last
          // micro-batch only. A local step's are ready for no group: an averaging sends the deltas once the local
          // update and the deltas are written, at the end of the step's computation (its last segment runs to t2,
          // below), which is when a replay makes a tensor no backward reported ready.
          const auto now = rt::now();
          options_.step_trace->compute(
              step_index, TraceCompute::Kind::kBackward, layer, {seg_mark_, now},
              last && !rec.local ? std::vector<uint64_t>(tensors.begin(), tensors.end()) : std::vector<uint64_t>{});
          seg_mark_ = now;
        }
        if (!last) return;
        if (options_.trace) {
          const auto now = rt::now();
          if (gate_layer_ >= 0) {
            // From the last gate to the first report: the last layer's forward, the loss and its backward.
            options_.trace->span(TraceRecorder::kComputeThread, "forward+backward " + layerName(gate_layer_), "compute",
                                 gate_mark_, now);
            gate_layer_ = -1;
          } else {
            options_.trace->span(TraceRecorder::kComputeThread, "backward " + layerName(layer), "compute", last_mark,
                                 now);
          }
          last_mark = now;
        }
        if (!rec.local) groups_->feed(step_index, tensors, lr);
      });
    }
  } catch (...) {
    compute_error = std::current_exception();
  }
  in_step_ = false;
  double local_wait = 0;
  if (rec.local && !compute_error) {
    try {
      local_wait = localUpdate(rec);
    } catch (...) {
      compute_error = std::current_exception();
    }
  }
  stragglerDone(options_.jitter);
  groups_->backwardEnds();
  if (rec.averaged && !compute_error) {
    // Last layer first, as backward reports them: the same order on every rank.
    for (int l = workload_.numLayers() - 1; l >= 0; --l) {
      const auto tensors = workload_.layerTensors(l);
      if (!tensors.empty()) groups_->feed(rec.step, tensors, rec.lr);
    }
  }
  const auto t2 = rt::now();
  // The pass's tail after its last report (in real time, the workload's return) is the last segment's.
  if (options_.step_trace && !compute_error) options_.step_trace->extendLastCompute(rec.step, t2);
  if (compute_error) groups_->failFrom(compute_error, "forwardBackward failed at step " + std::to_string(rec.step));
  groups_->throwIfFailed();
  // A local step that does not average feeds nothing: the waits stay on the last step that did.
  if (!rec.local || rec.averaged) handed_step_ = rec.step;
  ++next_step_;
  // The last step has no next forward to overlap with: wait for its updates so the replica is final.
  double drain_wait = 0;
  if (finished()) {
    drain_wait = groups_->awaitApplied(handed_step_);
    drained_step_ = handed_step_;
  }
  const auto t3 = rt::now();
  // Since the previous step returned, not since this one's counters were first read: the full wait above (a non-gating
  // workload's) is the previous step's collectives finishing.
  countCommSince(rec.times);
  totals_.negotiation_rounds = counted_.negotiation.rounds;
  if (options_.trace && full_wait > 0) options_.trace->span(TraceRecorder::kComputeThread, "wait all", "wait", t0, t1);
  if (options_.trace && drain_wait > 0) options_.trace->span(TraceRecorder::kComputeThread, "drain", "wait", t2, t3);

  if (options_.trace)
    options_.trace->span(TraceRecorder::kComputeThread, "step " + std::to_string(rec.step), "step", t0, t3);

  rec.overlapped_tensors = groups_->overlapped();
  rec.gate_wait_s = gate_wait_s_;
  rec.times.compute_s = seconds(t1, t2) - gate_wait_s_ - local_wait;
  last_raw_compute_s_ = seconds(t1_work, t2) - gate_wait_s_ - local_wait;
  rec.times.exposed_comm_s = full_wait + gate_wait_s_ + local_wait + drain_wait;
  rec.times.step_s = seconds(t0, t3);
  if (options_.step_trace) options_.step_trace->endStep(rec.step, rec.times.step_s);

  ++totals_.steps;
  totals_.loss_sum += rec.loss;
  totals_.times.compute_s += rec.times.compute_s;
  totals_.times.compress_s += rec.times.compress_s;
  totals_.times.decompress_s += rec.times.decompress_s;
  totals_.times.comm_s += rec.times.comm_s;
  totals_.times.exposed_comm_s += rec.times.exposed_comm_s;
  totals_.times.step_s += rec.times.step_s;
  return rec;
}

}  // namespace terse::train
