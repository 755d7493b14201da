// Modes ASYNC, SSP and HOGWILD on the inproc transport (runner.h; core/train/param_server_shard.h, async_trainer.h).
//
// Threads: one per server shard (ranks 0 .. S-1 of the inproc job, serving until every worker left or was dropped),
// one per worker (ranks S .. S+W-1: pull, compute, push), the ranks of a ThreadWorld (world.h, which owns their
// failure), and the calling thread as the monitor, which evaluates the global model. There is no common step in async
// training, so the records' `step` is the workers' progress in global-batch units: completed worker steps / W, the step
// a sync run would be at after the same number of gradients. An evaluation point is due when that crosses one of the
// sync schedule's points (every_steps, epoch ends, the last step); the monitor then reads the shards' current
// parameters (each under its shard's lock: pushes in flight may land on one shard and not yet on another, as any reader
// of a parameter server sees) into a separate evaluation replica. Training does not pause for it. The last record is
// taken after every worker finished and every shard stopped.
//
// Elastic workers: worker_settings[].fail_after_steps stops a worker dead (no goodbye; its endpoint stays silent as a
// crashed process's would); the shards drop it after parameter_server.worker_timeout and the others go on. Any other
// failure -- a refused push, a shard that failed, a transport error -- aborts every endpoint and fails the run with
// the first cause, naming the shard or worker.
//
// Simulated time (clock SIMULATED, ASYNC and SSP; DESIGN.md section 9): every thread above is a runtime thread
// (core/common/runtime.h), so the shards and workers are SimGrid actors on their ranks' hosts (a shard's host is its
// own, as a server process's machine would be), the frames cross the simulated network in the order they arrive, a
// straggler's computation takes its factor longer, and the monitor waits without timeouts (a timed poll would advance
// the simulated clock forever once the others are done). Evaluation is not training time (rt::uncounted). HOGWILD has
// no simulated form: its races are between threads running at the same instant, and actors run one at a time.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "core/common/runtime.h"
#include "core/plugin/loader.h"
#include "core/train/async_trainer.h"
#include "core/train/param_server_client.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_shard.h"
#include "experiments/runner/async_detail.h"
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

// What a worker thread publishes; guarded by InprocAsyncRun::mutex_ except `steps`.
struct WorkerState {
  std::atomic<int64_t> steps{0};
  train::StepTimes times;
  uint64_t payload_bytes = 0;
  bool done = false;       // the thread returned (finished, failed on purpose, or failed)
  int64_t left_step = -1;  // fail_after_steps: when it stopped
  double left_s = 0;
};

// The in-process job: W worker replicas and the evaluation replica (all from the same init seed), then per rank the
// shards, clients and workers, each with its share of the parameters and its buffers.
struct InprocAsyncJob {
  InprocAsyncJob(const Experiment& experiment, const std::shared_ptr<const workloads::DataSplit>& data)
      : e(experiment),
        W(e.workers()),
        hogwild(e.mode() == Experiment::HOGWILD),
        S(hogwild ? 0 : e.parameter_server().servers()) {
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
  }

