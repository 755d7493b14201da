// Modes ASYNC, SSP and HOGWILD on the inproc transport (runner.h; core/train/param_server.h, async_trainer.h).
//
// Threads: one per server shard (ranks 0 .. S-1 of the inproc job, serving until every worker left or was dropped),
// one per worker (ranks S .. S+W-1: pull, compute, push), and the calling thread as the monitor, which evaluates the
// global model. There is no common step in async training, so the records' `step` is the workers' progress in
// global-batch units: completed worker steps / W, the step a sync run would be at after the same number of gradients.
// An evaluation point is due when that crosses one of the sync schedule's points (every_steps, epoch ends, the last
// step); the monitor then reads the shards' current parameters (each under its shard's lock: pushes in flight may land
// on one shard and not yet on another, as any reader of a parameter server sees) into a separate evaluation replica.
// Training does not pause for it. The last record is taken after every worker finished and every shard stopped.
//
// Elastic workers: worker_settings[].fail_after_steps stops a worker dead (no goodbye; its endpoint stays silent as a
// crashed process's would); the shards drop it after parameter_server.worker_timeout and the others go on. Any other
// failure -- a refused push, a shard that failed, a transport error -- aborts every endpoint and fails the run with
// the first cause, naming the shard or worker.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "core/plugin/loader.h"
#include "core/train/async_trainer.h"
#include "core/train/param_server.h"
#include "experiments/runner/progress.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/workloads/workloads.h"
#include "results/result_writer.h"

namespace terse::runner {
namespace {

using Clock = std::chrono::steady_clock;
using experiments::Experiment;
using experiments::ParameterServer;

// Staleness buckets written per record; larger tau go to the overflow count.
constexpr uint64_t kHistogramBuckets = 64;

std::string modeName(Experiment::Mode m) {
  switch (m) {
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

DType pullDtype(ParameterServer::PullDtype d) {
  switch (d) {
    case ParameterServer::F16:
      return DType::kF16;
    case ParameterServer::BF16:
      return DType::kBF16;
    default:
      return DType::kF32;
  }
}

bool isCommError(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const comm::CommError&) {
    return true;
  } catch (...) {
    return false;
  }
}

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
  std::mutex mutex;
  std::condition_variable cv;
  std::exception_ptr error;  // the root cause: a CommError is replaced by the error that caused it
  std::string error_where;
  std::atomic<bool> stop{false};
};

void addStaleness(std::map<uint64_t, uint64_t>& into, const std::map<uint64_t, uint64_t>& from) {
  for (const auto& [tau, n] : from) into[tau] += n;
}

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
}

}  // namespace

using namespace detail;

