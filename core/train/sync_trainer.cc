#include "core/train/sync_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "core/common/error.h"

namespace terse::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double commSeconds(const comm::Communicator& comm) {
  double s = 0;
  for (const auto& k : comm.stats().by_kind) s += k.seconds;
  return s;
}

// Sums of the pipelines' codec times. Read only while the communication thread is idle (it writes the stats).
struct CodecSeconds {
  double encode = 0;
  double decode = 0;
};

CodecSeconds codecSeconds(const std::vector<std::unique_ptr<CompressionPipeline>>& pipelines) {
  CodecSeconds s;
  for (const auto& p : pipelines) {
    s.encode += p->stats().encode_s;
    s.decode += p->stats().decode_s;
  }
  return s;
}

}  // namespace

uint64_t parameterChecksum(std::span<const ParamTensor> params) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64 offset basis
  for (const auto& p : params) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p.value.data());
    const std::size_t n = p.value.size() * sizeof(float);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= bytes[i];
      h *= 1099511628211ull;  // FNV prime
    }
  }
  return h;
}

SyncTrainer::SyncTrainer(Workload& workload, comm::Communicator& comm,
                         std::vector<std::unique_ptr<CompressionPipeline>> pipelines, const SyncTrainerOptions& options)
    : workload_(workload),
      comm_(comm),
      pipelines_(std::move(pipelines)),
      options_(options),
      sampler_(workload.numTrainExamples(), comm.rank(), comm.size(), options.seed),
      optimizer_(workload.params(), options.sgd) {
  TERSE_CHECK(options.batch_size >= 1, InvalidArgument, "batch_size must be >= 1, got " << options.batch_size);
  TERSE_CHECK(options.epochs >= 1, InvalidArgument, "epochs must be >= 1, got " << options.epochs);
  const auto params = workload.params();
  TERSE_CHECK(pipelines_.size() == params.size(), InvalidArgument,
              "workload '" << workload.name() << "' has " << params.size() << " parameter tensors but "
                           << pipelines_.size() << " pipelines were given (one per tensor)");
  for (std::size_t i = 0; i < params.size(); ++i) {
    TERSE_CHECK(pipelines_[i] != nullptr, InvalidArgument, "pipeline " << i << " is null");
    const TensorInfo& info = pipelines_[i]->codec().info();
    TERSE_CHECK(info.numel == params[i].numel() && info.tensor_id == i && info.world_size == comm.size() &&
                    info.rank == comm.rank(),
                InvalidArgument,
                "pipeline " << i << " serves tensor id " << info.tensor_id << " (" << info.numel << " elements, rank "
                            << info.rank << " of " << info.world_size << ") but tensor " << i << " ('" << params[i].name
                            << "') has " << params[i].numel() << " elements on rank " << comm.rank() << " of "
                            << comm.size());
  }
  steps_per_epoch_ = sampler_.batchesPerEpoch(options.batch_size, options.drop_last);
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
  issue_order_.reserve(params.size());
  comm_thread_ = std::thread([this] { commLoop(); });
}

SyncTrainer::~SyncTrainer() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  comm_thread_.join();
}

uint64_t SyncTrainer::payloadBytes() const {
  uint64_t total = 0;
  for (const auto& p : pipelines_) total += p->stats().payload_bytes;
  return total;
}

void SyncTrainer::enqueue(std::span<const std::size_t> tensors) {
  {
    std::lock_guard lock(mutex_);
    for (std::size_t t : tensors) queue_.push_back(t);
  }
  work_cv_.notify_one();
}