  // The ranks' objects; the transports exist before the first plugin call (the World aborts them on an overrun).
  void build(PluginLoader& loader, std::shared_ptr<comm::FrameNetwork> network, const World& world,
             results::Provenance& prov) {
    const train::SyncTrainerOptions sync_like = trainerOptions(e);
    auto workerOptions = [&](int w) {
      train::AsyncTrainerOptions o = asyncWorkerOptions(e, w);
      o.slowdown = world.trainerSlowdown(o.slowdown);
      return o;
    };
    allocating(
        [&] {
          if (hogwild) {
            TERSE_CHECK(sync_like.sgd.momentum == 0, InvalidArgument,
                        "mode HOGWILD applies plain SGD (shared lock-free parameters have no agreed momentum buffer): "
                        "optimizer.momentum must be 0, got "
                            << sync_like.sgd.momentum);
            shared = std::make_unique<train::HogwildParams>(flat, W, lr, sync_like.sgd.weight_decay);
            for (int w = 0; w < W; ++w)
              hog_workers.push_back(std::make_unique<train::HogwildWorker>(*models[static_cast<std::size_t>(w)],
                                                                           *shared, w, W, workerOptions(w)));
            return;
          }
          auto plugin = loader.loadCompressor(e.compressor().name());
          const Params params = experiments::pluginParams(e.compressor());
          comm::InprocOptions io;
          io.emulation = experiments::emulationConfig(e);
          io.network = std::move(network);  // simulated: SimGrid times the frames instead of the pacers
          transports = comm::makeInprocTransports(S + W, io);
          plan = psPlan(e, evaluator().params(), S);
          std::shared_ptr<Compressor> first_instance;
          const bool raw = rawPushes(e);
          for (int k = 0; k < S; ++k) {
            train::ServerOptions so = serverOptions(e, lr, points);
            // One instance per shard, as separate processes would have.
            std::shared_ptr<Compressor> instance = plugin->instantiate(params);
            if (!first_instance) first_instance = instance;
            if (!raw) so.compressor = instance;
            const auto [b, end] = plan.ranges[static_cast<std::size_t>(k)];
            std::vector<float> initial(flat.begin() + static_cast<std::ptrdiff_t>(b),
                                       flat.begin() + static_cast<std::ptrdiff_t>(end));
            shards.push_back(std::make_unique<train::ParamServerShard>(*transports[static_cast<std::size_t>(k)], plan,
                                                                       k, W, std::move(initial), so));
          }
          for (int w = 0; w < W; ++w) {
            train::ClientOptions co = clientOptions(e);
            if (!raw) co.compressor = plugin->instantiate(params);
            clients.push_back(std::make_unique<train::ParamServerClient>(*transports[static_cast<std::size_t>(S + w)],
                                                                         plan, w, W, co));
            ps_workers.push_back(std::make_unique<train::AsyncWorker>(*models[static_cast<std::size_t>(w)],
                                                                      *clients.back(), w, W, workerOptions(w)));
          }
          prov.plugins.push_back(
              {plugin->info(), first_instance->caps(DType::kF32), params, first_instance->resolvedParams()});
        },
        [&] {
          return std::to_string(S) + " parameter-server shards and " + std::to_string(W) +
                 " workers (clients, buffers, compressor instances) for " +
                 std::to_string(evaluator().numParameters()) + " parameters";
        });
  }

  train::Workload& evaluator() { return *models.back(); }
  const train::AsyncWorkerBase& worker(int w) const {
    if (hogwild) return *hog_workers[static_cast<std::size_t>(w)];
    return *ps_workers[static_cast<std::size_t>(w)];
  }
  void step(int w) {
    if (hogwild)
      hog_workers[static_cast<std::size_t>(w)]->step();
    else
      ps_workers[static_cast<std::size_t>(w)]->step();
  }
  // Shard k's range of `flat`.
  float* range(int k) { return flat.data() + plan.ranges[static_cast<std::size_t>(k)].first; }

  const Experiment& e;
  const int W;
  const bool hogwild;
  const int S;
  std::vector<std::unique_ptr<train::Workload>> models;
  std::vector<float> flat;  // the global model: evaluated at every record
  train::StepPlan steps;
  train::LrScheduleOptions lr;
  std::vector<int64_t> points;
  std::vector<std::unique_ptr<comm::Transport>> transports;
  train::PsPlan plan;
  std::vector<std::unique_ptr<train::ParamServerShard>> shards;
  std::vector<std::unique_ptr<train::ParamServerClient>> clients;
  std::vector<std::unique_ptr<train::AsyncWorker>> ps_workers;
  std::unique_ptr<train::HogwildParams> shared;
  std::vector<std::unique_ptr<train::HogwildWorker>> hog_workers;
};

// The ranks' bodies of one in-process run, and how the monitor sees them: in place.
class InprocAsyncRun final : public AsyncView {
 public:
  InprocAsyncRun(InprocAsyncJob& job, AsyncRecorder& recorder, bool simulated)
      : job_(job), recorder_(recorder), simulated_(simulated), state_(static_cast<std::size_t>(job.W)) {}

  // A failed rank (the World keeps the root cause and aborts the endpoints) wakes the monitor.
  void stop() {
    stop_.store(true);
    cv_.notify_all();
  }

  // Shards are ranks 0 .. S-1; they return once every worker left or was dropped after the timeout.
  void rank(int r) {
    if (r < job_.S)
      job_.shards[static_cast<std::size_t>(r)]->run();
    else
      worker(r - job_.S);
  }

