// What the in-process (async_runner.cc) and the multi-process (distributed_async.cc) paths of the asynchronous modes
// share: the evaluation schedule, the learning-rate schedule the shards apply, and how a metrics record is filled
// from per-worker and per-shard tallies (the keys are documented in results/result_writer.h). Internal to
// experiments/runner.
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/common/dtype.h"
#include "core/train/async_trainer.h"
#include "core/train/optimizer.h"
#include "core/train/param_server_client.h"
#include "core/train/param_server_shard.h"
#include "experiments/config/config.h"
#include "results/result_writer.h"

namespace terse {
class PluginLoader;
class CompressorPlugin;
}  // namespace terse

namespace terse::runner::detail {

// The pull compressor's plugin (parameter_server.pull_compressor), or null for "none": pulls carry the parameters.
std::shared_ptr<const CompressorPlugin> loadPullCompressor(const experiments::Experiment& e, PluginLoader& loader);

// One worker's cumulative numbers at a record.
struct WorkerTally {
  int64_t steps = 0;
  train::StepTimes times;
  uint64_t payload_bytes = 0;  // pushed: the compressor's output (raw f32 without one)
  uint64_t pull_payload_bytes =
      0;                   // pulled: the pull replies' bodies (parameters in pull_dtype or compressed, versions)
  uint64_t bytes_out = 0;  // its transport: sent (pushes, pulls' requests, pings) and received (replies)
  uint64_t bytes_in = 0;
  int64_t left_step = -1;  // >= 0 once it stopped dead (fail_after_steps)
  double left_s = 0;       // when, in seconds of the run
};

// One server shard's cumulative numbers at a record.
struct ShardTally {
  std::map<uint64_t, uint64_t> staleness;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  std::vector<double> dropped_s;  // per worker: seconds of the run when the shard dropped it, < 0 while not
  // Compressed pulls (train::ServerStats): delta pulls served and the sums of their residuals and parameters squared.
  uint64_t delta_pulls = 0;
  double pull_residual_sq = 0;
  double pull_params_sq = 0;
};

std::string asyncModeName(experiments::Experiment::Mode mode);  // "async", "ssp", "hogwild"
DType pullDtype(experiments::ParameterServer::PullDtype dtype);

// The sync schedule's evaluation points (every_steps, epoch ends) in (0, total), in global steps; the last record is
// taken at the end of the run.
std::vector<int64_t> evalPoints(const experiments::Experiment& e, const train::StepPlan& plan);

// The learning-rate schedule over global steps of a W-worker run (the sync trainer's, warm-up epochs converted).
train::LrScheduleOptions asyncLrSchedule(const experiments::Experiment& e, const train::StepPlan& plan);

// The shards' options (lr schedule, optimizer, staleness bound, timeout, snapshots at `points`) without the
// compressor, which each shard instantiates itself.
train::ServerOptions serverOptions(const experiments::Experiment& e, const train::LrScheduleOptions& lr,
                                   const std::vector<int64_t>& points);
// A worker's client options without the compressor.
train::ClientOptions clientOptions(const experiments::Experiment& e);
train::AsyncTrainerOptions asyncWorkerOptions(const experiments::Experiment& e, int worker);
// The shards' plan over `params` (tensors in order) for S shards; with sparse_gradients every row-sparse tensor is
// marked so (pushed and pulled as rows, param_server_plan.h).
train::PsPlan psPlan(const experiments::Experiment& e, std::span<const train::ParamTensor> params, int num_shards);
// A worker's step plan (gradient_accumulation_steps batches a step).
train::StepPlan asyncStepPlan(const experiments::Experiment& e, int64_t num_examples);
// A plain-f32 run (compressor none, no error feedback or momentum correction) pushes raw values: no codec at all.
bool rawPushes(const experiments::Experiment& e);

// Fills the bytes, per-step times and the async keys of `m` (results/result_writer.h). `shards` empty = HOGWILD,
// whose staleness is `hogwild_staleness` and which has no wire.
//
// A parameter-server job's wire bytes per worker are all it put on the network over the workers: every data frame goes
// between a worker and a shard, so that is what the workers sent (pushes, clocks, pull requests, pings) plus what they
// received (the shards' replies: pulls and acknowledgements), as a sync run's are every rank's sends over its ranks.
// Counted at the workers, whose report holds both directions as of one moment (a shard's snapshot is of another).
// The two directions are kept apart too (push_bytes_per_worker, pull_bytes_per_worker), and the payload bytes
// likewise: the pushes' compressor output plus the pull replies' bodies.
void fillAsyncRecord(results::MetricsRecord& m, int64_t worker_steps, std::span<const WorkerTally> workers,
                     std::span<const ShardTally> shards, const std::map<uint64_t, uint64_t>& hogwild_staleness);

}  // namespace terse::runner::detail
