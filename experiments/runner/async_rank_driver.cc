#include "experiments/runner/async_rank_driver.h"

#include <algorithm>

#include "experiments/runner/runner_detail.h"

namespace terse::runner::detail {

std::pair<double, int64_t> asyncTrainLoss(int workers, int64_t last, int64_t done, const WorkerLosses& losses) {
  auto [loss, count] = losses(0, last, done);
  if (count == 0) {
    for (int w = 1; w < workers; ++w) {
      const auto [l, n] = losses(w, last, done);
      loss += l;
      count += n;
    }
  }
  return {loss, count};
}

ShardTally shardTally(const train::ServerStats& stats, std::chrono::steady_clock::time_point start) {
  ShardTally t;
  t.staleness = stats.staleness;
  for (std::size_t w = 0; w < stats.dead.size(); ++w) {
    t.bytes_in += stats.bytes_in[w];
    t.bytes_out += stats.bytes_out[w];
    t.dropped_s.push_back(stats.dead[w] ? std::chrono::duration<double>(stats.dead_at[w] - start).count() : -1.0);
  }
  t.delta_pulls = stats.delta_pulls;
  t.pull_residual_sq = stats.pull_residual_sq;
  t.pull_params_sq = stats.pull_params_sq;
  return t;
}

int64_t runAsyncWorker(const train::AsyncWorkerBase& worker, int64_t fail_after, const std::function<void()>& step,
                       const std::function<bool()>& stop) {
  while (!worker.finished() && !stop()) {
    if (fail_after > 0 && worker.stepsDone() >= fail_after) return worker.stepsDone();
    step();
  }
  return -1;
}

AsyncRecorder::AsyncRecorder(const experiments::Experiment& e, const train::StepPlan& steps,
                             const train::LrScheduleOptions& lr, train::Workload& evaluator, const World& world,
                             AsyncReport report)
    : workers_(e.workers()),
      steps_(steps),
      lr_(lr),
      evaluator_(evaluator),
      world_(world),
      report_(report),
      host_start_(std::chrono::steady_clock::now()) {}

double AsyncRecorder::hostSeconds() const {
  return since(host_start_);
}

void AsyncRecorder::recordPoints(AsyncView& view, std::span<const int64_t> points) {
  std::size_t next = 0;
  while (next < points.size()) {
    const std::optional<AsyncPoint> at = view.collect(points[next]);
    if (!at) return;
    record(view, *at);
    while (next < points.size() && points[next] <= at->step) ++next;
  }
}

void AsyncRecorder::recordFinal(AsyncView& view) {
  record(view, view.collectFinal());
}

void AsyncRecorder::record(AsyncView& view, const AsyncPoint& at) {
  train::copyValuesIn(evaluator_.params(), view.params());
  train::EvalResult ev;
  world_.aside([&] { ev = evaluator_.evaluate(0); });
  const AsyncTallies t = view.tallies();
  const auto [loss, count] = asyncTrainLoss(workers_, last_done_, at.step,
                                            [&](int w, int64_t from, int64_t to) { return view.losses(w, from, to); });
  results::MetricsRecord m = evalRecord(at.step, steps_.steps_per_epoch, ev, loss, count,
                                        train::learningRate(lr_, std::max<int64_t>(0, at.step - 1)));
  last_done_ = at.step;
  m.wall_s = at.wall_s;
  fillAsyncRecord(m, at.worker_steps, t.workers, t.shards, t.hogwild_staleness);
  report_.writer.append(m);
  noteRecord(report_.summary, m, ev, report_.writer.records());
  report_.progress.update(at.step, ev.accuracy, m.wire_bytes_per_worker, hostSeconds(), true);
}

void AsyncRecorder::waiting(int64_t done) {
  const RunSummary& s = report_.summary;
  report_.progress.update(done, s.records > 0 ? s.final_accuracy : -1, s.wire_bytes_per_worker, hostSeconds(), false);
}

}  // namespace terse::runner::detail
