// The rank-side pieces of the asynchronous modes (issue 41) that every path runs, so that they are one code, not
// copies that drift apart: a worker's loop (step until done, stopped, or its fail_after_steps), a shard's tally, and
// rank 0's records -- the evaluation-point rule, the global model's evaluation, train_loss, the async keys and the
// progress line. ASYNC and SSP run them inside async_rank.h's rank, in process and over tcp alike; HOGWILD, which has
// no shards and no multi-process form, runs them with a monitor that reads the shared vector in place
// (async_runner.cc). How rank 0 learns the others' numbers is an AsyncView.
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/train/async_trainer.h"
#include "core/train/param_server_shard.h"
#include "core/train/workload.h"
#include "experiments/config/config.h"
#include "experiments/runner/async_detail.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/world.h"
#include "results/result_writer.h"

namespace terse::runner::detail {

// Worker w's loss sum and count over its own steps [from, to).
using WorkerLosses = std::function<std::pair<double, int64_t>(int worker, int64_t from, int64_t to)>;

// The train_loss of the record at global step `done` after the record at `last`: worker 0's batch losses over steps
// [last, done), as sync's is rank 0's (so SSP with s = 0 matches sync); every other worker's over those steps when
// worker 0 ran none of them (it stopped, or it is a straggler far behind). Returns their sum and count.
std::pair<double, int64_t> asyncTrainLoss(int workers, int64_t last, int64_t done, const WorkerLosses& losses);

// A shard's cumulative numbers from its stats; `start` is when the run started (the drop times count from it).
ShardTally shardTally(const train::ServerStats& stats, std::chrono::steady_clock::time_point start);

// Runs a worker until it finished all its steps or stop() says the run failed elsewhere; step() takes one step and
// publishes it. A worker with fail_after > 0 stops dead after that many steps (no goodbye: its endpoint stays silent,
// as a crashed process's would). Returns the step it stopped dead at, or -1.
int64_t runAsyncWorker(const train::AsyncWorkerBase& worker, int64_t fail_after, const std::function<void()>& step,
                       const std::function<bool()>& stop);

// Every rank's numbers at one record, however rank 0 learned them.
struct AsyncTallies {
  std::vector<WorkerTally> workers;
  std::vector<ShardTally> shards;                  // empty for HOGWILD
  std::map<uint64_t, uint64_t> hogwild_staleness;  // HOGWILD's, which has no shards
};

// The global model at a record, as rank 0 collected it.
struct AsyncPoint {
  int64_t step = 0;          // the record's global step
  int64_t worker_steps = 0;  // completed worker steps, all workers together
  double wall_s = 0;         // when the last of its parameters were taken
};

// How rank 0 sees the other ranks of an async run: from their reports (a parameter server's ranks, async_rank.h) or in
// place (HOGWILD's monitor, async_runner.cc). The evaluation-point rule and the records are AsyncRecorder's, the same
// for both.
class AsyncView {
 public:
  virtual ~AsyncView() = default;
  // Waits until the workers' progress reaches evaluation point `point` and puts the global model there into params():
  // a parameter server's shards' snapshots at that step (the record's step is the point), HOGWILD's shared vector once
  // progress crossed it (the record's step is the progress then). nullopt: the workers never reach it (they all
  // stopped first) or the run failed; the records but the last end there.
  virtual std::optional<AsyncPoint> collect(int64_t point) = 0;
  // Once every worker stopped and every shard is done: the final model in params().
  virtual AsyncPoint collectFinal() = 0;
  virtual std::span<const float> params() const = 0;
  // Asked after the evaluation: in real time the workers go on meanwhile, and the record counts what they did by then.
  virtual AsyncTallies tallies() = 0;
  // Worker w's loss sum and count over its own steps [from, to).
  virtual std::pair<double, int64_t> losses(int worker, int64_t from, int64_t to) = 0;
};

// Rank 0's records of an async run: what it writes to, and the progress line.
struct AsyncReport {
  results::ResultWriter& writer;
  RunSummary& summary;
  Progress& progress;
};

class AsyncRecorder {
 public:
  // `evaluator`: the replica the global model is evaluated on (its parameters are overwritten at each record).
  AsyncRecorder(const experiments::Experiment& e, const train::StepPlan& steps, const train::LrScheduleOptions& lr,
                train::Workload& evaluator, const World& world, AsyncReport report);
  // A record at every evaluation point of the sync schedule (`points`, every_steps and epoch ends) the workers reach,
  // each point once: a record at step s stands for every point up to s.
  void recordPoints(AsyncView& view, std::span<const int64_t> points);
  // The last record, at the end of the run.
  void recordFinal(AsyncView& view);
  // The progress line between records, at global step `done`.
  void waiting(int64_t done);

 private:
  // Evaluates view.params() and appends the record of `at`.
  void record(AsyncView& view, const AsyncPoint& at);
  double hostSeconds() const;

  int workers_;
  train::StepPlan steps_;
  train::LrScheduleOptions lr_;
  train::Workload& evaluator_;
  const World& world_;
  AsyncReport report_;
  int64_t last_done_ = 0;
  // The progress line's rate and ETA are for the person waiting: host time, also when the records' times are simulated.
  std::chrono::steady_clock::time_point host_start_;
};

}  // namespace terse::runner::detail