  // On the calling thread while the ranks run.
  void monitor() { recorder_.recordPoints(*this, job_.points); }

  // The last record: after every worker finished and every shard stopped.
  void finish() { recorder_.recordFinal(*this); }

  std::optional<AsyncPoint> collect(int64_t point) override { return job_.hogwild ? crossed(point) : snapshots(point); }
  AsyncPoint collectFinal() override {
    const int64_t worker_steps = workerSteps();
    const double wall_s = since(start_);
    readParams();
    return {worker_steps / job_.W, worker_steps, wall_s};
  }
  std::span<const float> params() const override { return job_.flat; }
  std::pair<double, int64_t> losses(int w, int64_t from, int64_t to) override {
    return job_.worker(w).losses().sum(from, to);
  }

 private:
  void worker(int w) {
    WorkerState& st = state_[static_cast<std::size_t>(w)];
    int64_t left = -1;
    try {
      left = runAsyncWorker(
          job_.worker(w), experiments::workerSettings(job_.e, w).fail_after_steps(),
          [&] {
            job_.step(w);
            {
              std::lock_guard lock(mutex_);
              st.times = job_.worker(w).totals();
              if (!job_.hogwild) st.payload_bytes = job_.clients[static_cast<std::size_t>(w)]->payloadBytes();
              st.steps.fetch_add(1);
            }
            cv_.notify_all();
          },
          [&] { return stop_.load(); });
      if (left < 0 && !job_.hogwild && !stop_.load()) job_.ps_workers[static_cast<std::size_t>(w)]->leave();
    } catch (...) {
      std::lock_guard lock(mutex_);
      st.done = true;
      throw;  // to the World, which aborts every endpoint (and so wakes the monitor)
    }
    std::lock_guard lock(mutex_);
    if (left >= 0) {
      st.left_step = left;
      st.left_s = since(start_);
    }
    st.done = true;
    cv_.notify_all();
  }

  int64_t workerSteps() const {
    int64_t n = 0;
    for (const auto& st : state_) n += st.steps.load();
    return n;
  }
  bool allDone() {
    std::lock_guard lock(mutex_);
    return std::all_of(state_.begin(), state_.end(), [](const WorkerState& s) { return s.done; });
  }
  // Every shard's current parameters (each under its shard's lock: pushes in flight may land on one shard and not yet
  // on another, as any reader of a parameter server sees), or HOGWILD's shared vector.
  void readParams() {
    if (job_.hogwild) {
      job_.shared->read(job_.flat);
      return;
    }
    for (int k = 0; k < job_.S; ++k) {
      const auto part = job_.shards[static_cast<std::size_t>(k)]->params();
      std::copy(part.begin(), part.end(), job_.range(k));
    }
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
        wt.payload_bytes = st.payload_bytes;
        wt.left_step = st.left_step;
        wt.left_s = st.left_s;
        if (!job_.hogwild) {
          const auto traffic = job_.transports[static_cast<std::size_t>(job_.S + w)]->traffic();
          wt.bytes_out = traffic.sent.total().bytes;
          wt.bytes_in = traffic.received.total().bytes;
        }
      }
    }
    for (int k = 0; k < job_.S; ++k)
      t.shards.push_back(shardTally(job_.shards[static_cast<std::size_t>(k)]->stats(), start_));
    if (job_.hogwild) t.hogwild_staleness = job_.shared->staleness();
    return t;
  }

  // No server to hold a consistent copy: reads the shared vector once progress crossed the point.
  std::optional<AsyncPoint> crossed(int64_t point) {
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
        readParams();
        return AsyncPoint{done, worker_steps, wall_s};
      }
      recorder_.waiting(done);
    }
  }

  // Each shard copied its range when the point was reached (ServerOptions::snapshot_steps); a point the workers never
  // reach (one stopped early) has no snapshot once every worker is done, or once its shard stopped. Real time looks up
  // every 100 ms for the progress line; a simulation waits for the snapshot or the shard's end (a timed poll would
  // advance the simulated clock forever once the others are done).
  std::optional<AsyncPoint> snapshots(int64_t point) {
    const std::chrono::milliseconds look =
        simulated_ ? std::chrono::milliseconds::max() : std::chrono::milliseconds(100);
    Clock::time_point taken{};
    for (int k = 0; k < job_.S; ++k) {
      for (;;) {
        if (stop_.load()) return std::nullopt;
        // Before the wait: a snapshot is taken before its worker is done, and before its shard returns.
        const bool finished = allDone() || job_.shards[static_cast<std::size_t>(k)]->finished();
        auto snap = job_.shards[static_cast<std::size_t>(k)]->takeSnapshot(static_cast<uint64_t>(point), look);
        if (snap) {
          std::copy(snap->params.begin(), snap->params.end(), job_.range(k));
          taken = std::max(taken, snap->taken);
          break;
        }
        if (finished) return std::nullopt;
        recorder_.waiting(workerSteps() / job_.W);
      }
    }
    if (stop_.load()) return std::nullopt;
    return AsyncPoint{point, workerSteps(), std::chrono::duration<double>(taken - start_).count()};
  }

  InprocAsyncJob& job_;
  AsyncRecorder& recorder_;
  const bool simulated_;
  std::vector<WorkerState> state_;
  rt::Mutex mutex_;
  rt::CondVar cv_;
  std::atomic<bool> stop_{false};
  const Clock::time_point start_ = rt::now();
};

}  // namespace