RunSummary Runner::runAsync(const Experiment& e) {
  TERSE_CHECK(e.transport() == Experiment::INPROC, InvalidArgument,
              "mode " << Experiment::Mode_Name(e.mode()) << " runs on transport INPROC only in this version; "
                      << "transport " << Experiment::Transport_Name(e.transport()) << " serves mode SYNC");
  const std::filesystem::path root = options_.output_root.value_or(std::filesystem::path(e.output_dir()));
  results::ResultWriter writer(root, e.study(), e.variant());
  RunSummary summary;
  summary.study = e.study();
  summary.variant = e.variant();
  summary.dir = writer.dir();
  try {
    writer.writeConfig(experiments::toText(e));
    const auto start_time = results::isoTimeUtc();
    const int W = e.workers();
    const bool hogwild = e.mode() == Experiment::HOGWILD;
    const int S = hogwild ? 0 : e.parameter_server().servers();

    // ---- Setup: W worker replicas and one evaluation replica, all from the same init seed.
    auto data = dataFor(e);
    const workloads::WorkloadOptions wo = workloadOptions(e);
    std::vector<std::unique_ptr<train::Workload>> models;
    for (int i = 0; i <= W; ++i) models.push_back(workloads::makeWorkload(e.workload().name(), wo, data));
    train::Workload& evaluator = *models.back();
    const uint64_t init_checksum = train::parameterChecksum(evaluator.params());
    for (int w = 0; w < W; ++w)
      TERSE_CHECK(train::parameterChecksum(models[static_cast<std::size_t>(w)]->params()) == init_checksum,
                  InternalError, "replica " << w << " of workload '" << e.workload().name() << "' starts differently");
    std::vector<uint64_t> numel;
    uint64_t total_numel = 0;
    for (const auto& p : evaluator.params()) {
      numel.push_back(p.numel());
      total_numel += p.numel();
    }
    std::vector<float> flat(static_cast<std::size_t>(total_numel));
    train::copyValuesOut(evaluator.params(), flat);

    const train::SyncTrainerOptions sync_like = trainerOptions(e);
    const train::StepPlan steps =
        train::planSteps(evaluator.numTrainExamples(), W, sync_like.batch_size, sync_like.epochs, false);
    train::LrScheduleOptions lr = sync_like.lr;
    lr.world_size = W;
    lr.steps_per_epoch = steps.steps_per_epoch;
    lr.total_steps = steps.total_steps;
    if (sync_like.warmup_epochs > 0)
      lr.warmup_steps = std::llround(sync_like.warmup_epochs * static_cast<double>(steps.steps_per_epoch));
    train::validateLrSchedule(lr);
    // Evaluation points: the sync schedule's (every_steps, epoch ends) in global steps; the last is taken at the end.
    const int64_t total = steps.total_steps;
    const int64_t per_epoch = steps.steps_per_epoch;
    const int64_t every = e.eval().every_steps();
    const bool per_epoch_eval = e.eval().per_epoch();
    auto nextEvalPoint = [&](int64_t after) {
      for (int64_t s = after + 1; s < total; ++s)
        if ((every > 0 && s % every == 0) || (per_epoch_eval && s % per_epoch == 0)) return s;
      return total;
    };
    std::vector<int64_t> points;
    for (int64_t p = nextEvalPoint(0); p < total; p = nextEvalPoint(p)) points.push_back(p);
    auto workerOptions = [&](int w) {
      train::AsyncTrainerOptions o;
      o.batch_size = sync_like.batch_size;
      o.epochs = sync_like.epochs;
      o.seed = e.seed();
      o.slowdown = experiments::workerSettings(e, w).slowdown();
      return o;
    };

    results::Provenance prov = baseProvenance(e, "inproc", hogwild ? W : S + W, start_time, options_.terse_version,
                                              experiments::emulationConfig(e).enabled());
    prov.mode = modeName(e.mode());

    std::vector<std::unique_ptr<comm::Transport>> transports;
    train::PsPlan plan;
    std::vector<std::unique_ptr<train::ParamServerShard>> shards;
    std::vector<std::unique_ptr<train::ParamServerClient>> clients;
    std::vector<std::unique_ptr<train::AsyncWorker>> ps_workers;
    std::unique_ptr<train::HogwildParams> shared;
    std::vector<std::unique_ptr<train::HogwildWorker>> hog_workers;
    if (hogwild) {
      TERSE_CHECK(sync_like.sgd.momentum == 0, InvalidArgument,
                  "mode HOGWILD applies plain SGD (shared lock-free parameters have no agreed momentum buffer): "
                  "optimizer.momentum must be 0, got "
                      << sync_like.sgd.momentum);
      shared = std::make_unique<train::HogwildParams>(flat, W, lr, sync_like.sgd.weight_decay);
      for (int w = 0; w < W; ++w)
        hog_workers.push_back(std::make_unique<train::HogwildWorker>(*models[static_cast<std::size_t>(w)], *shared, w,
                                                                     W, workerOptions(w)));
    } else {
      auto plugin = options_.loader->loadCompressor(e.compressor().name());
      const Params params = experiments::pluginParams(e.compressor());
      const CodecOptions codec_options = experiments::codecOptions(e);
      comm::InprocOptions io;
      io.emulation = experiments::emulationConfig(e);
      transports = comm::makeInprocTransports(S + W, io);
      plan = train::planShards(numel, S);
      const auto timeout =
          std::chrono::milliseconds(std::llround(comm::parseDuration(e.parameter_server().worker_timeout()) * 1000.0));
      std::shared_ptr<Compressor> first_instance;
      // A plain-f32 run ("none") pushes raw values: no codec on either side.
      const bool raw =
          e.compressor().name() == "none" && !codec_options.error_feedback && codec_options.momentum_correction == 0;
      for (int k = 0; k < S; ++k) {
        train::ServerOptions so;
        so.lr = lr.lr;
        so.lr_schedule = [lr](uint64_t t) { return train::learningRate(lr, static_cast<int64_t>(t)); };
        so.sgd = sync_like.sgd;
        so.staleness_aware_lr = e.parameter_server().staleness_aware_lr();
        so.staleness_bound =
            e.mode() == Experiment::SSP ? static_cast<uint64_t>(e.staleness_bound()) : train::kNoStalenessBound;
        so.worker_timeout = timeout;
        so.run_seed = e.seed();
        so.snapshot_steps.assign(points.begin(), points.end());
        // One instance per shard, as separate processes would have.
        std::shared_ptr<Compressor> instance = plugin->instantiate(params);
        if (!first_instance) first_instance = instance;
        if (!raw) so.compressor = instance;
        const auto [b, end] = plan.ranges[static_cast<std::size_t>(k)];
        std::vector<float> initial(flat.begin() + static_cast<std::ptrdiff_t>(b),
                                   flat.begin() + static_cast<std::ptrdiff_t>(end));
        shards.push_back(std::make_unique<train::ParamServerShard>(*transports[static_cast<std::size_t>(k)], plan, k, W,
                                                                   std::move(initial), so));
      }
      for (int w = 0; w < W; ++w) {
        train::ClientOptions co;
        if (!raw) co.compressor = plugin->instantiate(params);
        co.codec = codec_options;
        co.run_seed = e.seed();
        co.pull_dtype = pullDtype(e.parameter_server().pull_dtype());
        // Pings must reach an idle shard well within its timeout.
        co.heartbeat = std::min(std::chrono::milliseconds(200), timeout / 4);
        clients.push_back(
            std::make_unique<train::ParamServerClient>(*transports[static_cast<std::size_t>(S + w)], plan, w, W, co));
        ps_workers.push_back(std::make_unique<train::AsyncWorker>(*models[static_cast<std::size_t>(w)], *clients.back(),
                                                                  w, W, workerOptions(w)));
      }
      prov.plugins.push_back({plugin->info(), first_instance->caps(DType::kF32), params});
    }
    writer.writeProvenance(prov);

    // ---- The run.

    Monitor mon;
    std::vector<WorkerState> state(static_cast<std::size_t>(W));
    Progress progress(options_.progress, options_.progress_out ? *options_.progress_out : std::cerr, e.variant(),
                      e.epochs(), total, per_epoch);
    const auto run_start = Clock::now();

    auto fail = [&](const std::string& where, std::exception_ptr err) {
      {
        std::lock_guard lock(mon.mutex);
        if (!mon.error || (isCommError(mon.error) && !isCommError(err))) {
          mon.error = err;
          mon.error_where = where;
        }
      }
      mon.stop.store(true);
      for (auto& t : transports) t->abort(where + " failed: " + shortWhat(err));
      mon.cv.notify_all();
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
        fail("worker " + std::to_string(w) + " (rank " + std::to_string(S + w) + ")", std::current_exception());
      }
      std::lock_guard lock(mon.mutex);
      st.done = true;
      mon.cv.notify_all();
    };

    std::vector<std::thread> shard_threads, worker_threads;
    for (int k = 0; k < S; ++k)
      shard_threads.emplace_back([&, k] {
        try {
          shards[static_cast<std::size_t>(k)]->run();
        } catch (...) {
          fail("server shard " + std::to_string(k) + " (rank " + std::to_string(k) + ")", std::current_exception());
        }
      });
    for (int w = 0; w < W; ++w) worker_threads.emplace_back(workerLoop, w);

    // Evaluates the global model and appends one record at global step `done`: `flat` already holds the parameters
    // when params_ready (shard snapshots taken at that step), otherwise they are read now.
    std::vector<double> dropped_s(static_cast<std::size_t>(W), -1);
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
      const train::EvalResult ev = evaluator.evaluate(0);
      train::StepTimes sum;
      uint64_t payload = 0;
      std::vector<int64_t> left_step(static_cast<std::size_t>(W));
      std::vector<double> left_s(static_cast<std::size_t>(W));
      {
        std::lock_guard lock(mon.mutex);
        for (int w = 0; w < W; ++w) {
          const WorkerState& st = state[static_cast<std::size_t>(w)];
          sum.compute_s += st.times.compute_s;
          sum.compress_s += st.times.compress_s;
          sum.comm_s += st.times.comm_s;
          sum.exposed_comm_s += st.times.exposed_comm_s;
          sum.step_s += st.times.step_s;
          payload += st.payload_bytes;
          left_step[static_cast<std::size_t>(w)] = st.left_step;
          left_s[static_cast<std::size_t>(w)] = st.left_s;
        }
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
      const double n = static_cast<double>(std::max<int64_t>(1, worker_steps));
      m.wall_s = wall_s;
      m.compute_s_per_step = sum.compute_s / n;
      m.compress_s_per_step = sum.compress_s / n;
      m.comm_s_per_step = sum.comm_s / n;
      m.exposed_comm_s_per_step = sum.exposed_comm_s / n;
      m.step_s_per_step = sum.step_s / n;
      m.payload_bytes_per_worker = payload / static_cast<uint64_t>(W);
      std::map<uint64_t, uint64_t> hist;
      int live = W;
      if (hogwild) {
        hist = shared->staleness();
        for (int w = 0; w < W; ++w) live -= left_step[static_cast<std::size_t>(w)] >= 0 ? 1 : 0;
      } else {
        uint64_t sent = 0;
        std::vector<uint64_t> in(static_cast<std::size_t>(S)), out(static_cast<std::size_t>(S));
        std::vector<bool> dead(static_cast<std::size_t>(W), false);
        std::vector<Clock::time_point> dead_at(static_cast<std::size_t>(W), Clock::time_point::max());
        for (int k = 0; k < S; ++k) {
          const train::ServerStats st = shards[static_cast<std::size_t>(k)]->stats();
          addStaleness(hist, st.staleness);
          for (int w = 0; w < W; ++w) {
            in[static_cast<std::size_t>(k)] += st.bytes_in[static_cast<std::size_t>(w)];
            out[static_cast<std::size_t>(k)] += st.bytes_out[static_cast<std::size_t>(w)];
            if (st.dead[static_cast<std::size_t>(w)]) {
              dead[static_cast<std::size_t>(w)] = true;
              dead_at[static_cast<std::size_t>(w)] =
                  std::min(dead_at[static_cast<std::size_t>(w)], st.dead_at[static_cast<std::size_t>(w)]);
            }
          }
        }
        for (int k = 0; k < S; ++k) {
          m.extra.emplace_back("server" + std::to_string(k) + "_bytes_in", static_cast<double>(in[k]));
          m.extra.emplace_back("server" + std::to_string(k) + "_bytes_out", static_cast<double>(out[k]));
        }
        for (int w = 0; w < W; ++w) {
          const auto t = transports[static_cast<std::size_t>(S + w)]->traffic();
          sent += t.sent.total().bytes;
          m.extra.emplace_back("worker" + std::to_string(w) + "_bytes_out", static_cast<double>(t.sent.total().bytes));
          m.extra.emplace_back("worker" + std::to_string(w) + "_bytes_in",
                               static_cast<double>(t.received.total().bytes));
          if (dead[static_cast<std::size_t>(w)])  // the first shard to drop it
            dropped_s[static_cast<std::size_t>(w)] =
                std::chrono::duration<double>(dead_at[static_cast<std::size_t>(w)] - run_start).count();
          if (dead[static_cast<std::size_t>(w)] || left_step[static_cast<std::size_t>(w)] >= 0) --live;
        }
        m.wire_bytes_per_worker = sent / static_cast<uint64_t>(W);
      }
      stalenessFields(hist, m);
      m.extra.emplace_back("workers_live", static_cast<double>(live));
      for (int w = 0; w < W; ++w) {
        if (left_step[static_cast<std::size_t>(w)] < 0) continue;
        m.extra.emplace_back("worker" + std::to_string(w) + "_left_step",
                             static_cast<double>(left_step[static_cast<std::size_t>(w)]));
        m.extra.emplace_back("worker" + std::to_string(w) + "_left_s", left_s[static_cast<std::size_t>(w)]);
        if (dropped_s[static_cast<std::size_t>(w)] >= 0)
          m.extra.emplace_back("worker" + std::to_string(w) + "_dropped_s", dropped_s[static_cast<std::size_t>(w)]);
      }
      writer.append(m);
      summary.records = writer.records();
      summary.steps = done;
      summary.final_accuracy = ev.accuracy;
      summary.final_test_loss = ev.loss;
      summary.best_accuracy = std::max(summary.best_accuracy, ev.accuracy);
      summary.wire_bytes_per_worker = m.wire_bytes_per_worker;
      summary.payload_bytes_per_worker = m.payload_bytes_per_worker;
      summary.wall_s = m.wall_s;
      progress.update(done, ev.accuracy, m.wire_bytes_per_worker, m.wall_s, true);
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
    if (hogwild) {
      // No server to hold a consistent copy: the monitor reads the shared vector when progress crosses a point.
      int64_t next_point = nextEvalPoint(0);
      for (;;) {
        {
          std::unique_lock lock(mon.mutex);
          mon.cv.wait_for(lock, std::chrono::milliseconds(100), [&] {
            int64_t n = 0;
            bool done = true;
            for (const auto& st : state) {
              n += st.steps.load();
              done = done && st.done;
            }
            return mon.stop.load() || done || n / W >= next_point;
          });
        }
        if (mon.stop.load() || allDone()) break;
        const int64_t worker_steps = workerSteps();
        const int64_t done = worker_steps / W;
        if (done >= next_point && done < total) {
          record(done, worker_steps, false, since(run_start));
          next_point = nextEvalPoint(done);
        } else {
          progress.update(done, summary.records > 0 ? summary.final_accuracy : -1, 0, since(run_start), false);
        }
      }
    } else {
      // Each shard copied its range when the point was reached (ServerOptions::snapshot_steps); a point the workers
      // never reach (one stopped early) has no snapshot once every worker is done.
      for (const int64_t point : points) {
        bool complete = true;
        Clock::time_point taken{};
        for (int k = 0; k < S && complete; ++k) {
          for (;;) {
            if (mon.stop.load()) break;
            const bool finished = allDone();  // before the wait: a snapshot is taken before its worker is done
            auto snap = shards[static_cast<std::size_t>(k)]->takeSnapshot(static_cast<uint64_t>(point),
                                                                          std::chrono::milliseconds(100));
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
                            summary.wire_bytes_per_worker, since(run_start), false);
          }
          if (mon.stop.load()) complete = false;
        }
        if (!complete) break;
        record(point, workerSteps(), true, std::chrono::duration<double>(taken - run_start).count());
      }
    }
    for (auto& t : worker_threads) t.join();
    // The shards return once every worker left or was dropped after the timeout.
    for (auto& t : shard_threads) t.join();
    if (!mon.error) {
      const int64_t worker_steps = workerSteps();
      record(worker_steps / W, worker_steps, false, since(run_start));
    }
    progress.finish();
    if (mon.error) throw std::runtime_error(mon.error_where + ": " + shortWhat(mon.error));
    writer.markCompleted();
    return summary;
  } catch (const std::exception& x) {
    writer.markFailed(x.what());
    throw RunFailed("variant '" + e.variant() + "' of study '" + e.study() + "' failed (partial results in " +
                        writer.dir().string() + "): " + x.what(),
                    writer.dir());
  }
}

}  // namespace terse::runner