void SyncTrainer::commLoop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    const std::size_t t = queue_.front();
    queue_.pop_front();
    if (error_) {
      // After a failure the other tensors are dropped, never run: their collectives would only fail too.
      if (queue_.empty()) idle_cv_.notify_all();
      continue;
    }
    running_ = true;
    issue_order_.push_back(t);
    const uint64_t step = current_step_;
    lock.unlock();
    if (!backward_done_.load(std::memory_order_acquire)) overlapped_.fetch_add(1, std::memory_order_relaxed);
    std::exception_ptr failure;
    try {
      ParamTensor& p = workload_.params()[t];
      // In place: the averaged gradient replaces the local one, which the pipeline has consumed by then.
      pipelines_[t]->step(step, p.grad.data(), p.grad.data());
    } catch (const std::exception& e) {
      failure = std::current_exception();
      // Every rank's pending and later collectives fail at once instead of waiting for this rank.
      comm_.abort("rank " + std::to_string(comm_.rank()) + ": tensor " + std::to_string(t) + " ('" +
                  workload_.params()[t].name + "') failed at step " + std::to_string(step) + ": " + e.what());
    } catch (...) {
      failure = std::current_exception();
      comm_.abort("rank " + std::to_string(comm_.rank()) + ": tensor " + std::to_string(t) + " failed");
    }
    lock.lock();
    if (failure && !error_) error_ = failure;
    running_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void SyncTrainer::waitIdle(std::unique_lock<std::mutex>& lock) {
  idle_cv_.wait(lock, [&] { return queue_.empty() && !running_; });
}

StepRecord SyncTrainer::step() {
  TERSE_CHECK(!finished(), InvalidArgument, "training finished after " << totalSteps() << " steps");
  StepRecord rec;
  rec.step = next_step_;
  rec.epoch = next_step_ / steps_per_epoch_;
  rec.step_in_epoch = next_step_ % steps_per_epoch_;
  if (rec.step_in_epoch == 0)
    epoch_batches_ = sampler_.epochBatches(rec.epoch, options_.batch_size, options_.drop_last);
  const std::vector<int64_t>& batch = epoch_batches_.at(static_cast<std::size_t>(rec.step_in_epoch));

  {
    std::lock_guard lock(mutex_);
    TERSE_CHECK(!error_, InvalidArgument, "SyncTrainer::step after a failed step");
    current_step_ = static_cast<uint64_t>(rec.step);
    issue_order_.clear();
  }
  // The previous step left the communication thread idle, so the stats are stable here.
  const CodecSeconds codec_before = codecSeconds(pipelines_);
  backward_done_.store(false, std::memory_order_release);
  overlapped_.store(0, std::memory_order_relaxed);
  const double comm_before = commSeconds(comm_);

  const auto t0 = Clock::now();
  std::exception_ptr compute_error;
  try {
    rec.loss =
        workload_.forwardBackward(batch, [this](int, std::span<const std::size_t> tensors) { enqueue(tensors); });
  } catch (...) {
    compute_error = std::current_exception();
  }
  backward_done_.store(true, std::memory_order_release);
  const auto t1 = Clock::now();
  CodecSeconds codec_after;
  {
    std::unique_lock lock(mutex_);
    if (compute_error && !error_) {
      // Tensors already handed over may be mid-collective; the peers would wait for the rest forever.
      error_ = compute_error;
      comm_.abort("rank " + std::to_string(comm_.rank()) + ": forwardBackward failed at step " +
                  std::to_string(rec.step));
    }
    // The pipelines reference this workload's grad buffers: never leave while one runs, even on failure.
    waitIdle(lock);
    if (error_) std::rethrow_exception(error_);
    TERSE_CHECK(issue_order_.size() == pipelines_.size(), InternalError,
                "workload '" << workload_.name() << "' reported " << issue_order_.size() << " of " << pipelines_.size()
                             << " tensors in forwardBackward");
    // Idle again and the mutex orders the communication thread's stats writes before this read.
    codec_after = codecSeconds(pipelines_);
  }
  const auto t2 = Clock::now();

  rec.lr = learningRate(lr_, rec.step);
  optimizer_.updateAll(workload_.params(), rec.lr);
  const auto t3 = Clock::now();

  rec.overlapped_tensors = overlapped_.load(std::memory_order_relaxed);
  rec.times.compute_s = seconds(t0, t1);
  rec.times.exposed_comm_s = seconds(t1, t2);
  rec.times.comm_s = commSeconds(comm_) - comm_before;
  rec.times.compress_s = codec_after.encode - codec_before.encode;
  rec.times.decompress_s = codec_after.decode - codec_before.decode;
  rec.times.step_s = seconds(t0, t3);

  ++next_step_;
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
