// The synchronous trainer over 1 and 3 in-process ranks (one thread per rank, Gloo's habit): the loss falls, every
// rank ends with the same parameters, two runs with one seed are bit-identical, world size 1 with `none` is plain SGD
// on the same batches, 3 workers with `none` are one worker's SGD on the union of their batches, and communication of
// the last layer starts while backward still runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "compressors/dgc/dgc_math.h"
#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/compress/make_codec.h"
#include "core/plugin/loader.h"
#include "core/train/sync_trainer.h"
#include "experiments/workloads/workloads.h"
#include "terse/sdk/params.hpp"

namespace terse::train {
namespace {

PluginLoader buildTreeLoader() {
  return PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
}

// Every tensor and chunk the trainer asks for, through the given compressor (seed 7) on `comm`.
PipelineFactory makePipelines(comm::Communicator& comm, std::shared_ptr<const Compressor> compressor,
                              const CodecOptions& codec = {}) {
  return [&comm, compressor, codec](const TensorInfo& info) {
    return std::make_unique<CompressionPipeline>(makeCodec(compressor, info, 7, codec), comm);
  };
}

// Whole tensors in ready order: the default scheduler, a plugin like any other.
std::unique_ptr<Scheduler> fifo() {
  return buildTreeLoader().loadScheduler("fifo")->instantiate({});
}

std::unique_ptr<Workload> linearRegression(uint64_t seed = 3) {
  workloads::WorkloadOptions o;
  o.seed = seed;
  o.dims = 8;
  o.num_train = 600;
  o.num_test = 100;
  return workloads::makeWorkload("linear_regression", o, nullptr);
}

SyncTrainerOptions smallOptions() {
  SyncTrainerOptions o;
  o.batch_size = 16;
  o.epochs = 2;
  o.seed = 11;
  o.sgd.momentum = 0.9;
  o.sgd.nesterov = true;
  o.sgd.weight_decay = 1e-4;
  o.lr.lr = 0.02;
  o.lr.warmup_steps = 5;
  o.lr.schedule = LrSchedule::kCosine;
  return o;
}

struct RankResult {
  std::vector<std::vector<float>> values;
  std::vector<double> losses;
  uint64_t checksum = 0;
  uint64_t allreduces = 0;
  uint64_t payload_bytes = 0;
};

// One thread per rank; each builds its own workload replica, communicator, pipelines and trainer.
std::vector<RankResult> train(int world, const std::string& compressor_name, const SyncTrainerOptions& options,
                              const CodecOptions& codec = {}, const Params& params = {}) {
  auto loader = buildTreeLoader();
  auto plugin = loader.loadCompressor(compressor_name);
  auto dense = loader.loadCompressor("none");
  auto transports = comm::makeInprocTransports(world);
  std::vector<RankResult> results(static_cast<std::size_t>(world));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::HostCommunicator comm(std::move(transports[static_cast<std::size_t>(r)]));
        auto w = linearRegression();
        SyncTrainerOptions o = options;
        if (o.compression_start_step > 0) o.dense_pipelines = makePipelines(comm, dense->instantiate({}));
        SyncTrainer trainer(*w, comm, makePipelines(comm, plugin->instantiate(params), codec), o, fifo());
        auto& res = results[static_cast<std::size_t>(r)];
        while (!trainer.finished()) res.losses.push_back(trainer.step().loss);
        for (const auto& p : w->params()) res.values.push_back(p.value);
        res.checksum = trainer.checksum();
        res.allreduces = comm.stats().kind(comm::OpKind::kAllreduce).ops;
        res.payload_bytes = trainer.payloadBytes();
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return results;
}

class SyncTrainerWorlds : public ::testing::TestWithParam<int> {};

TEST_P(SyncTrainerWorlds, ConvergesWithIdenticalReplicasAndIsDeterministic) {
  const int world = GetParam();
  const auto a = train(world, "none", smallOptions());
  const auto b = train(world, "none", smallOptions());
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(a[static_cast<std::size_t>(r)].values, a[0].values) << "rank " << r << " diverged from rank 0";
    EXPECT_EQ(a[static_cast<std::size_t>(r)].checksum, a[0].checksum);
    EXPECT_EQ(b[static_cast<std::size_t>(r)].values, a[static_cast<std::size_t>(r)].values)
        << "rank " << r << ": a rerun with the same seed differs";
  }
  const auto& losses = a[0].losses;
  ASSERT_GE(losses.size(), 10u);
  double first = 0, last = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  EXPECT_LT(last, 0.5 * first) << "the loss did not fall";
}

INSTANTIATE_TEST_SUITE_P(Worlds, SyncTrainerWorlds, ::testing::Values(1, 3));

TEST(SyncTrainer, CompressedRanksStayIdentical) {
  // A lossy compressor with error feedback: the ranks still apply one and the same averaged gradient.
  const auto a = train(3, "topk", smallOptions(), {.error_feedback = true}, {{"ratio", "0.25"}});
  for (const auto& r : a) EXPECT_EQ(r.values, a[0].values);
  EXPECT_LT(a[0].losses.back(), a[0].losses.front());
}

// The dense warm-up (sync_trainer.h): the steps before compression_start_step are the `none` run's, bit for bit, and
// the compressor takes over at that step exactly: the losses, which each step computes before its own update, are the
// dense run's up to it and not after, and the bytes are the dense run's per step before it and the compressor's after.
TEST(SyncTrainer, ADenseWarmupIsTheDenseRunUpToItsStartStep) {
  const SyncTrainerOptions options = smallOptions();
  const CodecOptions ef{.error_feedback = true};
  const Params ratio{{"ratio", "0.25"}};
  const auto dense = train(3, "none", options);
  const auto compressed = train(3, "topk", options, ef, ratio);
  const std::size_t steps = dense[0].losses.size();
  ASSERT_GE(steps, 20u);
  const auto d = static_cast<int64_t>(dense[0].payload_bytes / steps);  // the same bytes every step
  const auto c = static_cast<int64_t>(compressed[0].payload_bytes / steps);
  ASSERT_NE(c, d);  // top-k's pairs and header outweigh 9 dense floats: what matters is that they differ

  SyncTrainerOptions all = options;
  all.compression_start_step = static_cast<int64_t>(steps);  // the whole run: the compressor never runs
  const auto warm_all = train(3, "topk", all, ef, ratio);
  EXPECT_EQ(warm_all[0].values, dense[0].values);
  EXPECT_EQ(warm_all[0].payload_bytes, dense[0].payload_bytes);

  for (const int64_t start : {int64_t{1}, int64_t{7}}) {
    SyncTrainerOptions warm = options;
    warm.compression_start_step = start;
    const auto got = train(3, "topk", warm, ef, ratio);
    for (const auto& r : got) EXPECT_EQ(r.values, got[0].values) << "the ranks disagree";
    const auto k = static_cast<std::size_t>(start);
    for (std::size_t s = 0; s <= k; ++s)
      EXPECT_EQ(got[0].losses[s], dense[0].losses[s]) << "start " << start << ": step " << s << " is not dense";
    EXPECT_NE(got[0].losses[k + 1], dense[0].losses[k + 1]) << "start " << start << ": step " << k << " was dense";
    EXPECT_NE(got[0].values, compressed[0].values);
    EXPECT_EQ(static_cast<int64_t>(got[0].payload_bytes), start * d + (static_cast<int64_t>(steps) - start) * c);
  }
  // The compressor, first called at the start step (the bytes above), learns from there.
  SyncTrainerOptions one = options;
  one.compression_start_step = 1;
  const auto learned = train(3, "topk", one, ef, ratio);
  EXPECT_LT(learned[0].losses.back(), 0.5 * learned[0].losses.front());
}

// DGC's own warm-up (compressors/dgc: warmup_steps, warmup_stages) on three ranks with error feedback: each step's
// payload is its stage's, so the run's bytes are each stage's steps at that stage's ratio (measured by plain runs at
// those ratios: the tensors are below DGC's sample, so its selection is the exact k and a ratio's bytes are the same
// every step), and the ranks agree.
TEST(SyncTrainer, ADgcWarmupSendsEachStepItsStagesRatio) {
  const SyncTrainerOptions options = smallOptions();
  const CodecOptions ef{.error_feedback = true};
  const double ratio = 0.1;
  const std::vector<double> ratios = terse::compressors::dgc::warmupRatios(ratio, 2);  // k of 8 weights: 4, 2, then 1
  const auto perStep = [&](double r) {
    const auto got = train(3, "dgc", options, ef, {{"ratio", terse::sdk::formatNumber(r)}});
    return got[0].payload_bytes / got[0].losses.size();
  };
  const uint64_t final_bytes = perStep(ratio);
  uint64_t expected = 0;
  uint64_t previous = ~uint64_t{0};
  for (const double r : ratios) {
    const uint64_t b = perStep(r);
    EXPECT_LT(b, previous) << "ratio " << r << " sends no less than the stage before: the test would not bite";
    previous = b;
    expected += 6 * b;  // 12 warm-up steps in 2 stages of 6
  }
  EXPECT_LT(final_bytes, previous);
  const auto warm = train(3, "dgc", options, ef, {{"ratio", "0.1"}, {"warmup_steps", "12"}, {"warmup_stages", "2"}});
  const std::size_t steps = warm[0].losses.size();
  ASSERT_GT(steps, 12u);
  expected += (steps - 12) * final_bytes;
  for (const auto& r : warm) {
    EXPECT_EQ(r.values, warm[0].values) << "the ranks disagree";
    EXPECT_EQ(r.payload_bytes, expected);
  }
  EXPECT_LT(warm[0].losses.back(), 0.5 * warm[0].losses.front());
}

TEST(SyncTrainer, RefusesADenseWarmupWithoutItsPipelinesOrBesideLocalSgd) {
  auto loader = buildTreeLoader();
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  auto w = linearRegression();
  const auto none = loader.loadCompressor("none");
  SyncTrainerOptions o = smallOptions();
  o.compression_start_step = 5;
  try {
    SyncTrainer t(*w, comm, makePipelines(comm, none->instantiate({})), o, fifo());
    ADD_FAILURE() << "a warm-up without its pipelines was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("compression_start_step 5 needs the dense warm-up's pipeline factory"),
              std::string::npos)
        << e.what();
  }
  o.dense_pipelines = makePipelines(comm, none->instantiate({}));
  o.local_sgd.period = 4;
  try {
    SyncTrainer t(*w, comm, makePipelines(comm, none->instantiate({})), o, fifo());
    ADD_FAILURE() << "a warm-up beside local SGD was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("local SGD (period 4) with compression_start_step 5: local SGD's gradient "
                                         "steps before its start_step are its warm-up"),
              std::string::npos)
        << e.what();
  }
  o.local_sgd.period = 0;
  o.compression_start_step = -1;
  EXPECT_THROW(SyncTrainer(*w, comm, makePipelines(comm, none->instantiate({})), o, fifo()), InvalidArgument);
}

