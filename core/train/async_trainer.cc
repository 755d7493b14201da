#include "core/train/async_trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/common/error.h"
#include "core/common/runtime.h"

namespace terse::train {
namespace {

// The runtime's clock: simulated time in a simulation (core/common/runtime.h).
using Clock = rt::Clock;
using rt::seconds;

uint64_t totalNumel(std::span<const ParamTensor> params) {
  uint64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

void addTimes(StepTimes& into, const StepTimes& t) {
  into.compute_s += t.compute_s;
  into.compress_s += t.compress_s;
  into.decompress_s += t.decompress_s;
  into.comm_s += t.comm_s;
  into.exposed_comm_s += t.exposed_comm_s;
  into.step_s += t.step_s;
}

// The modeled cost of a simulation (rt::charge): forward and backward of every layer for each example of the batch,
// as the sync trainer charges them.
void chargeForwardBackward(const Workload& workload, std::size_t examples) {
  const auto n = static_cast<double>(examples);
  for (int l = 0; l < workload.numLayers(); ++l) {
    const LayerFlops f = workload.layerFlops(l);
    rt::charge({.kind = rt::CostKind::kForward, .layer = l, .size = n, .flops = f.forward * n});
    rt::charge({.kind = rt::CostKind::kBackward, .layer = l, .size = n, .flops = f.backward * n});
  }
}

// torch.nn.utils.clip_grad_norm_ on a worker's flat gradient (AsyncTrainerOptions::clip_grad_norm).
void clipToNorm(std::span<float> grad, double max_norm) {
  if (max_norm <= 0) return;
  const auto n = static_cast<double>(grad.size());
  // FLOP model: square-add, then a multiply when it scales.
  rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = n, .flops = 2 * n});
  double sq = 0;
  for (float g : grad) sq += static_cast<double>(g) * static_cast<double>(g);
  const double scale = max_norm / (std::sqrt(sq) + 1e-6);  // the 1e-6 keeps a zero gradient finite
  if (scale >= 1) return;
  kernel.cost().count = 2;
  kernel.cost().flops = 3 * n;
  const auto f = static_cast<float>(scale);
  for (float& g : grad) g *= f;
}

// Forward and backward over a step's micro-batches with their gradients in `flat`: the micro-batches' gradients
// weighted by their lengths, the gradient of the mean loss over all their examples (SyncTrainer's accumulation).
// Returns that mean loss. rows (empty: not wanted): per tensor, the union of the micro-batches' grad_rows.
double computeGradient(Workload& workload, std::span<const std::vector<int64_t>> micro, std::span<float> flat,
                       std::vector<std::vector<int64_t>>& rows) {
  std::size_t examples = 0;
  for (const auto& b : micro) examples += b.size();
  for (auto& r : rows) r.clear();
  double loss = 0;
  for (std::size_t m = 0; m < micro.size(); ++m) {
    const double weight =
        micro.size() == 1 ? 1.0 : static_cast<double>(micro[m].size()) / static_cast<double>(examples);
    {
      // The whole pass is one region (a workload cannot run one layer alone); its per-layer costs are charged below.
      const rt::Kernel pass(rt::Cost{});
      loss += weight * workload.forwardBackward(micro[m], {});
    }
    const auto params = workload.params();
    for (std::size_t t = 0; t < rows.size(); ++t)
      rows[t].insert(rows[t].end(), params[t].grad_rows.begin(), params[t].grad_rows.end());
    if (micro.size() == 1) {
      copyGradsOut(params, flat);
      break;
    }
    const auto w = static_cast<float>(weight);
    std::size_t at = 0;
    const auto n = static_cast<double>(flat.size());
    // FLOP model: the accumulation's multiply-add.
    const rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = n, .flops = 2 * n});
    for (const auto& p : params) {
      float* a = flat.data() + at;
      for (std::size_t i = 0; i < p.numel(); ++i) a[i] = m == 0 ? w * p.grad[i] : a[i] + w * p.grad[i];
      at += p.numel();
    }
  }
  chargeForwardBackward(workload, examples);
  return loss;
}

}  // namespace

