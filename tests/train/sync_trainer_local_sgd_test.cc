// Local SGD in the synchronous trainer (sync_trainer.h, "Local SGD"): periodic model averaging against a closed form
// and against a hand-run of the algorithm, the schedule of averagings, what travels, lossy averaging with error
// feedback, odd and empty tensors, a rank that fails between two averagings, the step trace, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/compress/make_codec.h"
#include "core/plugin/loader.h"
#include "core/train/local_sgd_schedule.h"
#include "core/train/step_trace.h"
#include "core/train/sync_trainer.h"
#include "experiments/workloads/workloads.h"

namespace terse::train::local_sgd_test {

PluginLoader loader() {
  return PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
}

PipelineFactory pipelinesOf(comm::Communicator& comm, std::shared_ptr<const Compressor> compressor,
                            const CodecOptions& codec = {}) {
  return [&comm, compressor, codec](const TensorInfo& info) {
    return std::make_unique<CompressionPipeline>(makeCodec(compressor, info, 7, codec), comm);
  };
}

std::unique_ptr<Scheduler> scheduler(const std::string& name = "fifo", const Params& params = {}) {
  return loader().loadScheduler(name)->instantiate(params);
}

// Rank r minimizes 0.5 ||x - c_r||^2 with c_r[i] = r + 0.25 i + t (t the tensor; r = 0 for every rank when `shared`):
// its gradient is x - c_r whatever the batch, so plain SGD's local steps have a closed form. Tensors of 37 x 3, 1 and
// 5 elements in three layers (odd sizes, one of a single element); the forward waits at every layer's gate.
// Rank `fail_rank` throws from its forwardBackward at step `fail_step`.
class Quadratic : public Workload {
 public:
  explicit Quadratic(int rank, int fail_rank = -1, int64_t fail_step = -1, bool shared = false)
      : rank_(shared ? 0 : rank), fail_(rank == fail_rank ? fail_step : -1) {
    addParam("a", {37, 3}, 0);
    addParam("one", {1}, 1);
    addParam("b", {5}, 2);
    for (auto& p : params())
      for (std::size_t i = 0; i < p.numel(); ++i) p.value[i] = 1.0f - 0.5f * static_cast<float>(i % 4);
  }
  std::string_view name() const override { return "quadratic"; }
  bool gatesLayers() const override { return true; }
  int64_t numTrainExamples() const override { return 96; }
  float target(std::size_t tensor, std::size_t i) const {
    return static_cast<float>(rank_) + 0.25f * static_cast<float>(i) + static_cast<float>(tensor);
  }
  double forwardBackward(std::span<const int64_t>, const LayerReadyFn& ready) override {
    if (steps_++ == fail_) throw std::runtime_error("rank " + std::to_string(rank_) + " lost its device");
    for (int l = 0; l < numLayers(); ++l) awaitLayer(l);
    double loss = 0;
    for (int l = numLayers() - 1; l >= 0; --l) {
      for (std::size_t t : layerTensors(l)) {
        ParamTensor& p = params()[t];
        for (std::size_t i = 0; i < p.numel(); ++i) {
          p.grad[i] = p.value[i] - target(t, i);
          loss += 0.5 * static_cast<double>(p.grad[i]) * p.grad[i];
        }
      }
      reportLayer(ready, l);
    }
    return loss;
  }
  EvalResult evaluate(int64_t) override { return {}; }