TEST(SyncTrainer, WorldOneWithNoneIsPlainSgd) {
  const SyncTrainerOptions options = smallOptions();
  const auto trained = train(1, "none", options);

  // The same batches and the same update, without trainer, communicator or pipeline.
  auto w = linearRegression();
  ShardSampler sampler(w->numTrainExamples(), 0, 1, options.seed);
  SgdOptimizer opt(w->params(), options.sgd);
  LrScheduleOptions lr = options.lr;
  lr.steps_per_epoch = sampler.batchesPerEpoch(options.batch_size);
  lr.total_steps = lr.steps_per_epoch * options.epochs;
  int64_t step = 0;
  for (int64_t e = 0; e < options.epochs; ++e) {
    for (const auto& batch : sampler.epochBatches(e, options.batch_size)) {
      w->forwardBackward(batch, {});
      opt.updateAll(w->params(), learningRate(lr, step++));
    }
  }
  ASSERT_EQ(trained[0].values.size(), w->params().size());
  for (std::size_t i = 0; i < w->params().size(); ++i) EXPECT_EQ(trained[0].values[i], w->params()[i].value);
}

// The reference of the tests below: one worker stepping on the union of the world's batches (equal shards, so the
// ranks' mean gradients average to the union's), with `clip` > 0 clipping its gradient by hand first.
std::unique_ptr<Workload> unionOfBatches(int world, const SyncTrainerOptions& options, double clip = 0) {
  auto w = linearRegression();
  std::vector<ShardSampler> samplers;
  for (int r = 0; r < world; ++r) samplers.emplace_back(w->numTrainExamples(), r, world, options.seed);
  SgdOptimizer opt(w->params(), options.sgd);
  LrScheduleOptions lr = options.lr;
  lr.world_size = world;
  lr.steps_per_epoch = samplers[0].batchesPerEpoch(options.batch_size);
  lr.total_steps = lr.steps_per_epoch * options.epochs;
  for (int64_t step = 0; step < lr.total_steps; ++step) {
    std::vector<int64_t> all;
    for (const auto& s : samplers) {
      const auto b = s.epochBatches(step / lr.steps_per_epoch, options.batch_size)
                         .at(static_cast<std::size_t>(step % lr.steps_per_epoch));
      all.insert(all.end(), b.begin(), b.end());
    }
    w->forwardBackward(all, {});
    if (clip > 0) {
      double sq = 0;
      for (const auto& p : w->params())
        for (float g : p.grad) sq += static_cast<double>(g) * g;
      const double scale = clip / (std::sqrt(sq) + 1e-6);
      if (scale < 1)
        for (auto& p : w->params())
          for (float& g : p.grad) g = static_cast<float>(g * scale);
    }
    opt.updateAll(w->params(), learningRate(lr, step));
  }
  return w;
}