StepPlan planSteps(int64_t num_examples, int num_workers, int64_t batch_size, int64_t epochs, bool drop_last,
                   int64_t accumulation_steps) {
  TERSE_CHECK(batch_size >= 1, InvalidArgument, "batch_size must be >= 1, got " << batch_size);
  TERSE_CHECK(epochs >= 1, InvalidArgument, "epochs must be >= 1, got " << epochs);
  TERSE_CHECK(accumulation_steps >= 1, InvalidArgument,
              "gradient_accumulation_steps must be >= 1, got " << accumulation_steps);
  const ShardSampler sampler(num_examples, 0, num_workers, 0);
  StepPlan p;
  p.steps_per_epoch = sampler.batchesPerEpoch(batch_size, drop_last);
  p.steps_per_epoch = (p.steps_per_epoch + accumulation_steps - 1) / accumulation_steps;
  TERSE_CHECK(
      p.steps_per_epoch >= 1, InvalidArgument,
      "a shard of " << sampler.shardSize() << " examples holds no full batch of " << batch_size << " (drop_last)");
  p.total_steps = p.steps_per_epoch * epochs;
  return p;
}

void copyValuesIn(std::span<ParamTensor> params, std::span<const float> flat) {
  std::size_t at = 0;
  for (auto& p : params) {
    if (p.numel() > 0) std::memcpy(p.value.data(), flat.data() + at, p.numel() * sizeof(float));
    at += p.numel();
  }
}

void copyGradsOut(std::span<const ParamTensor> params, std::span<float> flat) {
  std::size_t at = 0;
  for (const auto& p : params) {
    if (p.numel() > 0) std::memcpy(flat.data() + at, p.grad.data(), p.numel() * sizeof(float));
    at += p.numel();
  }
}

void copyValuesOut(std::span<const ParamTensor> params, std::span<float> flat) {
  std::size_t at = 0;
  for (const auto& p : params) {
    if (p.numel() > 0) std::memcpy(flat.data() + at, p.value.data(), p.numel() * sizeof(float));
    at += p.numel();
  }
}

void LossLog::append(double loss) {
  std::lock_guard lock(mutex_);
  losses_.push_back(loss);
}

std::pair<double, int64_t> LossLog::sum(int64_t from, int64_t to) const {
  std::lock_guard lock(mutex_);
  double s = 0;
  int64_t n = 0;
  for (int64_t i = std::max<int64_t>(from, 0); i < std::min<int64_t>(to, static_cast<int64_t>(losses_.size())); ++i) {
    s += losses_[static_cast<std::size_t>(i)];
    ++n;
  }
  return {s, n};
}

WorkerBatches::WorkerBatches(int64_t num_examples, int worker, int num_workers, const AsyncTrainerOptions& options)
    : options_(options),
      sampler_(num_examples, worker, num_workers, options.seed, options.partition),
      plan_(planSteps(num_examples, num_workers, options.batch_size, options.epochs, options.drop_last,
                      options.accumulation_steps)) {
  TERSE_CHECK(options.slowdown >= 1 && std::isfinite(options.slowdown), InvalidArgument,
              "slowdown must be a finite factor >= 1, got " << options.slowdown);
  options.jitter.validate();
  TERSE_CHECK(options.clip_grad_norm >= 0 && std::isfinite(options.clip_grad_norm), InvalidArgument,
              "optimizer.clip_grad_norm must be finite and >= 0, got " << options.clip_grad_norm);
}

std::span<const std::vector<int64_t>> WorkerBatches::micro(int64_t step) {
  const int64_t epoch = step / plan_.steps_per_epoch;
  if (epoch != batches_epoch_) {
    epoch_batches_ = sampler_.epochBatches(epoch, options_.batch_size, options_.drop_last);
    batches_epoch_ = epoch;
  }
  // accumulation_steps consecutive batches, fewer at the end of an epoch (the sync trainer's grouping).
  const auto k = static_cast<std::size_t>(options_.accumulation_steps);
  const std::size_t first = static_cast<std::size_t>(step % plan_.steps_per_epoch) * k;
  TERSE_CHECK(first < epoch_batches_.size(), InternalError, "step " << step << " past its epoch's batches");
  return std::span<const std::vector<int64_t>>(epoch_batches_)
      .subspan(first, std::min(k, epoch_batches_.size() - first));
}