 private:
  int rank_;
  int64_t fail_;
  int64_t steps_ = 0;
};

// The ranks' mean target of element i of tensor t: where plain averaging of the quadratics' local steps converges.
double meanTarget(int world, std::size_t t, std::size_t i) {
  double sum = 0;
  for (int r = 0; r < world; ++r) sum += Quadratic(r).target(t, i);
  return sum / world;
}

struct Spec {
  int world = 3;
  std::string compressor = "none";
  Params params;
  CodecOptions codec;
  SyncTrainerOptions options;
  bool quadratic = true;  // else linear regression (its gradients depend on the batch)
  bool shared_target = false;
  std::string scheduler = "fifo";
  Params scheduler_params;
  int fail_rank = -1;
  int64_t fail_step = -1;
};

struct RankOut {
  std::vector<std::vector<float>> values;
  std::vector<StepRecord> records;
  std::vector<uint64_t> checksums;  // after every step, its communication drained
  uint64_t allreduces = 0;
  uint64_t payload_bytes = 0;
  std::size_t last_chunks = 0;  // chunks of the last step's groups
  std::string error;
};

// Every element of every rank's final model within abs + rel |want| of want = expected(x0, mean target), x0 being the
// element's initial value: the quadratics' closed forms.
void expectEveryElement(const std::vector<RankOut>& out, int world,
                        const std::function<double(double x0, double mean_c)>& expected, double abs, double rel) {
  const Quadratic probe(0);
  for (std::size_t t = 0; t < out[0].values.size(); ++t) {
    for (std::size_t i = 0; i < out[0].values[t].size(); ++i) {
      const double want = expected(probe.params()[t].value[i], meanTarget(world, t, i));
      for (const auto& o : out)
        EXPECT_NEAR(o.values[t][i], want, abs + rel * std::abs(want)) << "tensor " << t << " [" << i << "]";
    }
  }
}

std::unique_ptr<Workload> linearRegression() {
  workloads::WorkloadOptions o;
  o.seed = 3;
  o.dims = 8;
  o.num_train = 600;
  o.num_test = 100;
  return workloads::makeWorkload("linear_regression", o, nullptr);
}

std::vector<RankOut> run(const Spec& spec) {
  auto plugin = loader().loadCompressor(spec.compressor);
  auto transports = comm::makeInprocTransports(spec.world);
  std::vector<RankOut> out(static_cast<std::size_t>(spec.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < spec.world; ++r) {
    threads.emplace_back([&, r] {
      RankOut& o = out[static_cast<std::size_t>(r)];
      try {
        comm::HostCommunicator comm(std::move(transports[static_cast<std::size_t>(r)]));
        std::unique_ptr<Workload> w =
            spec.quadratic ? std::make_unique<Quadratic>(r, spec.fail_rank, spec.fail_step, spec.shared_target)
                           : linearRegression();
        SyncTrainer trainer(*w, comm, pipelinesOf(comm, plugin->instantiate(spec.params), spec.codec), spec.options,
                            scheduler(spec.scheduler, spec.scheduler_params));
        while (!trainer.finished()) {
          o.records.push_back(trainer.step());
          o.checksums.push_back(trainer.checksum());
        }
        for (const auto& p : w->params()) o.values.push_back(p.value);
        o.allreduces = comm.stats().kind(comm::OpKind::kAllreduce).ops;
        o.payload_bytes = trainer.payloadBytes();
        for (const IssuedGroup& g : trainer.lastGroups()) o.last_chunks += g.chunks.size();
      } catch (const std::exception& e) {
        o.error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

SyncTrainerOptions plainSgd(int64_t period, int64_t start_step = 0) {
  SyncTrainerOptions o;
  o.batch_size = 8;
  o.epochs = 1;  // 96 / 3 = 32 examples per rank: 4 steps an epoch
  o.lr.lr = 0.125;
  o.local_sgd.period = period;
  o.local_sgd.start_step = start_step;
  return o;
}

// Plain SGD on rank r's quadratic moves x to c_r + (1 - lr)^k (x - c_r) in k steps, and the average of the ranks' to
// mean(c) + (1 - lr)^k (x - mean(c)): each averaging contracts towards the ranks' mean target by (1 - lr)^k.
TEST(LocalSgd, AveragingsFollowTheClosedFormOfLocalStepsOnQuadratics) {
  Spec spec;
  spec.options = plainSgd(3);
  spec.options.epochs = 2;  // 8 steps: averagings after steps 3, 6 and 8 (the last): 3, 3 and 2 local steps
  const auto out = run(spec);
  for (const auto& o : out) ASSERT_EQ(o.error, "");
  const double lr = spec.options.lr.lr;
  expectEveryElement(
      out, spec.world,
      [&](double x, double mean_c) {
        for (int k : {3, 3, 2}) x = mean_c + std::pow(1 - lr, k) * (x - mean_c);
        return x;
      },
      1e-5, 0);
  // One allreduce per tensor per averaging (fifo: a group per tensor), nothing between.
  for (const auto& o : out) EXPECT_EQ(o.allreduces, 3u * 3u);
}

// The outer optimizer (DiLoCo's outer Nesterov SGD, SlowMo's slow momentum) on the same quadratics: with d = a -
// mean(x_r) = (1 - q)(a - mean(c)) for q = (1 - lr)^k, u = beta u + d and a -= alpha (d + beta u) (Nesterov) or
// alpha u.
TEST(LocalSgd, OuterMomentumFollowsItsClosedForm) {
  for (const bool nesterov : {false, true}) {
    Spec spec;
    spec.options = plainSgd(3);
    spec.options.epochs = 3;  // 12 steps: averagings after 3, 6, 9 and 12, 3 local steps each
    spec.options.local_sgd.outer_lr = 0.7;
    spec.options.local_sgd.outer_momentum = 0.9;
    spec.options.local_sgd.outer_nesterov = nesterov;
    const auto out = run(spec);
    for (const auto& o : out) ASSERT_EQ(o.error, "");
    const double lr = spec.options.lr.lr;
    SCOPED_TRACE(nesterov ? "nesterov" : "heavy ball");
    expectEveryElement(
        out, spec.world,
        [&](double a, double mean_c) {
          double u = 0;
          for (int averaging = 0; averaging < 4; ++averaging) {
            const double d = (1 - std::pow(1 - lr, 3)) * (a - mean_c);
            u = 0.9 * u + d;
            a -= 0.7 * (nesterov ? d + 0.9 * u : u);
          }
          return a;
        },
        1e-4, 1e-4);
    // The momentum carried the anchor past where plain averaging would be: the closed form is not the plain one.
    Spec plain = spec;
    plain.options.local_sgd.outer_lr = 1;
    plain.options.local_sgd.outer_momentum = 0;
    plain.options.local_sgd.outer_nesterov = false;
    EXPECT_NE(run(plain)[0].values, out[0].values);
  }
}

TEST(LocalSgd, ReplicasDifferBetweenAveragingsAndAgreeAfterEach) {
  Spec spec;
  spec.options = plainSgd(4, 2);
  spec.options.epochs = 3;  // 12 steps: gradient steps 0-1, averagings after 6, 10 and 12
  const auto out = run(spec);
  for (const auto& o : out) ASSERT_EQ(o.error, "");
  ASSERT_EQ(out[0].records.size(), 12u);
  std::vector<int64_t> averaged;
  for (std::size_t s = 0; s < 12; ++s) {
    const StepRecord& rec = out[0].records[s];
    EXPECT_EQ(rec.local, s >= 2) << "step " << s;
    if (rec.averaged) averaged.push_back(rec.step);
    bool agree = true;
    for (const auto& o : out) agree = agree && o.checksums[s] == out[0].checksums[s];
    EXPECT_EQ(agree, !rec.local || rec.averaged) << "step " << s << ": replicas agree only after an exchange";
  }
  EXPECT_EQ(averaged, (std::vector<int64_t>{5, 9, 11}));
  // Two gradient steps and three averagings, three tensors each.
  for (const auto& o : out) EXPECT_EQ(o.allreduces, 5u * 3u);
}

// The quadratic synchronization rule (local_sgd_schedule.h): rounds of max(period, floor((alpha / lr)^2)) steps, lr
// the rate of the step before each round.
TEST(LocalSgd, QsrRoundsLengthenAsTheRateDecays) {
  // alpha 0.4: at rate 0.2 floor(4) = 4 (period 2 is shorter), at 0.1 16, at 0.05 64; 0.4 / 0.3 squared is 1.78.
  EXPECT_EQ(localRoundLength(2, 0.4, 0.2), 4);
  EXPECT_EQ(localRoundLength(2, 0.4, 0.1), 16);
  EXPECT_EQ(localRoundLength(2, 0.4, 0.05), 64);
  EXPECT_EQ(localRoundLength(2, 0.4, 0.3), 2);
  EXPECT_EQ(localRoundLength(7, 0.0, 0.01), 7);  // off: the period
  EXPECT_EQ(localRoundLength(2, 0.4, 0.0), kLongestLocalRound);
  EXPECT_EQ(localRoundLength(2, 0.4, std::nan("")), kLongestLocalRound);
  EXPECT_EQ(localRoundLength(2, 0.4, 1e-300), kLongestLocalRound);
  // Rate 0.2 for steps 0-9, 0.1 from step 10: rounds from start_step 2 end at 6 and 10 (rate of steps 1 and 5: 0.2),
  // then the round after 10 steps takes step 9's rate (0.2) and ends at 14, the next step 13's (0.1): 16 long, to 30.
  const auto rate = [](int64_t step) { return step < 10 ? 0.2 : 0.1; };
  EXPECT_EQ(scheduledAveragings(2, 2, 0.4, 40, rate), (std::vector<int64_t>{6, 10, 14, 30}));
  EXPECT_EQ(scheduledAveragings(2, 2, 0.4, 29, rate), (std::vector<int64_t>{6, 10, 14}));
  // Without the rule, the period's grid from start_step.
  EXPECT_EQ(scheduledAveragings(3, 1, 0.0, 11, rate), (std::vector<int64_t>{4, 7, 10}));
  // A rising rate (a warm-up from 0.001 by 0.01 a step to 0.1 at step 10, then flat): the first round, drawn from step
  // 0's rate, would last floor((0.4 / 0.001)^2) = 160,000 steps; each step's higher rate cuts it to
  // max(s, H(rate(s - 1))): 1322 at s = 2, 362, 166, 95, 61, 42, 31, 24, 19, and 16 at s = 11 (rate 0.1); then rounds
  // of 16 at the flat rate.
  const auto warm = [](int64_t step) { return step < 10 ? 0.001 + 0.1 * static_cast<double>(step) / 10 : 0.1; };
  EXPECT_EQ(scheduledAveragings(2, 0, 0.4, 60, warm), (std::vector<int64_t>{16, 32, 48}));
  // The schedule as the trainer asks it: the same answers; the grid of a run of 6e9 steps in constant memory.
  const LocalSgdSchedule qsr(2, 2, 0.4, 40, rate);
  for (int64_t d = 0; d <= 41; ++d) EXPECT_EQ(qsr.averagesAfter(d), d == 6 || d == 10 || d == 14 || d == 30) << d;
  EXPECT_EQ(qsr.count(), 4);
  const LocalSgdSchedule grid(5, 23, 0.0, 6'000'000'000, rate);
  EXPECT_TRUE(grid.averagesAfter(28));
  EXPECT_FALSE(grid.averagesAfter(23));
  EXPECT_FALSE(grid.averagesAfter(29));
  EXPECT_EQ(grid.count(), (6'000'000'000 - 23) / 5);
  EXPECT_FALSE(LocalSgdSchedule().averagesAfter(4));
}

// The trainer averages on the rule's rounds, counting the rate of each round's step before it: a step decay at epoch
// 2 (step 8, epochs of 4 steps) from 0.125 to 0.0625 with alpha 0.25 turns rounds of 4 (0.25 / 0.125 = 2, squared:
// the period) into rounds of 16.
TEST(LocalSgd, TheTrainerAveragesOnTheQsrRounds) {
  Spec spec;
  spec.options = plainSgd(4);
  spec.options.epochs = 8;  // 32 steps
  spec.options.lr.schedule = LrSchedule::kStep;
  spec.options.lr.milestones = {2};
  spec.options.lr.gamma = 0.5;
  spec.options.local_sgd.qsr_alpha = 0.25;
  const auto out = run(spec);
  for (const auto& o : out) ASSERT_EQ(o.error, "");
  std::vector<int64_t> averaged;
  for (const auto& rec : out[0].records)
    if (rec.averaged) averaged.push_back(rec.step + 1);
  // Rounds end at 4, 8 and 12 (the rates of steps 0, 3 and 7: 0.125), then step 11's rate 0.0625 makes a round of
  // 16, to 28; the next (16 more) passes the end, which averages anyway.
  EXPECT_EQ(averaged, (std::vector<int64_t>{4, 8, 12, 28, 32}));
  for (const auto& o : out) EXPECT_EQ(o.allreduces, 5u * 3u);
}

TEST(LocalSgd, EvaluationPointsAverageToo) {
  Spec spec;
  spec.options = plainSgd(100);
  spec.options.epochs = 3;
  spec.options.local_sgd.every_steps = 5;
  spec.options.local_sgd.per_epoch = true;
  const auto out = run(spec);
  ASSERT_EQ(out[0].error, "");
  std::vector<int64_t> averaged;
  for (const auto& rec : out[0].records)
    if (rec.averaged) averaged.push_back(rec.step + 1);
  // Steps done 4, 8, 12 (epochs), 5, 10 (every_steps); 12 is also the last.
  EXPECT_EQ(averaged, (std::vector<int64_t>{4, 5, 8, 10, 12}));
}

// Period 1 without momentum or weight decay: each rank's step and then the average of the models is the step of the
// averaged gradient, to f32 rounding, on batches that differ by rank.
TEST(LocalSgd, PeriodOneWithPlainSgdIsSynchronousSgd) {
  Spec local;
  local.quadratic = false;
  local.options = plainSgd(1);
  local.options.batch_size = 16;
  local.options.lr.lr = 0.02;
  local.options.epochs = 2;
  Spec sync = local;
  sync.options.local_sgd.period = 0;
  const auto a = run(local);
  const auto b = run(sync);
  ASSERT_EQ(a[0].error, "");
  ASSERT_EQ(b[0].error, "");
  ASSERT_EQ(a[0].values.size(), b[0].values.size());
  double moved = 0;
  for (std::size_t t = 0; t < a[0].values.size(); ++t) {
    for (std::size_t i = 0; i < a[0].values[t].size(); ++i) {
      EXPECT_NEAR(a[0].values[t][i], b[0].values[t][i], 1e-5 * (1 + std::abs(b[0].values[t][i])));
      moved = std::max(moved, static_cast<double>(std::abs(b[0].values[t][i])));
    }
  }
  EXPECT_GT(moved, 0.05) << "training moved nothing: the comparison would hold trivially";
  EXPECT_EQ(a[0].allreduces, b[0].allreduces);
}

// The algorithm by hand: every rank's own momentum SGD on its own batches (ShardSampler's), models averaged as
// anchor - mean(anchor - x_r) after steps 2, 5, 8, ... and at the end; gradient steps (the mean gradient) before
// start_step.
TEST(LocalSgd, MomentumLocalStepsMatchAHandRunOfTheAlgorithm) {
  constexpr int kWorld = 3;
  Spec spec;
  spec.world = kWorld;
  spec.quadratic = false;
  spec.options = plainSgd(3, 2);
  spec.options.batch_size = 16;
  spec.options.epochs = 2;
  spec.options.lr.lr = 0.02;
  spec.options.sgd.momentum = 0.9;
  spec.options.sgd.weight_decay = 1e-4;
  const auto out = run(spec);
  for (const auto& o : out) ASSERT_EQ(o.error, "");

  std::vector<std::unique_ptr<Workload>> w;
  std::vector<ShardSampler> samplers;
  std::vector<SgdOptimizer> opts;
  for (int r = 0; r < kWorld; ++r) {
    w.push_back(linearRegression());
    samplers.emplace_back(w[0]->numTrainExamples(), r, kWorld, spec.options.seed);
    opts.emplace_back(w.back()->params(), spec.options.sgd);
  }
  const int64_t per_epoch = samplers[0].batchesPerEpoch(spec.options.batch_size);
  const int64_t total = per_epoch * spec.options.epochs;
  ASSERT_EQ(static_cast<std::size_t>(total), out[0].records.size());
  std::vector<std::vector<float>> anchor;
  for (int64_t step = 0; step < total; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      const auto batch = samplers[static_cast<std::size_t>(r)]
                             .epochBatches(step / per_epoch, spec.options.batch_size)
                             .at(static_cast<std::size_t>(step % per_epoch));
      w[static_cast<std::size_t>(r)]->forwardBackward(batch, {});
    }
    const auto params = [&](int r) { return w[static_cast<std::size_t>(r)]->params(); };
    const std::size_t tensors = params(0).size();
    if (step < 2) {
      for (std::size_t t = 0; t < tensors; ++t) {
        for (std::size_t i = 0; i < params(0)[t].numel(); ++i) {
          float sum = 0;
          for (int r = 0; r < kWorld; ++r) sum += params(r)[t].grad[i];
          for (int r = 0; r < kWorld; ++r) params(r)[t].grad[i] = sum / kWorld;
        }
      }
    }
    if (step == 2)
      for (const auto& p : params(0)) anchor.push_back(p.value);
    for (int r = 0; r < kWorld; ++r) opts[static_cast<std::size_t>(r)].updateAll(params(r), spec.options.lr.lr);
    if (step >= 2 && ((step + 1 - 2) % 3 == 0 || step + 1 == total)) {
      for (std::size_t t = 0; t < tensors; ++t) {
        for (std::size_t i = 0; i < params(0)[t].numel(); ++i) {
          float sum = 0;
          for (int r = 0; r < kWorld; ++r) sum += anchor[t][i] - params(r)[t].value[i];
          anchor[t][i] -= sum / kWorld;
          for (int r = 0; r < kWorld; ++r) params(r)[t].value[i] = anchor[t][i];
        }
      }
    }
  }
  for (std::size_t t = 0; t < anchor.size(); ++t) {
    for (std::size_t i = 0; i < anchor[t].size(); ++i) {
      for (const auto& o : out) EXPECT_NEAR(o.values[t][i], anchor[t][i], 1e-5 * (1 + std::abs(anchor[t][i])));
    }
  }
  // Local steps of different data moved the replicas apart before an averaging.
  EXPECT_NE(out[0].checksums[2], out[1].checksums[2]);
}

// Top-k 10% of the deltas with error feedback (Qsparse-local-SGD): the replicas agree after each averaging, the
// averaging sends a tenth of the values (plus indices), and the ranks still reach their common target. A small step:
// a coordinate top-k leaves out for n averagings goes out with n deltas' worth of residual, which overshoots the
// target once n x (1 - (1 - lr)^period) > 1 (the convergence condition of Basu et al. ties lr to the ratio).
TEST(LocalSgd, LossyAveragingWithErrorFeedbackStillReachesTheTarget) {
  Spec exact;
  exact.shared_target = true;
  exact.options = plainSgd(2);
  exact.options.lr.lr = 0.03;
  exact.options.epochs = 100;  // 400 steps, 200 averagings
  Spec lossy = exact;
  lossy.compressor = "topk";
  lossy.params = {{"ratio", "0.1"}};
  lossy.codec.error_feedback = true;
  const auto a = run(exact);
  const auto b = run(lossy);
  for (const auto* out : {&a, &b})
    for (const auto& o : *out) ASSERT_EQ(o.error, "");
  for (const auto& o : b) EXPECT_EQ(o.values, b[0].values);
  EXPECT_LT(b[0].payload_bytes * 2, a[0].payload_bytes) << b[0].payload_bytes << " vs " << a[0].payload_bytes;
  double worst = 0;
  for (std::size_t t = 0; t < b[0].values.size(); ++t) {
    for (std::size_t i = 0; i < b[0].values[t].size(); ++i) {
      const double c = Quadratic(0).target(t, i);
      EXPECT_NEAR(a[0].values[t][i], c, 1e-3);
      worst = std::max(worst, std::abs(b[0].values[t][i] - c));
    }
  }
  EXPECT_LT(worst, 1e-3) << "top-k averaging stalled: worst " << worst;
}

// The averaging cut into chunks by the priority scheduler, with three groups in flight on lanes: at 2 ranks the sums
// do not depend on where chunks end, so the models are those of fifo's whole tensors, bit for bit; and lossy averagings
// of deltas that differ by rank (top-k 10% + error feedback, chunk by chunk, 3 ranks) still leave every replica with
// the same model after each.
TEST(LocalSgd, ChunkedAveragingsOnLanesKeepTheBitsAndTheReplicasInStep) {
  Spec whole;
  whole.world = 2;
  whole.options = plainSgd(3);
  whole.options.epochs = 3;
  Spec chunked = whole;
  chunked.scheduler = "priority";
  chunked.scheduler_params = {{"partition_bytes", "64"}, {"credit_bytes", "0"}};
  chunked.options.max_groups_in_flight = 3;
  const auto a = run(whole);
  const auto b = run(chunked);
  ASSERT_EQ(a[0].error, "");
  ASSERT_EQ(b[0].error, "");
  EXPECT_EQ(a[0].values, b[0].values);
  EXPECT_EQ(a[0].last_chunks, 3u);
  EXPECT_GT(b[0].last_chunks, 3u) << "the scheduler cut nothing: the test would hold trivially";

  Spec lossy = chunked;
  lossy.world = 3;
  lossy.compressor = "topk";
  lossy.params = {{"ratio", "0.1"}};
  lossy.codec.error_feedback = true;
  const auto c = run(lossy);
  for (const auto& o : c) ASSERT_EQ(o.error, "");
  for (std::size_t s = 0; s < c[0].records.size(); ++s) {
    if (!c[0].records[s].averaged) continue;
    for (const auto& o : c) EXPECT_EQ(o.checksums[s], c[0].checksums[s]) << "after the averaging of step " << s;
  }
}

TEST(LocalSgd, ARankFailingBetweenAveragingsFailsEveryRankWithoutHanging) {
  Spec spec;
  spec.options = plainSgd(4);
  spec.options.epochs = 3;
  spec.fail_rank = 1;
  spec.fail_step = 5;  // a local step; ranks 0 and 2 go on to the averaging after step 7 and wait there
  const auto out = run(spec);
  EXPECT_NE(out[1].error.find("rank 1 lost its device"), std::string::npos) << out[1].error;
  for (int r : {0, 2}) EXPECT_NE(out[static_cast<std::size_t>(r)].error, "") << "rank " << r << " finished";
}

TEST(LocalSgd, RefusesNegativeSchedules) {
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  auto plugin = loader().loadCompressor("none");
  Quadratic w(0);
  auto refused = [&](const SyncTrainerOptions& o, const std::string& what) {
    try {
      SyncTrainer t(w, comm, pipelinesOf(comm, plugin->instantiate({})), o, scheduler());
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(plainSgd(-1), "local SGD: period (-1), start_step (0) and every_steps (0) must be >= 0");
  refused(plainSgd(2, -3), "start_step (-3)");
  SyncTrainerOptions outer = plainSgd(2);
  outer.local_sgd.outer_lr = 0;
  refused(outer, "local SGD's outer_lr must be finite and in (0, 100], got 0");
  outer = plainSgd(2);
  outer.local_sgd.outer_momentum = 1;
  refused(outer, "local SGD's outer_momentum must be in [0, 1), got 1");
  outer = plainSgd(2);
  outer.local_sgd.outer_nesterov = true;
  refused(outer, "local SGD's outer_nesterov needs outer_momentum > 0");
  // EF21 keeps estimates of gradients, and local SGD compresses deltas (the config's rule `error-feedback` too).
  auto topk = loader().loadCompressor("topk")->instantiate({{"ratio", "0.5"}});
  CodecOptions ef21;
  ef21.error_feedback = true;
  ef21.error_feedback_rule = ErrorFeedbackRule::kEf21;
  try {
    SyncTrainer t(w, comm, pipelinesOf(comm, topk, ef21), plainSgd(2), scheduler());
    ADD_FAILURE() << "accepted: local SGD with EF21";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("local SGD (period 2) with EF21 (tensor 0)"), std::string::npos) << e.what();
  }
  // Synchronous SGD with EF21 is built.
  SyncTrainer synchronous(w, comm, pipelinesOf(comm, topk, ef21), plainSgd(0), scheduler());
}

// A step trace of local SGD (what `terse whatif` replays): a synchronous step as ever (its tensors ready at their
// backward, groups, updates); a local step compute alone, nothing ready, no group, no update; an averaging step's
// groups carry every tensor once, ready at the end of its computation (no backward names them), and each tensor's
// averaged update follows.
TEST(LocalSgd, AStepTraceRecordsLocalStepsAsComputeAndAveragingsAsGroups) {
  constexpr int kWorld = 2;
  auto plugin = loader().loadCompressor("none");
  auto transports = comm::makeInprocTransports(kWorld);
  std::vector<StepTrace> traces(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::HostCommunicator comm(std::move(transports[static_cast<std::size_t>(r)]));
        Quadratic w(r);
        StepTraceRecorder recorder(TraceHeader{}, rt::Clock::now());
        SyncTrainerOptions o = plainSgd(2, 1);  // 48 examples a rank: 6 steps
        o.step_trace = &recorder;
        SyncTrainer trainer(w, comm, pipelinesOf(comm, plugin->instantiate({})), o, scheduler());
        while (!trainer.finished()) trainer.step();
        traces[static_cast<std::size_t>(r)] = recorder.snapshot();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ASSERT_EQ(e, "");
  for (const StepTrace& trace : traces) {
    ASSERT_EQ(trace.steps.size(), 6u);
    // Step 0 synchronous; local from step 1; averagings after steps 3 and 5 of the grid (start 1, period 2) and the
    // last (6): steps 2, 4 and 5.
    const std::vector<char> kinds{'s', 'l', 'a', 'l', 'a', 'a'};
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const TraceStep& st = trace.steps[i];
      std::size_t ready = 0;
      for (const TraceCompute& c : st.compute) ready += c.ready.size();
      std::vector<int> carried(3, 0);
      for (const TraceGroup& g : st.groups)
        for (const auto& [id, chunk] : g.chunks) ++carried.at(id);
      std::vector<int> updated(3, 0);
      for (const TraceUpdate& u : st.updates) ++updated.at(u.tensor);
      EXPECT_EQ(ready, kinds[i] == 's' ? 3u : 0u) << "step " << i;
      EXPECT_EQ(carried, kinds[i] == 'l' ? std::vector<int>(3, 0) : std::vector<int>(3, 1)) << "step " << i;
      EXPECT_EQ(updated, kinds[i] == 'l' ? std::vector<int>(3, 0) : std::vector<int>(3, 1)) << "step " << i;
      EXPECT_FALSE(st.compute.empty()) << "step " << i;
    }
  }
}

}  // namespace terse::train::local_sgd_test