// Every value within f32 rounding of the reference (a few ulps per step, compounded).
void expectClose(const RankResult& got, const Workload& want) {
  ASSERT_EQ(got.values.size(), want.params().size());
  for (std::size_t t = 0; t < want.params().size(); ++t) {
    const auto& expect = want.params()[t].value;
    float scale = 0;
    for (float v : expect) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < expect.size(); ++i)
      EXPECT_NEAR(got.values[t][i], expect[i], 1e-5f * scale + 1e-7f) << want.params()[t].name << "[" << i << "]";
  }
}

TEST(SyncTrainer, ThreeWorkersWithNoneAreLargeBatchSgd) {
  // With an exact compressor, averaging three per-rank mean gradients over b examples each is the mean gradient over
  // the 3b examples (equal batch sizes, every step including the short last one), so 3 workers must track one worker
  // stepping on the union of their batches (unionOfBatches). The two sides sum the same terms in a different order
  // (per rank, then across ranks, then /3 vs one sum /3b), so they agree to f32 rounding, not bit for bit.
  constexpr int kWorld = 3;
  SyncTrainerOptions options = smallOptions();
  options.epochs = 1;  // 600 / 3 = 200 examples per rank: 13 steps of 16, the last of 8
  const auto trained = train(kWorld, "none", options);
  ASSERT_EQ(trained[0].losses.size(), 13u);
  expectClose(trained[0], *unionOfBatches(kWorld, options));
}