// ---- AsyncWorkerBase ----

AsyncWorkerBase::AsyncWorkerBase(Workload& workload, int worker, int num_workers, const AsyncTrainerOptions& options)
    : workload_(workload),
      options_(options),
      batches_(workload.numTrainExamples(), worker, num_workers, options),
      flat_(static_cast<std::size_t>(totalNumel(workload.params()))) {}

AsyncStepRecord AsyncWorkerBase::nextRecord() const {
  TERSE_CHECK(!finished(), InvalidArgument, "training finished after " << totalSteps() << " steps");
  AsyncStepRecord rec;
  rec.step = next_step_;
  rec.epoch = next_step_ / batches_.plan().steps_per_epoch;
  return rec;
}

// ---- AsyncWorker ----

AsyncWorker::AsyncWorker(Workload& workload, ParamServerClient& client, int worker, int num_workers,
                         AsyncTrainerOptions options)
    : AsyncWorkerBase(workload, worker, num_workers, options), client_(client) {
  const PsPlan& plan = client.plan();
  const auto params = workload.params();
  for (std::size_t t = 0; t < plan.row_length.size(); ++t) {
    if (plan.row_length[t] == 0) continue;
    TERSE_CHECK(t < params.size() && params[t].row_sparse && params[t].rowLength() == plan.row_length[t],
                InvalidArgument,
                "async worker: the parameter server's plan has tensor " << t << " row-sparse with rows of "
                                                                        << plan.row_length[t]
                                                                        << " elements; the workload does not report "
                                                                           "it so");
    sparse_ = true;
  }
  if (sparse_) {
    pull_rows_.resize(params.size());
    push_rows_.resize(params.size());
    scratch_.resize(params.size());
  }
}

AsyncStepRecord AsyncWorker::step() {
  AsyncStepRecord rec = nextRecord();
  const auto micro = batches_.micro(rec.step);
  const auto step = static_cast<uint64_t>(rec.step);

  const auto t0 = rt::now();
  // Row-sparse tensors: pull only the rows this step's forward reads, when the workload can say which.
  bool sparse_pull = sparse_;
  for (auto& r : pull_rows_) r.clear();
  for (std::size_t m = 0; sparse_pull && m < micro.size(); ++m) {
    sparse_pull = workload_.forwardRows(micro[m], scratch_);
    for (std::size_t t = 0; sparse_pull && t < scratch_.size(); ++t)
      pull_rows_[t].insert(pull_rows_[t].end(), scratch_[t].begin(), scratch_[t].end());
  }
  // The shards hold this pull while SSP says the worker is too far ahead of the slowest.
  const double decode_before = client_.decodeSeconds();
  client_.pull(
      step, flat_,
      sparse_pull ? std::span<const std::vector<int64_t>>(pull_rows_) : std::span<const std::vector<int64_t>>());
  copyValuesIn(workload_.params(), flat_);
  const auto t1 = rt::now();
  stragglerDelay(options_.slowdown, options_.jitter, rec.step, last_raw_compute_s_);
  const auto t1_work = rt::now();
  rec.loss = computeGradient(workload_, micro, flat_, push_rows_);
  stragglerDone(options_.jitter);
  const auto t2 = rt::now();
  losses_.append(rec.loss);
  clipToNorm(flat_, options_.clip_grad_norm);
  const double encode_before = client_.encodeSeconds();
  client_.push(step, flat_, push_rows_);
  const auto t3 = rt::now();
  // A compressed pull's decode is the codec's time, not the network's (param_server_client.h, decodeSeconds).
  rec.times.decompress_s = client_.decodeSeconds() - decode_before;

  last_raw_compute_s_ = seconds(t1_work, t2);
  rec.times.compute_s = seconds(t1, t2);
  rec.times.compress_s = client_.encodeSeconds() - encode_before;
  rec.times.comm_s = seconds(t0, t1) + seconds(t2, t3) - rec.times.compress_s - rec.times.decompress_s;
  rec.times.exposed_comm_s = rec.times.comm_s;
  rec.times.step_s = seconds(t0, t3);
  addTimes(totals_, rec.times);
  ++next_step_;
  return rec;
}

