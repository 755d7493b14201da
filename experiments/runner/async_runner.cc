// Modes ASYNC, SSP and HOGWILD on the inproc transport (runner.h; core/train/param_server_shard.h, async_trainer.h).
//
// ASYNC and SSP: every rank runs async_rank.h's code, the code a process of a tcp job runs (distributed_async.cc):
// shards 0 .. S-1 (serving until every worker left or was dropped), workers S .. S+W-1 (pull, compute, push), rank 0
// also writing the records from the others' reports. Here the ranks are the threads of a ThreadWorld (world.h, which
// owns their failure) over an inproc data fabric with the config's link emulation, and a control fabric of their own
// for the reports: neither emulated nor simulated, and not counted, as a tcp job's control transport is not. There is
// no common step in async training, so the records' `step` is the workers' progress in global-batch units: completed
// worker steps / W, the step a sync run would be at after the same number of gradients. A record is taken at each of
// the sync schedule's evaluation points (every_steps, epoch ends, the last step) from the shards' snapshots at that
// step; training does not pause for it. The last record is taken after every worker finished and every shard stopped.
//
// Elastic workers: worker_settings[].fail_after_steps stops a worker dead (no goodbye; its endpoint stays silent as a
// crashed process's would); the shards drop it after parameter_server.worker_timeout and the others go on. Any other
// failure -- a refused push, a shard that failed, a transport error -- aborts every endpoint and fails the run with
// the first cause, naming the shard or worker.
//
// Simulated time (clock SIMULATED, ASYNC and SSP; DESIGN.md section 9): the World is a SimulatedWorld, so the ranks
// and each shard's serving thread are SimGrid actors on their ranks' hosts (a shard's host is its own, as a server
// process's machine would be), the data frames cross the simulated network in the order they arrive, a straggler's
// computation takes its factor longer, and every wait is a blocking one (async_rank.h: nothing polls). Evaluation is
// not training time (World::aside).
//
// HOGWILD: W worker threads update one shared parameter vector without locks, and the calling thread, the monitor,
// reads it at each evaluation point. It has no multi-process form (its races are between threads of one address
// space) and no simulated one (they are between threads running at the same instant, and actors run one at a time).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "core/common/runtime.h"
#include "core/plugin/loader.h"
#include "core/train/async_trainer.h"
#include "experiments/runner/async_detail.h"
#include "experiments/runner/async_rank.h"
#include "experiments/runner/async_rank_driver.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/runner/world.h"
#include "experiments/workloads/workloads.h"
#include "results/result_writer.h"

namespace terse::runner {
namespace {

using Clock = rt::Clock;
using experiments::Experiment;
using namespace detail;

// What a HOGWILD worker thread publishes; guarded by HogwildRun::mutex_ except `steps`.
struct WorkerState {
  std::atomic<int64_t> steps{0};
  train::StepTimes times;
  bool done = false;       // the thread returned (finished, failed on purpose, or failed)
  int64_t left_step = -1;  // fail_after_steps: when it stopped
  double left_s = 0;
};

// HOGWILD's job: W worker replicas and the evaluation replica (all from the same init seed), the shared parameters and
// the workers.
struct HogwildJob {
  HogwildJob(const Experiment& experiment, const std::shared_ptr<const workloads::DataSplit>& data, const World& world)
      : e(experiment), W(e.workers()) {
    const workloads::WorkloadOptions wo = workloadOptions(e);
    allocating(
        [&] {
          for (int i = 0; i <= W; ++i) models.push_back(workloads::makeWorkload(e.workload().name(), wo, data));
        },
        [&] { return replicasWhat(e, W + 1, models); });
    const uint64_t init_checksum = train::parameterChecksum(evaluator().params());
    for (int w = 0; w < W; ++w)
      TERSE_CHECK(train::parameterChecksum(models[static_cast<std::size_t>(w)]->params()) == init_checksum,
                  InternalError, "replica " << w << " of workload '" << e.workload().name() << "' starts differently");
    flat.resize(evaluator().numParameters());
    train::copyValuesOut(evaluator().params(), flat);
    steps = asyncStepPlan(e, evaluator().numTrainExamples());
    lr = asyncLrSchedule(e, steps);
    points = evalPoints(e, steps);
    partition = dataPartition(e, evaluator());
    const train::SyncTrainerOptions sync_like = trainerOptions(e);
    TERSE_CHECK(sync_like.sgd.momentum == 0, InvalidArgument,
                "mode HOGWILD applies plain SGD (shared lock-free parameters have no agreed momentum buffer): "
                "optimizer.momentum must be 0, got "
                    << sync_like.sgd.momentum);
    allocating(
        [&] {
          shared = std::make_unique<train::HogwildParams>(flat, W, lr, sync_like.sgd.weight_decay);
          for (int w = 0; w < W; ++w) {
            train::AsyncTrainerOptions o = asyncWorkerOptions(e, w);
            o.slowdown = world.trainerSlowdown(o.slowdown);
            o.partition = partition;
            workers.push_back(
                std::make_unique<train::HogwildWorker>(*models[static_cast<std::size_t>(w)], *shared, w, W, o));
          }
        },
        [&] {
          return std::to_string(W) + " workers for " + std::to_string(evaluator().numParameters()) + " parameters";
        });
  }