void Runner::runInprocAsync(const Experiment& e, results::ResultWriter& writer, RunSummary& summary,
                            std::shared_ptr<comm::FrameNetwork> network) {
  TERSE_CHECK(e.transport() == Experiment::INPROC, InvalidArgument,
              "runInprocAsync serves transport INPROC, got " << Experiment::Transport_Name(e.transport()));
  const bool simulated = network != nullptr;
  const auto start_time = results::isoTimeUtc();
  TERSE_CHECK(!(e.mode() == Experiment::HOGWILD && simulated), InvalidArgument,
              "mode HOGWILD has no simulated form (async_runner.cc)");
  InprocAsyncJob job(e, dataFor(e));
  const int S = job.S;
  const int W = job.W;
  results::Provenance prov = baseProvenance(e, "inproc", job.hogwild ? W : S + W, start_time, options_.terse_version,
                                            experiments::emulationConfig(e).enabled());
  prov.mode = asyncModeName(e.mode());
  if (simulated) noteSimulation(prov, e, *sim_compute_, sim_notes_);
  // The ranks: shards 0 .. S-1, then workers, as actors of the simulation (each worker at its straggler factor) or
  // threads. The World aborts every endpoint when one fails or a plugin call overruns (the process then ends,
  // detail::PluginWatch).
  auto label = [S](int r) {
    return r < S ? "server shard " + std::to_string(r) + " (rank " + std::to_string(r) + ")"
                 : "worker " + std::to_string(r - S) + " (rank " + std::to_string(r) + ")";
  };
  std::unique_ptr<ThreadWorld> ranks;
  if (simulated) {
    std::vector<double> slowdowns(static_cast<std::size_t>(S), 1.0);
    for (int w = 0; w < W; ++w) slowdowns.push_back(experiments::workerSettings(e, w).slowdown());
    ranks = std::make_unique<SimulatedWorld>(std::move(slowdowns), label);
  } else {
    ranks = std::make_unique<ThreadWorld>(S + W, label);
  }
  ranks->onAbort([&job](const std::string& reason) {
    for (auto& t : job.transports) t->abort(reason);
  });
  job.build(*options_.loader, std::move(network), *ranks, prov);
  writer.writeProvenance(prov);

  Progress progress(options_.progress, options_.progress_out ? *options_.progress_out : std::cerr, e.variant(),
                    e.epochs(), job.steps.total_steps, job.steps.steps_per_epoch);
  AsyncRecorder recorder(e, job.steps, job.lr, job.evaluator(), *ranks, {writer, summary, progress});
  InprocAsyncRun run(job, recorder, simulated);
  ranks->onAbort([&run](const std::string&) { run.stop(); });
  try {
    ranks->run([&](int r) { run.rank(r); }, [&] { run.monitor(); });
  } catch (...) {
    progress.finish();
    throw;
  }
  run.finish();
  progress.finish();
}

}  // namespace terse::runner