// ---- Hogwild ----

void StalenessHistogram::add(uint64_t tau) {
  std::lock_guard lock(mutex_);
  ++counts_[tau];
}

std::map<uint64_t, uint64_t> StalenessHistogram::snapshot() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

HogwildParams::HogwildParams(std::vector<float> initial, int num_workers, LrScheduleOptions lr, double weight_decay)
    : values_(std::move(initial)),
      num_workers_(num_workers),
      lr_(std::move(lr)),
      weight_decay_(static_cast<float>(weight_decay)) {
  TERSE_CHECK(num_workers >= 1, InvalidArgument, "hogwild: num_workers must be >= 1, got " << num_workers);
  TERSE_CHECK(weight_decay >= 0, InvalidArgument, "hogwild: weight decay must be >= 0, got " << weight_decay);
  validateLrSchedule(lr_);
  static_assert(std::atomic_ref<float>::is_always_lock_free, "Hogwild needs lock-free float loads and stores");
}

void HogwildParams::read(std::span<float> out) const {
  TERSE_CHECK(out.size() == values_.size(), InvalidArgument,
              "hogwild: read into " << out.size() << " elements, the model has " << values_.size());
  // atomic_ref needs a non-const object; the loads do not modify it.
  auto* v = const_cast<float*>(values_.data());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::atomic_ref<float>(v[i]).load(std::memory_order_relaxed);
}

void HogwildParams::apply(std::span<const float> grad, int64_t step, uint64_t read_version) {
  TERSE_CHECK(grad.size() == values_.size(), InvalidArgument,
              "hogwild: gradient of " << grad.size() << " elements, the model has " << values_.size());
  const auto lr = static_cast<float>(learningRate(step) / num_workers_);
  const float wd = weight_decay_;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    std::atomic_ref<float> w(values_[i]);
    const float x = w.load(std::memory_order_relaxed);
    // Not a compare-and-swap: an update racing this one may be lost, as Hogwild allows.
    w.store(x - lr * (grad[i] + wd * x), std::memory_order_relaxed);
  }
  const uint64_t before = version_.fetch_add(1, std::memory_order_acq_rel);
  staleness_.add(before - read_version);
}

HogwildWorker::HogwildWorker(Workload& workload, HogwildParams& shared, int worker, int num_workers,
                             AsyncTrainerOptions options)
    : AsyncWorkerBase(workload, worker, num_workers, options), shared_(shared) {
  TERSE_CHECK(flat_.size() == shared.size(), InvalidArgument,
              "hogwild: the workload has " << flat_.size() << " parameters, the shared vector " << shared.size());
}

AsyncStepRecord HogwildWorker::step() {
  AsyncStepRecord rec = nextRecord();
  const auto micro = batches_.micro(rec.step);
  const auto t0 = rt::now();
  const uint64_t version = shared_.version();
  shared_.read(flat_);
  copyValuesIn(workload_.params(), flat_);
  stragglerDelay(options_.slowdown, options_.jitter, rec.step, last_raw_compute_s_);
  const auto t1 = rt::now();
  std::vector<std::vector<int64_t>> no_rows;
  rec.loss = computeGradient(workload_, micro, flat_, no_rows);
  stragglerDone(options_.jitter);
  const auto t2 = rt::now();
  losses_.append(rec.loss);
  clipToNorm(flat_, options_.clip_grad_norm);
  shared_.apply(flat_, rec.step, version);
  const auto t3 = rt::now();
  last_raw_compute_s_ = seconds(t1, t2);
  // Reading and updating shared memory is this mode's "communication": no bytes, but time all the same.
  rec.times.compute_s = seconds(t0, t2);
  rec.times.comm_s = seconds(t2, t3);
  rec.times.exposed_comm_s = rec.times.comm_s;
  rec.times.step_s = seconds(t0, t3);
  addTimes(totals_, rec.times);
  ++next_step_;
  return rec;
}

}  // namespace terse::train
