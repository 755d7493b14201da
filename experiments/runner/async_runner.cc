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
using experiments::ParameterServer;

// What a worker thread publishes; guarded by Monitor::mutex except `steps`.
struct WorkerState {
  std::atomic<int64_t> steps{0};
  train::StepTimes times;
  uint64_t payload_bytes = 0;
  bool done = false;       // the thread returned (finished, failed on purpose, or failed)
  int64_t left_step = -1;  // fail_after_steps: when it stopped
  double left_s = 0;
};

struct Monitor {
  rt::Mutex mutex;
  rt::CondVar cv;
  std::atomic<bool> stop{false};  // a rank failed (the World keeps the root cause and aborts the endpoints)
};

}  // namespace

using namespace detail;

void Runner::runInprocAsync(const Experiment& e, results::ResultWriter& writer, RunSummary& summary,
                            std::shared_ptr<comm::FrameNetwork> network) {
  TERSE_CHECK(e.transport() == Experiment::INPROC, InvalidArgument,
              "runInprocAsync serves transport INPROC, got " << Experiment::Transport_Name(e.transport()));
  const bool simulated = network != nullptr;
  {
    const auto start_time = results::isoTimeUtc();
    const int W = e.workers();
    const bool hogwild = e.mode() == Experiment::HOGWILD;
    TERSE_CHECK(!(hogwild && simulated), InvalidArgument, "mode HOGWILD has no simulated form (async_runner.cc)");
    const int S = hogwild ? 0 : e.parameter_server().servers();

    // ---- Setup: W worker replicas and one evaluation replica, all from the same init seed.
    auto data = dataFor(e);
    const workloads::WorkloadOptions wo = workloadOptions(e);
    std::vector<std::unique_ptr<train::Workload>> models;
    allocating(
        [&] {
          for (int i = 0; i <= W; ++i) models.push_back(workloads::makeWorkload(e.workload().name(), wo, data));
        },
        [&] { return replicasWhat(e, W + 1, models); });
    train::Workload& evaluator = *models.back();
    const uint64_t init_checksum = train::parameterChecksum(evaluator.params());
    for (int w = 0; w < W; ++w)
      TERSE_CHECK(train::parameterChecksum(models[static_cast<std::size_t>(w)]->params()) == init_checksum,
                  InternalError, "replica " << w << " of workload '" << e.workload().name() << "' starts differently");
    std::vector<float> flat(evaluator.numParameters());
    train::copyValuesOut(evaluator.params(), flat);

    const train::SyncTrainerOptions sync_like = trainerOptions(e);
    const train::StepPlan steps = asyncStepPlan(e, evaluator.numTrainExamples());
    const train::LrScheduleOptions lr = asyncLrSchedule(e, steps);
    const std::vector<int64_t> points = evalPoints(e, steps);
    const int64_t total = steps.total_steps;
    const int64_t per_epoch = steps.steps_per_epoch;

    results::Provenance prov = baseProvenance(e, "inproc", hogwild ? W : S + W, start_time, options_.terse_version,
                                              experiments::emulationConfig(e).enabled());
    prov.mode = asyncModeName(e.mode());
    if (simulated) noteSimulation(prov, e, *sim_compute_, sim_notes_);
    std::vector<std::unique_ptr<comm::Transport>> transports;
    // The ranks: shards 0 .. S-1, then workers, as actors of the simulation (each worker at its straggler factor) or
    // threads. The World aborts every endpoint when one fails or a plugin call overruns (the process then ends,
    // detail::PluginWatch); the transports exist before the first plugin call.
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
    Monitor mon;
    ranks->onAbort([&mon](const std::string&) {
      mon.stop.store(true);
      mon.cv.notify_all();
    });
    ranks->onAbort([&transports](const std::string& reason) {
      for (auto& t : transports) t->abort(reason);
    });
    auto workerOptions = [&](int w) {
      train::AsyncTrainerOptions o = asyncWorkerOptions(e, w);
      o.slowdown = ranks->trainerSlowdown(o.slowdown);
      return o;
    };
    train::PsPlan plan;
    std::vector<std::unique_ptr<train::ParamServerShard>> shards;
    std::vector<std::unique_ptr<train::ParamServerClient>> clients;
    std::vector<std::unique_ptr<train::AsyncWorker>> ps_workers;
    std::unique_ptr<train::HogwildParams> shared;
    std::vector<std::unique_ptr<train::HogwildWorker>> hog_workers;
    // The shards, clients and workers: per rank, each with its share of the parameters and its buffers.
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
          } else {
            auto plugin = options_.loader->loadCompressor(e.compressor().name());
            const Params params = experiments::pluginParams(e.compressor());
            comm::InprocOptions io;
            io.emulation = experiments::emulationConfig(e);
            io.network = network;  // simulated: SimGrid times the frames instead of the pacers
            transports = comm::makeInprocTransports(S + W, io);
            plan = psPlan(e, evaluator.params(), S);
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
          }
        },
        [&] {
          return std::to_string(S) + " parameter-server shards and " + std::to_string(W) +
                 " workers (clients, buffers, "
                 "compressor instances) for " +
                 std::to_string(evaluator.numParameters()) + " parameters";
        });
    writer.writeProvenance(prov);

    // ---- The run.
    std::vector<WorkerState> state(static_cast<std::size_t>(W));
    Progress progress(options_.progress, options_.progress_out ? *options_.progress_out : std::cerr, e.variant(),
                      e.epochs(), total, per_epoch);
    const auto run_start = rt::now();
    // The progress line's rate and ETA are for the person waiting: host time, also when the records' times are
    // simulated.
    const auto host_start = std::chrono::steady_clock::now();
    auto hostSince = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start).count();
    };

    auto workerLoop = [&](int w) {
      WorkerState& st = state[static_cast<std::size_t>(w)];
      const int64_t fail_after = experiments::workerSettings(e, w).fail_after_steps();
      try {
        for (;;) {
          const bool finished = hogwild ? hog_workers[static_cast<std::size_t>(w)]->finished()
                                        : ps_workers[static_cast<std::size_t>(w)]->finished();
          if (finished || mon.stop.load()) break;
          if (fail_after > 0 && st.steps.load() >= fail_after) {
            // Stops dead: no goodbye, the endpoint stays silent.
            std::lock_guard lock(mon.mutex);
            st.left_step = st.steps.load();
            st.left_s = since(run_start);
            st.done = true;
            mon.cv.notify_all();
            return;
          }
          if (hogwild)
            hog_workers[static_cast<std::size_t>(w)]->step();
          else
            ps_workers[static_cast<std::size_t>(w)]->step();
          {
            std::lock_guard lock(mon.mutex);
            st.times = hogwild ? hog_workers[static_cast<std::size_t>(w)]->totals()
                               : ps_workers[static_cast<std::size_t>(w)]->totals();
            if (!hogwild) st.payload_bytes = clients[static_cast<std::size_t>(w)]->payloadBytes();
            st.steps.fetch_add(1);
          }
          mon.cv.notify_all();
        }
        if (!hogwild && !mon.stop.load()) ps_workers[static_cast<std::size_t>(w)]->leave();
      } catch (...) {
        std::lock_guard lock(mon.mutex);
        st.done = true;
        throw;  // to the World, which aborts every endpoint (and so wakes the monitor)
      }
      std::lock_guard lock(mon.mutex);
      st.done = true;
      mon.cv.notify_all();
    };

    // Evaluates the global model and appends one record at global step `done`: `flat` already holds the parameters
    // when params_ready (shard snapshots taken at that step), otherwise they are read now.
    int64_t last_done = 0;
    auto record = [&](int64_t done, int64_t worker_steps, bool params_ready, double wall_s) {
      if (!params_ready && hogwild) {
        shared->read(flat);
      } else if (!params_ready) {
        for (int k = 0; k < S; ++k) {
          const auto part = shards[static_cast<std::size_t>(k)]->params();
          std::copy(part.begin(), part.end(),
                    flat.begin() + static_cast<std::ptrdiff_t>(plan.ranges[static_cast<std::size_t>(k)].first));
        }
      }
      train::copyValuesIn(evaluator.params(), flat);
      // Evaluation is outside the training time a simulated cluster models.
      train::EvalResult ev;
      ranks->aside([&] { ev = evaluator.evaluate(0); });
      std::vector<WorkerTally> tally(static_cast<std::size_t>(W));
      {
        std::lock_guard lock(mon.mutex);
        for (int w = 0; w < W; ++w) {
          const WorkerState& st = state[static_cast<std::size_t>(w)];
          WorkerTally& t = tally[static_cast<std::size_t>(w)];
          t.steps = st.steps.load();
          t.times = st.times;
          t.payload_bytes = st.payload_bytes;
          t.left_step = st.left_step;
          t.left_s = st.left_s;
          if (!hogwild) {
            const auto traffic = transports[static_cast<std::size_t>(S + w)]->traffic();
            t.bytes_out = traffic.sent.total().bytes;
            t.bytes_in = traffic.received.total().bytes;
          }
        }
      }
      std::vector<ShardTally> shard_tally;
      for (int k = 0; k < S; ++k) {
        const train::ServerStats st = shards[static_cast<std::size_t>(k)]->stats();
        ShardTally t;
        t.staleness = st.staleness;
        for (int w = 0; w < W; ++w) {
          t.bytes_in += st.bytes_in[static_cast<std::size_t>(w)];
          t.bytes_out += st.bytes_out[static_cast<std::size_t>(w)];
          t.dropped_s.push_back(
              st.dead[static_cast<std::size_t>(w)]
                  ? std::chrono::duration<double>(st.dead_at[static_cast<std::size_t>(w)] - run_start).count()
                  : -1.0);
        }
        shard_tally.push_back(std::move(t));
      }
      // train_loss: worker 0's mean batch loss over steps [last_done, done), as sync's is rank 0's (so s = 0
      // matches); every worker's over those steps when worker 0 ran none of them (it stopped or lags far behind).
      auto [loss, losses] =
          hogwild ? hog_workers[0]->losses().sum(last_done, done) : ps_workers[0]->losses().sum(last_done, done);
      if (losses == 0) {
        for (int v = 1; v < W; ++v) {
          const auto [l, n] = hogwild ? hog_workers[static_cast<std::size_t>(v)]->losses().sum(last_done, done)
                                      : ps_workers[static_cast<std::size_t>(v)]->losses().sum(last_done, done);
          loss += l;
          losses += n;
        }
      }
      results::MetricsRecord m =
          evalRecord(done, per_epoch, ev, loss, losses, train::learningRate(lr, std::max<int64_t>(0, done - 1)));
      last_done = done;
      m.wall_s = wall_s;
      fillAsyncRecord(m, worker_steps, tally, shard_tally,
                      hogwild ? shared->staleness() : std::map<uint64_t, uint64_t>{});
      writer.append(m);
      detail::noteRecord(summary, m, ev, writer.records());
      progress.update(done, ev.accuracy, m.wire_bytes_per_worker, hostSince(), true);
    };

    auto workerSteps = [&] {
      int64_t n = 0;
      for (const auto& st : state) n += st.steps.load();
      return n;
    };
    auto allDone = [&] {
      std::lock_guard lock(mon.mutex);
      return std::all_of(state.begin(), state.end(), [](const WorkerState& s) { return s.done; });
    };
    // The monitor, on this thread while the ranks run.
    auto monitor = [&] {
      if (hogwild) {
        // No server to hold a consistent copy: the monitor reads the shared vector when progress crosses a point.
        std::size_t next = 0;  // into points
        while (next < points.size()) {
          {
            std::unique_lock lock(mon.mutex);
            mon.cv.waitFor(lock, std::chrono::milliseconds(100), [&] {
              int64_t n = 0;
              bool done = true;
              for (const auto& st : state) {
                n += st.steps.load();
                done = done && st.done;
              }
              return mon.stop.load() || done || n / W >= points[next];
            });
          }
          if (mon.stop.load() || allDone()) break;
          const int64_t worker_steps = workerSteps();
          const int64_t done = worker_steps / W;
          if (done >= points[next]) {
            record(done, worker_steps, false, since(run_start));
            while (next < points.size() && points[next] <= done) ++next;
          } else {
            progress.update(done, summary.records > 0 ? summary.final_accuracy : -1, 0, hostSince(), false);
          }
        }
      } else {
        // Each shard copied its range when the point was reached (ServerOptions::snapshot_steps); a point the workers
        // never reach (one stopped early) has no snapshot once every worker is done, or once its shard stopped. Real
        // time looks up every 100 ms for the progress line; a simulation waits for the snapshot or the shard's end.
        const std::chrono::milliseconds look =
            simulated ? std::chrono::milliseconds::max() : std::chrono::milliseconds(100);
        for (const int64_t point : points) {
          bool complete = true;
          Clock::time_point taken{};
          for (int k = 0; k < S && complete; ++k) {
            for (;;) {
              if (mon.stop.load()) break;
              // Before the wait: a snapshot is taken before its worker is done, and before its shard returns.
              const bool finished = allDone() || shards[static_cast<std::size_t>(k)]->finished();
              auto snap = shards[static_cast<std::size_t>(k)]->takeSnapshot(static_cast<uint64_t>(point), look);
              if (snap) {
                std::copy(snap->params.begin(), snap->params.end(),
                          flat.begin() + static_cast<std::ptrdiff_t>(plan.ranges[static_cast<std::size_t>(k)].first));
                taken = std::max(taken, snap->taken);
                break;
              }
              if (finished) {
                complete = false;
                break;
              }
              progress.update(workerSteps() / W, summary.records > 0 ? summary.final_accuracy : -1,
                              summary.wire_bytes_per_worker, hostSince(), false);
            }
            if (mon.stop.load()) complete = false;
          }
          if (!complete) break;
          record(point, workerSteps(), true, std::chrono::duration<double>(taken - run_start).count());
        }
      }
    };
    // Each on its rank's host in a simulation (shards are ranks 0 .. S-1). The shards return once every worker left or
    // was dropped after the timeout.
    try {
      ranks->run(
          [&](int r) {
            if (r < S) {
              shards[static_cast<std::size_t>(r)]->run();
            } else {
              workerLoop(r - S);
            }
          },
          monitor);
    } catch (...) {
      progress.finish();
      throw;
    }
    const int64_t worker_steps = workerSteps();
    record(worker_steps / W, worker_steps, false, since(run_start));
    progress.finish();
  }
}

}  // namespace terse::runner