  train::Workload& evaluator() { return *models.back(); }

  const Experiment& e;
  const int W;
  std::vector<std::unique_ptr<train::Workload>> models;
  std::shared_ptr<const train::Partition> partition;  // data.partition DIRICHLET's shards; null for IID
  std::vector<float> flat;                            // the global model: evaluated at every record
  train::StepPlan steps;
  train::LrScheduleOptions lr;
  std::vector<int64_t> points;
  std::unique_ptr<train::HogwildParams> shared;
  std::vector<std::unique_ptr<train::HogwildWorker>> workers;
};

// HOGWILD's workers, and how the monitor sees them: in place.
class HogwildRun final : public AsyncView {
 public:
  HogwildRun(HogwildJob& job, AsyncRecorder& recorder)
      : job_(job), recorder_(recorder), state_(static_cast<std::size_t>(job.W)) {}

  // A failed rank (the World keeps the root cause) wakes the monitor.
  void stop() {
    stop_.store(true);
    cv_.notify_all();
  }

  void worker(int w) {
    WorkerState& st = state_[static_cast<std::size_t>(w)];
    train::HogwildWorker& worker = *job_.workers[static_cast<std::size_t>(w)];
    int64_t left = -1;
    try {
      left = runAsyncWorker(
          worker, experiments::workerSettings(job_.e, w).fail_after_steps(),
          [&] {
            worker.step();
            {
              std::lock_guard lock(mutex_);
              st.times = worker.totals();
              st.steps.fetch_add(1);
            }
            cv_.notify_all();
          },
          [&] { return stop_.load(); });
    } catch (...) {
      std::lock_guard lock(mutex_);
      st.done = true;
      throw;  // to the World, which stops the monitor
    }
    std::lock_guard lock(mutex_);
    if (left >= 0) {
      st.left_step = left;
      st.left_s = since(start_);
    }
    st.done = true;
    cv_.notify_all();
  }

  // On the calling thread while the workers run.
  void monitor() { recorder_.recordPoints(*this, job_.points); }

  // The last record: after every worker finished.
  void finish() { recorder_.recordFinal(*this); }

  // No server to hold a consistent copy: reads the shared vector once progress crossed the point.
  std::optional<AsyncPoint> collect(int64_t point) override {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        cv_.waitFor(lock, std::chrono::milliseconds(100), [&] {
          int64_t n = 0;
          bool done = true;
          for (const auto& st : state_) {
            n += st.steps.load();
            done = done && st.done;
          }
          return stop_.load() || done || n / job_.W >= point;
        });
      }
      if (stop_.load() || allDone()) return std::nullopt;
      const int64_t worker_steps = workerSteps();
      const int64_t done = worker_steps / job_.W;
      if (done >= point) {
        const double wall_s = since(start_);
        job_.shared->read(job_.flat);
        return AsyncPoint{done, worker_steps, wall_s};
      }
      recorder_.waiting(done);
    }
  }
  AsyncPoint collectFinal() override {
    const int64_t worker_steps = workerSteps();
    const double wall_s = since(start_);
    job_.shared->read(job_.flat);
    return {worker_steps / job_.W, worker_steps, wall_s};
  }
  std::span<const float> params() const override { return job_.flat; }
  std::pair<double, int64_t> losses(int w, int64_t from, int64_t to) override {
    return job_.workers[static_cast<std::size_t>(w)]->losses().sum(from, to);
  }
  AsyncTallies tallies() override {
    AsyncTallies t;
    t.workers.resize(static_cast<std::size_t>(job_.W));
    {
      std::lock_guard lock(mutex_);
      for (int w = 0; w < job_.W; ++w) {
        const WorkerState& st = state_[static_cast<std::size_t>(w)];
        WorkerTally& wt = t.workers[static_cast<std::size_t>(w)];
        wt.steps = st.steps.load();
        wt.times = st.times;
        wt.left_step = st.left_step;
        wt.left_s = st.left_s;
      }
    }
    t.hogwild_staleness = job_.shared->staleness();
    return t;
  }