// Accumulating 2 micro-batches of 16 is the step of one batch of 32: the same values to f32 rounding, the same
// losses, and one allreduce per tensor per step, as without accumulation.
TEST(SyncTrainer, GradientAccumulationIsTheLargerBatch) {
  constexpr int kWorld = 3;
  SyncTrainerOptions big = smallOptions();
  big.epochs = 1;  // 200 examples per rank: 6 steps of 32 and one of 8
  big.batch_size = 32;
  SyncTrainerOptions accumulated = big;
  accumulated.batch_size = 16;
  accumulated.accumulation_steps = 2;  // 12 micro-batches of 16 and one of 8: the same 7 steps
  const auto a = train(kWorld, "none", accumulated);
  const auto b = train(kWorld, "none", big);
  ASSERT_EQ(a[0].losses.size(), 7u);
  ASSERT_EQ(b[0].losses.size(), 7u);
  for (std::size_t s = 0; s < 7; ++s) EXPECT_NEAR(a[0].losses[s], b[0].losses[s], 1e-5 * std::abs(b[0].losses[s]));
  EXPECT_EQ(a[0].allreduces, b[0].allreduces);
  EXPECT_EQ(a[1].values, a[0].values);
  expectClose(a[0], *unionOfBatches(kWorld, big));
}

// Clipping to a global norm below the gradients' matches clipping by hand the union batch's gradient, whose norm the
// reference computes itself; and it changes the result.
TEST(SyncTrainer, ClipGradNormMatchesAHandComputedNorm) {
  constexpr int kWorld = 2;
  SyncTrainerOptions options = smallOptions();
  options.epochs = 1;
  options.clip_grad_norm = 0.25;
  const auto clipped = train(kWorld, "none", options);
  EXPECT_EQ(clipped[1].values, clipped[0].values);
  const auto reference = unionOfBatches(kWorld, options, options.clip_grad_norm);
  expectClose(clipped[0], *reference);
  const auto unclipped = unionOfBatches(kWorld, options);
  double diff = 0;
  for (std::size_t t = 0; t < unclipped->params().size(); ++t)
    for (std::size_t i = 0; i < unclipped->params()[t].numel(); ++i)
      diff = std::max(diff,
                      static_cast<double>(std::abs(unclipped->params()[t].value[i] - reference->params()[t].value[i])));
  EXPECT_GT(diff, 1e-3) << "clipping at 0.25 changed nothing: the test does not exercise it";
}

