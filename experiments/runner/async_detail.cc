#include "experiments/runner/async_detail.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/comm/link_emulation.h"
#include "core/plugin/loader.h"

#include "experiments/runner/runner_detail.h"

namespace terse::runner::detail {
namespace {

using experiments::Experiment;
using experiments::ParameterServer;

// Staleness buckets written per record; larger tau go to the overflow count.
constexpr uint64_t kHistogramBuckets = results::kStalenessHistBuckets;

void stalenessFields(const std::map<uint64_t, uint64_t>& hist, results::MetricsRecord& m) {
  uint64_t n = 0, overflow = 0, max_tau = 0;
  double sum = 0;
  for (const auto& [tau, count] : hist) {
    n += count;
    sum += static_cast<double>(tau) * static_cast<double>(count);
    max_tau = std::max(max_tau, tau);
    if (tau >= kHistogramBuckets) overflow += count;
  }
  m.extra.emplace_back(std::string(results::kStalenessMeanKey), n > 0 ? sum / static_cast<double>(n) : 0.0);
  m.extra.emplace_back(std::string(results::kStalenessMaxKey), static_cast<double>(max_tau));
  for (const auto& [tau, count] : hist)
    if (tau < kHistogramBuckets)
      m.extra.emplace_back(std::string(results::kStalenessHistPrefix) + std::to_string(tau),
                           static_cast<double>(count));
  m.extra.emplace_back(std::string(results::kStalenessHistOverflowKey), static_cast<double>(overflow));
  m.extra.emplace_back(std::string(results::kStalenessBucketsKey), static_cast<double>(kHistogramBuckets));
}

}  // namespace

std::string asyncModeName(Experiment::Mode mode) {
  switch (mode) {
    case Experiment::ASYNC:
      return "async";
    case Experiment::SSP:
      return "ssp";
    case Experiment::HOGWILD:
      return "hogwild";
    default:
      return "sync";
  }
}

DType pullDtype(ParameterServer::PullDtype dtype) {
  switch (dtype) {
    case ParameterServer::F16:
      return DType::kF16;
    case ParameterServer::BF16:
      return DType::kBF16;
    default:
      return DType::kF32;
  }
}

std::shared_ptr<const CompressorPlugin> loadPullCompressor(const experiments::Experiment& e, PluginLoader& loader) {
  const std::string& name = e.parameter_server().pull_compressor().name();
  if (name.empty() || name == "none") return nullptr;
  return loader.loadCompressor(name);
}

std::vector<int64_t> evalPoints(const Experiment& e, const train::StepPlan& plan) {
  const int64_t every = e.eval().every_steps();
  std::vector<int64_t> points;
  for (int64_t s = 1; s < plan.total_steps; ++s)
    if ((every > 0 && s % every == 0) || (e.eval().per_epoch() && s % plan.steps_per_epoch == 0)) points.push_back(s);
  return points;
}

train::LrScheduleOptions asyncLrSchedule(const Experiment& e, const train::StepPlan& plan) {
  const train::SyncTrainerOptions sync_like = trainerOptions(e);
  train::LrScheduleOptions lr = sync_like.lr;
  lr.world_size = e.workers();
  lr.steps_per_epoch = plan.steps_per_epoch;
  lr.total_steps = plan.total_steps;
  if (sync_like.warmup_epochs > 0)
    lr.warmup_steps = std::llround(sync_like.warmup_epochs * static_cast<double>(plan.steps_per_epoch));
  train::validateLrSchedule(lr);
  return lr;
}

train::ServerOptions serverOptions(const Experiment& e, const train::LrScheduleOptions& lr,
                                   const std::vector<int64_t>& points) {
  train::ServerOptions so;
  so.lr = lr.lr;
  so.lr_schedule = [lr](uint64_t t) { return train::learningRate(lr, static_cast<int64_t>(t)); };
  so.sgd = trainerOptions(e).sgd;
  so.staleness_aware_lr = e.parameter_server().staleness_aware_lr();
  so.staleness_bound =
      e.mode() == Experiment::SSP ? static_cast<uint64_t>(e.staleness_bound()) : train::kNoStalenessBound;
  so.worker_timeout =
      std::chrono::milliseconds(std::llround(comm::parseDuration(e.parameter_server().worker_timeout()) * 1000.0));
  so.run_seed = e.seed();
  so.snapshot_steps.assign(points.begin(), points.end());
  return so;
}

train::ClientOptions clientOptions(const Experiment& e) {
  train::ClientOptions co;
  co.codec = experiments::codecOptions(e);
  co.run_seed = e.seed();
  co.pull_dtype = pullDtype(e.parameter_server().pull_dtype());
  // Pings must reach an idle shard well within its timeout.
  const auto timeout =
      std::chrono::milliseconds(std::llround(comm::parseDuration(e.parameter_server().worker_timeout()) * 1000.0));
  co.heartbeat = std::min(std::chrono::milliseconds(200), timeout / 4);
  return co;
}

train::AsyncTrainerOptions asyncWorkerOptions(const Experiment& e, int worker) {
  train::AsyncTrainerOptions o;
  o.batch_size = e.data().batch_size();
  o.epochs = e.epochs();
  o.seed = e.seed();
  o.slowdown = experiments::workerSettings(e, worker).slowdown();
  o.jitter = computeJitter(e, worker);
  o.clip_grad_norm = e.optimizer().clip_grad_norm();
  o.accumulation_steps = e.has_gradient_accumulation_steps() ? e.gradient_accumulation_steps() : 1;
  return o;
}

train::PsPlan psPlan(const Experiment& e, std::span<const train::ParamTensor> params, int num_shards) {
  std::vector<uint64_t> numel;
  for (const auto& p : params) numel.push_back(p.numel());
  train::PsPlan plan = train::planShards(numel, num_shards);
  if (e.sparse_gradients())
    for (std::size_t t = 0; t < params.size(); ++t)
      if (params[t].row_sparse) train::markRowSparse(plan, static_cast<uint32_t>(t), params[t].rowLength());
  return plan;
}

train::StepPlan asyncStepPlan(const Experiment& e, int64_t num_examples) {
  const train::AsyncTrainerOptions o = asyncWorkerOptions(e, 0);
  return train::planSteps(num_examples, e.workers(), o.batch_size, o.epochs, o.drop_last, o.accumulation_steps);
}

bool rawPushes(const Experiment& e) {
  const CodecOptions c = experiments::codecOptions(e);
  return e.compressor().name() == "none" && !c.error_feedback && c.momentum_correction == 0;
}

void fillAsyncRecord(results::MetricsRecord& m, int64_t worker_steps, std::span<const WorkerTally> workers,
                     std::span<const ShardTally> shards, const std::map<uint64_t, uint64_t>& hogwild_staleness) {
  const auto W = static_cast<int>(workers.size());
  train::StepTimes sum;
  uint64_t payload = 0, pull_payload = 0, sent = 0, received = 0;
  for (const WorkerTally& w : workers) {
    sum.compute_s += w.times.compute_s;
    sum.compress_s += w.times.compress_s;
    sum.decompress_s += w.times.decompress_s;
    sum.comm_s += w.times.comm_s;
    sum.exposed_comm_s += w.times.exposed_comm_s;
    sum.step_s += w.times.step_s;
    payload += w.payload_bytes;
    pull_payload += w.pull_payload_bytes;
    sent += w.bytes_out;
    received += w.bytes_in;
  }
  const double n = static_cast<double>(std::max<int64_t>(1, worker_steps));
  m.compute_s_per_step = sum.compute_s / n;
  m.compress_s_per_step = sum.compress_s / n;
  m.decompress_s_per_step = sum.decompress_s / n;
  m.comm_s_per_step = sum.comm_s / n;
  m.exposed_comm_s_per_step = sum.exposed_comm_s / n;
  m.step_s_per_step = sum.step_s / n;
  const auto per_worker = static_cast<uint64_t>(std::max(1, W));
  m.payload_bytes_per_worker = (payload + pull_payload) / per_worker;
  m.wire_bytes_per_worker = (sent + received) / per_worker;
  if (!shards.empty()) {
    const double w = static_cast<double>(per_worker);
    m.extra.emplace_back(std::string(results::kPushBytesKey), static_cast<double>(sent) / w);
    m.extra.emplace_back(std::string(results::kPullBytesKey), static_cast<double>(received) / w);
    m.extra.emplace_back(std::string(results::kPushPayloadBytesKey), static_cast<double>(payload) / w);
    m.extra.emplace_back(std::string(results::kPullPayloadBytesKey), static_cast<double>(pull_payload) / w);
  }

  uint64_t delta_pulls = 0;
  double residual_sq = 0, params_sq = 0;
  for (const ShardTally& s : shards) {
    delta_pulls += s.delta_pulls;
    residual_sq += s.pull_residual_sq;
    params_sq += s.pull_params_sq;
  }
  if (delta_pulls > 0)
    m.extra.emplace_back(std::string(results::kPullResidualKey),
                         params_sq > 0 ? std::sqrt(residual_sq / params_sq) : 0.0);

  std::map<uint64_t, uint64_t> hist = hogwild_staleness;
  std::vector<double> dropped(workers.size(), -1);
  for (std::size_t k = 0; k < shards.size(); ++k) {
    for (const auto& [tau, count] : shards[k].staleness) hist[tau] += count;
    m.extra.emplace_back("server" + std::to_string(k) + "_bytes_in", static_cast<double>(shards[k].bytes_in));
    m.extra.emplace_back("server" + std::to_string(k) + "_bytes_out", static_cast<double>(shards[k].bytes_out));
    for (std::size_t w = 0; w < workers.size() && w < shards[k].dropped_s.size(); ++w)
      if (shards[k].dropped_s[w] >= 0 && (dropped[w] < 0 || shards[k].dropped_s[w] < dropped[w]))
        dropped[w] = shards[k].dropped_s[w];  // the first shard to drop it
  }
  int live = W;
  for (std::size_t w = 0; w < workers.size(); ++w) {
    if (!shards.empty()) {
      m.extra.emplace_back("worker" + std::to_string(w) + "_bytes_out", static_cast<double>(workers[w].bytes_out));
      m.extra.emplace_back("worker" + std::to_string(w) + "_bytes_in", static_cast<double>(workers[w].bytes_in));
    }
    if (dropped[w] >= 0 || workers[w].left_step >= 0) --live;
  }
  stalenessFields(hist, m);
  m.extra.emplace_back("workers_live", static_cast<double>(live));
  for (std::size_t w = 0; w < workers.size(); ++w) {
    if (workers[w].left_step < 0 && dropped[w] < 0) continue;
    const std::string key = "worker" + std::to_string(w);
    if (workers[w].left_step >= 0) {
      m.extra.emplace_back(key + "_left_step", static_cast<double>(workers[w].left_step));
      m.extra.emplace_back(key + "_left_s", workers[w].left_s);
    }
    if (dropped[w] >= 0) m.extra.emplace_back(key + "_dropped_s", dropped[w]);
  }
}

}  // namespace terse::runner::detail