 private:
  int64_t workerSteps() const {
    int64_t n = 0;
    for (const auto& st : state_) n += st.steps.load();
    return n;
  }
  bool allDone() {
    std::lock_guard lock(mutex_);
    return std::all_of(state_.begin(), state_.end(), [](const WorkerState& s) { return s.done; });
  }

  HogwildJob& job_;
  AsyncRecorder& recorder_;
  std::vector<WorkerState> state_;
  rt::Mutex mutex_;
  rt::CondVar cv_;
  std::atomic<bool> stop_{false};
  const Clock::time_point start_ = rt::now();
};

// An in-process parameter-server job: per rank a replica, a data and a control endpoint, its compressor instance and
// its AsyncRank (async_rank.h), as the processes of a tcp job would each have.
struct ParamServerJob {
  ParamServerJob(const Experiment& experiment, const std::shared_ptr<const workloads::DataSplit>& split)
      : e(experiment), S(e.parameter_server().servers()), W(e.workers()) {
    const workloads::WorkloadOptions wo = workloadOptions(e);
    allocating(
        [&] {
          for (int r = 0; r < S + W; ++r) models.push_back(workloads::makeWorkload(e.workload().name(), wo, split));
        },
        [&] { return replicasWhat(e, S + W, models); });
    partition = dataPartition(e, *models.front());
  }

  // The endpoints exist before the first plugin call (the World aborts them on an overrun).
  void connect(std::shared_ptr<comm::FrameNetwork> network) {
    comm::InprocOptions io;
    io.emulation = experiments::emulationConfig(e);
    io.network = std::move(network);  // simulated: SimGrid times the frames instead of the pacers
    for (auto& t : comm::makeInprocTransports(S + W, io))
      data.push_back(std::make_unique<comm::HostCommunicator>(std::move(t)));
    for (auto& t : comm::makeInprocTransports(S + W))
      control.push_back(std::make_unique<comm::HostCommunicator>(std::move(t)));
  }
  void abort(const std::string& reason) {
    for (auto& c : data) c->transport().abort(reason);
    for (auto& c : control) c->transport().abort(reason);
  }

  // One compressor instance per rank, as separate processes would have.
  void build(PluginLoader& loader, results::Provenance& prov) {
    auto plugin = loader.loadCompressor(e.compressor().name());
    const Params params = experiments::pluginParams(e.compressor());
    const auto pull_plugin = detail::loadPullCompressor(e, loader);
    const Params pull_params = experiments::pluginParams(e.parameter_server().pull_compressor());
    allocating(
        [&] {
          for (int r = 0; r < S + W; ++r) {
            std::shared_ptr<Compressor> instance = plugin->instantiate(params);
            std::shared_ptr<Compressor> pull = pull_plugin ? pull_plugin->instantiate(pull_params) : nullptr;
            if (r == 0) {
              const std::span<const uint64_t> p = instance->phaseSteps();
              phases.assign(p.begin(), p.end());
              prov.plugins.push_back(
                  {plugin->info(), instance->caps(DType::kF32), params, instance->resolvedParams(), {}});
              if (pull)
                prov.plugins.push_back({pull_plugin->info(), pull->caps(DType::kF32), pull_params,
                                        pull->resolvedParams(), "pull_compressor"});
            }
            ranks.push_back(std::make_unique<AsyncRank>(
                e, r, *models[static_cast<std::size_t>(r)], *data[static_cast<std::size_t>(r)],
                *control[static_cast<std::size_t>(r)], std::move(instance), std::move(pull), partition));
          }
        },
        [&] {
          return std::to_string(S) + " parameter-server shards and " + std::to_string(W) +
                 " workers (clients, buffers, compressor instances) for " +
                 std::to_string(models.front()->numParameters()) + " parameters";
        });
  }

  // Rank r's body in `world`; rank 0 writes `report`.
  void run(int r, ThreadWorld& world, const std::function<std::string(int)>& label, const AsyncReport& report) {
    AsyncRank& me = *ranks[static_cast<std::size_t>(r)];
    try {
      me.checkInitialReplicas();
      me.run(r == 0 ? std::optional<AsyncReport>(report) : std::nullopt, world, "this process");
    } catch (...) {
      // Every endpoint fails first, which ends this rank's shard (it serves until its transport fails), then the
      // shard's thread is joined here: in a simulation it is an actor, which must end inside the simulation.
      world.abortAll(label(r) + " failed: " + shortWhat(std::current_exception()));
      me.stop();
      throw;
    }
  }