TEST(SyncTrainer, RefusesBadAccumulationAndClipping) {
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  auto plugin = buildTreeLoader().loadCompressor("none");
  auto w = linearRegression();
  auto expectRefused = [&](SyncTrainerOptions o, const std::string& what) {
    try {
      SyncTrainer t(*w, comm, makePipelines(comm, plugin->instantiate({})), o, fifo());
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  SyncTrainerOptions o = smallOptions();
  o.accumulation_steps = 0;
  expectRefused(o, "gradient_accumulation_steps must be >= 1, got 0");
  o = smallOptions();
  o.clip_grad_norm = -1;
  expectRefused(o, "optimizer.clip_grad_norm must be finite and >= 0, got -1");
}

// Three one-tensor layers; backward "computes" for a while after reporting each layer, so a trainer that overlaps
// must have started the last layer's communication before forwardBackward returns.
class SlowThreeLayers : public Workload {
 public:
  SlowThreeLayers() {
    for (int l = 0; l < 3; ++l) addParam("layer" + std::to_string(l), {4, 2}, l);
  }
  std::string_view name() const override { return "slow_three_layers"; }
  int64_t numTrainExamples() const override { return 64; }
  double forwardBackward(std::span<const int64_t> batch, const LayerReadyFn& ready) override {
    for (int l = numLayers() - 1; l >= 0; --l) {
      for (std::size_t t : layerTensors(l)) {
        for (std::size_t i = 0; i < params()[t].numel(); ++i)
          params()[t].grad[i] = static_cast<float>(batch.size()) * 0.01f * static_cast<float>(i + 1);
      }
      reportLayer(ready, l);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
    }
    return 1.0;
  }
  EvalResult evaluate(int64_t) override { return {}; }
};

TEST(SyncTrainer, CommunicationOverlapsBackwardInReadyOrder) {
  auto loader = buildTreeLoader();
  auto plugin = loader.loadCompressor("none");
  auto transports = comm::makeInprocTransports(2);
  std::vector<StepRecord> records(2);
  std::vector<std::vector<std::size_t>> orders(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      comm::HostCommunicator comm(std::move(transports[static_cast<std::size_t>(r)]));
      SlowThreeLayers w;
      SyncTrainerOptions o;
      o.batch_size = 8;
      o.epochs = 1;
      SyncTrainer trainer(w, comm, makePipelines(comm, plugin->instantiate({})), o, fifo());
      records[static_cast<std::size_t>(r)] = trainer.step();
      orders[static_cast<std::size_t>(r)] = trainer.lastIssueOrder();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(orders[static_cast<std::size_t>(r)], (std::vector<std::size_t>{2, 1, 0}));
    // Layers 2 and 1 are handed over 40 ms before backward ends; their allreduce takes microseconds.
    EXPECT_GE(records[static_cast<std::size_t>(r)].overlapped_tensors, 2) << "rank " << r;
    EXPECT_LT(records[static_cast<std::size_t>(r)].times.exposed_comm_s, 0.03);
  }
}

TEST(SyncTrainer, RejectsAFactoryThatBuildsTheWrongTensor) {
  auto loader = buildTreeLoader();
  auto plugin = loader.loadCompressor("none");
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  auto w = linearRegression();
  std::shared_ptr<const Compressor> instance = plugin->instantiate({});
  // One element short: the engine would read past the pipeline's buffers if the trainer trusted it.
  auto short_by_one = [&](const TensorInfo& info) {
    TensorInfo wrong = info;
    wrong.numel = info.numel - 1;
    wrong.ndim = 0;
    wrong.shape = {};
    return std::make_unique<CompressionPipeline>(makeCodec(instance, wrong, 7, {}), comm);
  };
  try {
    SyncTrainer trainer(*w, comm, short_by_one, smallOptions(), fifo());
    FAIL() << "a pipeline of the wrong size was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the pipeline factory was asked for tensor id 0"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(SyncTrainer(*w, comm, makePipelines(comm, instance), smallOptions(), nullptr), InvalidArgument);
}

// A workload that computes on a GPU needs a communicator on device memory (NCCL): with a host transport every
// gradient pointer handed to the pipelines would be a device address the host transport dereferences.
class ClaimsDevice : public SlowThreeLayers {
 public:
  int device() const override { return 0; }
};

TEST(SyncTrainer, DeviceWorkloadNeedsADeviceCommunicator) {
  auto loader = buildTreeLoader();
  auto plugin = loader.loadCompressor("none");
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  ClaimsDevice w;
  try {
    SyncTrainer trainer(w, comm, makePipelines(comm, plugin->instantiate({})), SyncTrainerOptions{}, fifo());
    FAIL() << "a device workload was accepted with a host communicator";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("computes on CUDA device 0 but the 'inproc' communicator works on host memory"),
              std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace terse::train