  const Experiment& e;
  const int S, W;
  std::vector<std::unique_ptr<train::Workload>> models;
  std::shared_ptr<const train::Partition> partition;  // data.partition DIRICHLET's shards, drawn once; null for IID
  std::vector<std::unique_ptr<comm::HostCommunicator>> data;
  std::vector<std::unique_ptr<comm::HostCommunicator>> control;
  std::vector<std::unique_ptr<AsyncRank>> ranks;  // after what they use
  std::vector<uint64_t> phases;                   // the push compressor's (terse/phases_v1.h), from build
};

}  // namespace

void Runner::runInprocAsync(const Experiment& e, results::ResultWriter& writer, RunSummary& summary,
                            std::shared_ptr<comm::FrameNetwork> network) {
  TERSE_CHECK(e.transport() == Experiment::INPROC, InvalidArgument,
              "runInprocAsync serves transport INPROC, got " << Experiment::Transport_Name(e.transport()));
  const bool simulated = network != nullptr;
  const auto start_time = results::isoTimeUtc();
  const bool hogwild = e.mode() == Experiment::HOGWILD;
  TERSE_CHECK(!(hogwild && simulated), InvalidArgument, "mode HOGWILD has no simulated form (async_runner.cc)");
  const int S = hogwild ? 0 : e.parameter_server().servers();
  const int W = e.workers();
  results::Provenance prov =
      baseProvenance(e, "inproc", S + W, start_time, options_.terse_version, experiments::emulationConfig(e).enabled());
  prov.mode = asyncModeName(e.mode());
  if (simulated) noteSimulation(prov, e, *sim_compute_, sim_notes_);
  auto progressFor = [&](const train::StepPlan& steps) {
    return Progress(options_.progress, options_.progress_out ? *options_.progress_out : std::cerr, e.variant(),
                    e.epochs(), steps.total_steps, steps.steps_per_epoch);
  };
  if (hogwild) {
    ThreadWorld ranks(W, [](int r) { return "worker " + std::to_string(r) + " (rank " + std::to_string(r) + ")"; });
    HogwildJob job(e, dataFor(e), ranks);
    notePartition(prov, e, job.evaluator(), job.partition.get());
    writer.writeProvenance(prov);
    Progress progress = progressFor(job.steps);
    AsyncRecorder recorder(e, job.steps, job.lr, job.evaluator(), ranks, {writer, summary, progress});
    HogwildRun run(job, recorder);
    ranks.onAbort([&run](const std::string&) { run.stop(); });
    try {
      ranks.run([&](int w) { run.worker(w); }, [&] { run.monitor(); });
    } catch (...) {
      progress.finish();
      throw;
    }
    run.finish();
    progress.finish();
    return;
  }
  // ASYNC, SSP. The ranks: shards 0 .. S-1, then workers, as actors of the simulation (each worker at its straggler
  // factor) or threads. The World aborts every endpoint when one fails or a plugin call overruns (the process then
  // ends, detail::PluginWatch).
  const auto label = [S](int r) {
    return r < S ? "server shard " + std::to_string(r) + " (rank " + std::to_string(r) + ")"
                 : "worker " + std::to_string(r - S) + " (rank " + std::to_string(r) + ")";
  };
  ParamServerJob job(e, dataFor(e));
  job.connect(std::move(network));
  std::unique_ptr<ThreadWorld> ranks;  // after the endpoints it aborts: it goes first
  if (simulated) {
    std::vector<double> slowdowns(static_cast<std::size_t>(S), 1.0);
    for (int w = 0; w < W; ++w) slowdowns.push_back(experiments::workerSettings(e, w).slowdown());
    ranks = std::make_unique<SimulatedWorld>(std::move(slowdowns), label);
  } else {
    ranks = std::make_unique<ThreadWorld>(S + W, label);
  }
  ranks->onAbort([&job](const std::string& reason) { job.abort(reason); });
  job.build(*options_.loader, prov);
  notePartition(prov, e, *job.models.front(), job.partition.get());
  writer.writeProvenance(prov);
  if (const std::string w = compressorPhasesWarning(
          e, job.phases, static_cast<int64_t>(job.ranks.back()->steps().total_steps));  // a worker's steps
      !w.empty())
    std::cerr << "warning: [" << e.variant() << "] " << w << '\n';
  Progress progress = progressFor(job.ranks.front()->steps());
  const AsyncReport report{writer, summary, progress};
  try {
    ranks->run([&](int r) { job.run(r, *ranks, label, report); });
  } catch (...) {
    progress.finish();
    throw;
  }
  progress.finish();
}

}  // namespace terse::runner
