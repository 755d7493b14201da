// simulation.compute CALIBRATED end to end (experiments/runner/calibration.h, DESIGN.md section 9): one table gives
// bit-identical records, time fields included; the cache is reused and a replayed table is not measured again; a table
// from another CPU or commit is refused unless allowed; the codecs are priced by what they cost (top-k above fp16 per
// element); the table's file and the config's new fields are checked with messages that name them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <string>

#include "core/common/json.h"
#include "core/plugin/loader.h"
#include "experiments/config/config.h"
#include "experiments/runner/calibration.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/workloads/fashion_mnist.h"
#include "experiments/workloads/workloads.h"
#include "results/result_writer.h"
#include "runner_test_util.h"

namespace terse::runner {
namespace {
using namespace test_util;

// Every simulated run of this binary calibrates (CALIBRATED is the default): into a cache of the build tree, never the
// user's.
class CacheInBuildTree : public ::testing::Environment {
 public:
  void SetUp() override {
    const fs::path dir = fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "runner_out" / "calibration_cache";
    fs::create_directories(dir);
    setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  }
};
const auto* const kCache = ::testing::AddGlobalTestEnvironment(new CacheInBuildTree);

// Three workers (odd), an MLP, top-k 1% with error feedback: forward, backward, codecs, sums and the optimizer are all
// charged from the table.
std::string calibratedStudy(const std::string& extra = "", const std::string& compressor = "topk") {
  return "study: \"unit\"\n"
         "workload { name: \"mlp\" hidden_sizes: [32] }\n"
         "data { batch_size: 32 train_subset: 960 test_subset: 100 }\n"
         "optimizer { lr: 0.05 momentum: 0.9 }\n"
         "compressor { name: \"" +
         compressor +
         "\" }\n"
         "error_feedback: " +
         (compressor == "topk" ? "true" : "false") +
         "\n"
         "workers: 3\n"
         "epochs: 1\n"
         "eval { every_steps: 4 per_epoch: true }\n"
         "seed: 7\n"
         "clock: SIMULATED\n" +
         extra;
}

struct Ran {
  fs::path dir;
  std::string metrics;
  Json provenance;
};

Ran runCalibrated(PluginLoader& loader, const std::string& text, const fs::path& root) {
  const auto study = experiments::loadStudyText(text, "unit.textproto", runnerConfigOptions(&loader));
  Runner runner(quietOptions(loader, root));
  const RunSummary s = runner.run(study.experiments.at(0));
  Ran r{s.dir, readFile(s.dir / "metrics.jsonl"), Json{}};
  r.provenance = parseJsonObject(readFile(s.dir / "provenance.json")).value_or(Json{});
  return r;
}

// provenance.json's simulation entry `key`.
std::string simulationNote(const Json& provenance, const std::string& key) {
  const Json* sim = findMember(provenance, "simulation");
  if (sim == nullptr) return "";
  return getString(*sim, key).value_or("");
}

std::string failure(PluginLoader& loader, const std::string& text, const fs::path& root) {
  try {
    runCalibrated(loader, text, root);
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "the run should have failed";
  return "";
}

TEST(CalibratedRun, OneTableGivesIdenticalRecordsAndTheCacheIsReused) {
  auto loader = testLoader();
  // A fresh cache: the first run measures every kernel, the second none, a replay none either.
  const fs::path cache = freshDir("cal_cache_reuse");
  setenv("XDG_CACHE_HOME", cache.c_str(), 1);
  const Ran first = runCalibrated(loader, calibratedStudy(), freshDir("cal_same_1"));
  const Ran second = runCalibrated(loader, calibratedStudy(), freshDir("cal_same_2"));
  ASSERT_FALSE(first.metrics.empty());
  EXPECT_EQ(second.metrics, first.metrics) << "the same table must give the same records, time fields included";
  const std::string measured1 = simulationNote(first.provenance, "calibration_measured");
  const std::string measured2 = simulationNote(second.provenance, "calibration_measured");
  EXPECT_NE(measured1.rfind("0 of ", 0), 0u) << measured1;
  EXPECT_EQ(measured2.rfind("0 of ", 0), 0u) << measured2;
  EXPECT_EQ(simulationNote(first.provenance, "calibration_source"), "measured");
  EXPECT_EQ(simulationNote(second.provenance, "calibration_source").rfind("cache ", 0), 0u);
  // The cache file by name only: no directory of this machine travels with the run's provenance.
  EXPECT_EQ(simulationNote(second.provenance, "calibration_source").find('/'), std::string::npos)
      << simulationNote(second.provenance, "calibration_source");
  EXPECT_EQ(simulationNote(first.provenance, "calibration"), "calibration.json");
  EXPECT_NE(simulationNote(first.provenance, "compute").find("calibrated"), std::string::npos);
  // The table used is in the results folder, and the second run used the same one.
  const std::string table = readFile(first.dir / "calibration.json");
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(readFile(second.dir / "calibration.json"), table);

  // Replayed from the first run's folder, with an empty cache: nothing is measured and the records are the same.
  setenv("XDG_CACHE_HOME", freshDir("cal_cache_replay").c_str(), 1);
  const Ran replay = runCalibrated(
      loader, calibratedStudy("simulation { calibration: \"" + (first.dir / "calibration.json").string() + "\" }\n"),
      freshDir("cal_same_3"));
  EXPECT_EQ(replay.metrics, first.metrics);
  EXPECT_EQ(simulationNote(replay.provenance, "calibration_measured").rfind("0 of ", 0), 0u);
  EXPECT_EQ(simulationNote(replay.provenance, "calibration_source").rfind("replayed ", 0), 0u);
  EXPECT_TRUE(fs::is_empty(fs::path(std::getenv("XDG_CACHE_HOME")))) << "a replay writes no cache";

  // Replayed into the folder it replays from (the first run again, its table pinned): the new run must not remove the
  // table it is about to read, as it removes an earlier run's other files (results::ResultWriter).
  const Ran again = runCalibrated(
      loader, calibratedStudy("simulation { calibration: \"" + (first.dir / "calibration.json").string() + "\" }\n"),
      first.dir.parent_path().parent_path());
  EXPECT_EQ(again.metrics, first.metrics);
  EXPECT_EQ(readFile(first.dir / "calibration.json"), table);
}

// Two runs that missed the same keys both measure them; whichever writes the cache first wins, and the other charges
// that time too (mergeIntoCalibrationCache): a time once written never changes. Before, the last writer replaced the
// first's, and a `terse run` beside another charged its later variants from the other's measurements.
TEST(CalibratedRun, TheCacheKeepsTheFirstTimeWrittenForAKey) {
  const fs::path dir = freshDir("cal_cache_merge");
  const fs::path file = dir / "table.json";
  const CalibrationIdentity here = thisMachine();
  using Times = std::map<std::string, double>;
  EXPECT_EQ(mergeIntoCalibrationCache(file, here, {{"a", 1.0}, {"b", 2.0}}).seconds, (Times{{"a", 1.0}, {"b", 2.0}}));
  const CalibrationTable merged = mergeIntoCalibrationCache(file, here, {{"b", 5.0}, {"c", 3.0}});
  EXPECT_EQ(merged.seconds, (Times{{"a", 1.0}, {"b", 2.0}, {"c", 3.0}})) << "b was written first at 2.0";
  EXPECT_EQ(CalibrationTable::load(file).seconds, merged.seconds);
  // Another commit's table is no cache of this one: replaced, not merged.
  CalibrationTable other;
  other.identity = here;
  other.identity.commit = "another";
  other.seconds = {{"a", 9.0}};
  results::writeFileAtomic(file, other.toJson());
  EXPECT_EQ(mergeIntoCalibrationCache(file, here, {{"a", 1.0}}).seconds, (Times{{"a", 1.0}}));
  EXPECT_TRUE(CalibrationTable::load(file).identity == here);
}

TEST(CalibratedRun, AForeignTableIsRefusedNamingBothUnlessAllowed) {
  auto loader = testLoader();
  const Ran first = runCalibrated(loader, calibratedStudy(), freshDir("cal_foreign_src"));
  CalibrationTable t = CalibrationTable::load(first.dir / "calibration.json");
  t.identity.cpu = "Imaginary CPU 9000 (family 1 model 2, 3 logical CPUs, avx2)";
  const fs::path foreign = freshDir("cal_foreign_file") / "calibration.json";
  std::ofstream(foreign) << t.toJson();
  const std::string use = "simulation { calibration: \"" + foreign.string() + "\" ";
  const std::string m = failure(loader, calibratedStudy(use + "}\n"), freshDir("cal_foreign_run"));
  EXPECT_NE(m.find("simulation.calibration"), std::string::npos) << m;
  EXPECT_NE(m.find("Imaginary CPU 9000"), std::string::npos) << m;
  EXPECT_NE(m.find(thisMachine().cpu), std::string::npos) << m;
  EXPECT_NE(m.find("allow_foreign_calibration"), std::string::npos) << m;

  const Ran allowed =
      runCalibrated(loader, calibratedStudy(use + "allow_foreign_calibration: true }\n"), freshDir("cal_foreign_ok"));
  EXPECT_NE(simulationNote(allowed.provenance, "calibration_foreign").find("Imaginary CPU 9000"), std::string::npos);
  // The foreign table's times are the ones charged: the records equal the run it came from.
  EXPECT_EQ(allowed.metrics, first.metrics);
}

TEST(CalibratedRun, ATableWithoutTheRunsKernelsIsRefused) {
  auto loader = testLoader();
  const Ran first = runCalibrated(loader, calibratedStudy(), freshDir("cal_missing_src"));
  // Another batch size charges other forward and backward keys.
  std::string text =
      calibratedStudy("simulation { calibration: \"" + (first.dir / "calibration.json").string() + "\" }\n");
  text.replace(text.find("batch_size: 32"), 14, "batch_size: 16");
  const std::string m = failure(loader, text, freshDir("cal_missing_run"));
  EXPECT_NE(m.find("has no time for kernel 'forward mlp#"), std::string::npos) << m;
  EXPECT_NE(m.find(" b16'"), std::string::npos) << m;
}

TEST(CalibratedRun, ABrokenTableFileIsRefusedNamingTheFileAndField) {
  const auto bad = [](const std::string& text) {
    try {
      CalibrationTable::parse(text, "cal.json");
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted: " << text;
    return std::string();
  };
  const std::string head = R"({"format": "terse calibration 1", "cpu": "c", "flags": "", "commit": "x", )";
  EXPECT_NE(bad("{").find("cal.json: not JSON"), std::string::npos);
  EXPECT_NE(bad(R"({"format": "other"})").find("field 'format'"), std::string::npos);
  EXPECT_NE(bad(R"({"format": "terse calibration 1", "cpu": 3})").find("field 'cpu'"), std::string::npos);
  EXPECT_NE(bad(head + R"("seconds": []})").find("field 'seconds'"), std::string::npos);
  EXPECT_NE(bad(head + R"("seconds": {"sum f32 n4": -1}})").find("kernel 'sum f32 n4'"), std::string::npos);
  EXPECT_NE(bad(head + R"("seconds": {"sum f32 n4": "1"}})").find("kernel 'sum f32 n4'"), std::string::npos);
  const CalibrationTable ok = CalibrationTable::parse(head + R"("seconds": {"sum f32 n4": 1.5e-9}})", "cal.json");
  EXPECT_EQ(ok.seconds.at("sum f32 n4"), 1.5e-9);
  EXPECT_EQ(CalibrationTable::parse(ok.toJson(), "again").seconds, ok.seconds);
}

TEST(CalibratedRun, ConfigChecksNameTheField) {
  std::string real = calibratedStudy();
  real.erase(real.find("clock: SIMULATED"));
  expectConfigError(real + "simulation { compute: CALIBRATED }\n",
                    "simulation.compute: CALIBRATED charges the kernels of a simulated run");
  expectConfigError(real + "transport: TCP\nsimulation { compute: CALIBRATED }\n", "with transport TCP");
  expectConfigError(calibratedStudy("simulation { compute: FLOP_MODEL calibration: \"c.json\" }\n"),
                    "simulation.calibration: a table is replayed by compute CALIBRATED, got compute FLOP_MODEL");
  expectConfigError(calibratedStudy("simulation { calibration: \"\" }\n"), "simulation.calibration must name");
  expectConfigError(calibratedStudy("simulation { allow_foreign_calibration: true }\n"),
                    "simulation.allow_foreign_calibration: true only applies");
  // The default: CALIBRATED when simulated, MEASURED (unused) in real time.
  auto loader = testLoader();
  const auto sim = experiments::loadStudyText(calibratedStudy(), "u", runnerConfigOptions(&loader));
  EXPECT_EQ(sim.experiments.at(0).simulation().compute(), experiments::Simulation::CALIBRATED);
  const auto rt = experiments::loadStudyText(real, "u", runnerConfigOptions(&loader));
  EXPECT_EQ(rt.experiments.at(0).simulation().compute(), experiments::Simulation::MEASURED);
}

// The compress and decompress cost of the MLP's largest tensor (784 x 32 weights) in a calibrated table.
double largestTensorCodecCost(const CalibrationOutcome& out) {
  const double n = 784 * 32;
  return out.costs->seconds({.kind = rt::CostKind::kCompress, .layer = 0, .size = n}) +
         out.costs->seconds({.kind = rt::CostKind::kDecompress, .size = n});
}

// The calibration's data: 960 training and 100 test images.
std::shared_ptr<const workloads::DataSplit> smallData() {
  workloads::FashionMnistOptions fo;
  fo.max_train = 960;
  fo.max_test = 100;
  return std::make_shared<const workloads::DataSplit>(workloads::loadFashionMnist(fo));
}

TEST(CalibratedRun, CodecsArePricedByTheirCostTopKAboveFp16PerElement) {
  // The FLOP model charges every codec 4 flops per element; the calibrated table times them: a top-k selection with
  // error feedback does far more per element than a cast to half precision, as measured compute shows.
  auto loader = testLoader();
  setenv("XDG_CACHE_HOME", freshDir("cal_cache_rank").c_str(), 1);
  const auto data = smallData();
  const auto costOf = [&](const std::string& compressor) {
    const auto study = experiments::loadStudyText(calibratedStudy("", compressor), "u", runnerConfigOptions(&loader));
    const CalibrationOutcome out = calibrate({study.experiments.at(0), data, loader, std::nullopt});
    // The calibrator reports what it timed: the first compressor's run every kernel (a fresh cache), the second's
    // only its own codec's, the rest coming from the cache.
    EXPECT_FALSE(out.measured.empty());
    for (const std::string& k : out.measured) {
      if (compressor == "topk") break;
      EXPECT_TRUE(k.starts_with("compress " + compressor + "#") || k.starts_with("decompress " + compressor + "#"))
          << k;
    }
    if (compressor == "topk") {
      EXPECT_EQ(out.measured.size(), out.table.seconds.size());
    }
    return largestTensorCodecCost(out);
  };
  const double topk = costOf("topk");
  const double fp16 = costOf("fp16");
  EXPECT_GT(fp16, 0);
  EXPECT_GT(topk, 1.5 * fp16) << "top-k " << topk << " s, fp16 " << fp16 << " s per compress and decompress";
}

TEST(CalibratedRun, CodecsAreTimedOnTheModelsGradientWhichTheirKeysName) {
  // A codec's work can follow its input: threshold keeps what reaches tau. Timed on unit gaussians, threshold at tau
  // 0.03 kept 98% of every tensor and was priced 10x what the zoo measured for it; the calibration times codecs on
  // the model's own gradient, one per tensor size.
  auto loader = testLoader();
  const auto data = smallData();
  const auto experiment = [&](const std::string& text) {
    return experiments::loadStudyText(text, "u", runnerConfigOptions(&loader)).experiments.at(0);
  };
  const experiments::Experiment e = experiment(calibratedStudy());
  const auto grads = codecCalibrationGradients(e, data);

  // The gradient a fresh replica computes over the first batch, tensor by tensor, at the calibration's seed (the run's
  // is 7).
  workloads::WorkloadOptions options = detail::workloadOptions(e);
  options.seed = kCalibrationSeed;
  auto model = workloads::makeWorkload(e.workload().name(), options, data);
  std::vector<int64_t> batch(static_cast<std::size_t>(e.data().batch_size()));
  std::iota(batch.begin(), batch.end(), 0);
  model->forwardBackward(batch, {});
  auto instance = loader.loadCompressor("topk")->instantiate(experiments::pluginParams(e.compressor()));
  const CalibrationPlan plan = planCalibration(e, *model, *instance);
  ASSERT_EQ(grads.size(), plan.sizes.size());
  for (uint64_t n : plan.sizes) {
    ASSERT_TRUE(grads.count(n)) << n;
    const train::ParamTensor* first = nullptr;
    for (const auto& t : model->params())
      if (t.numel() == n && first == nullptr) first = &t;
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(grads.at(n), first->grad) << first->name;
  }
  // Gradient-like, not unit gaussian: the largest tensor (784 x 32 weights) has few elements at 0.03 or more, where
  // a unit gaussian has 97.6%.
  const std::vector<float>& w = grads.at(784 * 32);
  const auto big = std::count_if(w.begin(), w.end(), [](float x) { return std::abs(x) >= 0.03f; });
  EXPECT_LT(static_cast<double>(big), 0.2 * static_cast<double>(w.size())) << big << " of " << w.size();

  // That the calibration times the codecs on these gradients is what the equality above shows. A timing claim on top
  // (threshold at tau 0.03, keeping a few percent, cheaper than at 1e-9, keeping all) held on some CPUs and not on
  // others: on a Xeon with AVX-512 the sparse one's compaction cost 1.05x the full copy, every run. Costs are for the
  // benchmarks to show, not a unit test.

  // The codec's key names the data it was timed on: another workload or data is another key; the run's seed (the
  // gradient is taken at kCalibrationSeed's initialization) and the learning rate, which the codec never sees, are not.
  const auto codecKey = [&](const std::string& text) {
    const experiments::Experiment x = experiment(text);
    auto m = workloads::makeWorkload(x.workload().name(), detail::workloadOptions(x), data);
    return planCalibration(x, *m, *instance).codec;
  };
  const std::string base = codecKey(calibratedStudy());
  EXPECT_EQ(base, plan.codec);
  // The study with `from` replaced by `to`.
  const auto edited = [](const std::string& from, const std::string& to) {
    std::string text = calibratedStudy();
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  EXPECT_NE(codecKey(edited("hidden_sizes: [32]", "hidden_sizes: [33]")), base);
  EXPECT_NE(codecKey(edited("train_subset: 960", "train_subset: 480")), base);
  EXPECT_EQ(codecKey(edited("seed: 7", "seed: 8")), base);
  EXPECT_EQ(codecKey(edited("lr: 0.05", "lr: 0.06")), base);
}

// The calibrated study with threshold at tau 0.03 and error feedback: a stateful codec whose cost follows its state.
experiments::Experiment thresholdWithErrorFeedback(PluginLoader& loader) {
  std::string text = calibratedStudy("", "threshold");
  const std::string plain = "name: \"threshold\" }";
  text.replace(text.find(plain), plain.size(), "name: \"threshold\" params { key: \"tau\" value: \"0.03\" } }");
  text.replace(text.find("error_feedback: false"), 21, "error_feedback: true");
  return experiments::loadStudyText(text, "u", runnerConfigOptions(&loader)).experiments.at(0);
}

TEST(CalibratedRun, AStatefulCodecIsTimedAtOneStateWhateverTheBudget) {
  // Threshold with error feedback sends every element whose residual has reached tau, so what its decode costs follows
  // how many encodes ran before it. Timed for as many repetitions as the budget allowed, its decode at 200,704
  // elements cost 0.4 us in one calibration and 92 us in another on one host; on the fixed schedule (calibration.h) a
  // short budget and a long one time it at the same state.
  auto loader = testLoader();
  const auto data = smallData();
  const experiments::Experiment e = thresholdWithErrorFeedback(loader);
  // One calibration from a fresh cache.
  const auto decodeCost = [&](std::chrono::milliseconds budget, const std::string& cache) {
    CalibrationInputs in{e, data, loader, freshDir(cache)};
    in.kernel_budget = budget;
    return calibrate(in).costs->seconds({.kind = rt::CostKind::kDecompress, .size = 784 * 32});
  };
  // No budget: the least repetitions (kMinRepetitions), 6 encodes in all where the budget decided; 60 ms: 200. The
  // least of four calibrations of each, taken in turns (short, long, short, ...), so that a stretch of load from
  // elsewhere slows both alike: three of one after three of the other once came out 1.57x apart on a loaded host.
  double short_budget = INFINITY, long_budget = INFINITY;
  for (int k = 0; k < 4; ++k) {
    short_budget =
        std::min(short_budget, decodeCost(std::chrono::milliseconds(0), "cal_cache_state_short" + std::to_string(k)));
    long_budget =
        std::min(long_budget, decodeCost(std::chrono::milliseconds(60), "cal_cache_state_long" + std::to_string(k)));
  }
  EXPECT_GT(short_budget, 0);
  // Measured on the fixed schedule: within 1.3x of each other; at the state the budget left: 1.9x apart.
  EXPECT_LT(std::max(short_budget, long_budget), 1.5 * std::min(short_budget, long_budget))
      << "decode at 25,088 elements: " << short_budget << " s (no budget), " << long_budget << " s (60 ms)";
}

TEST(CalibratedRun, AStatefulCodecsStateStepsDrawTheGradientsSignSoItsResidualWalks) {
  // Threshold with error feedback sends the elements whose residual reached tau. Fed the same gradient at every state
  // step, the residual grows by it at every step and the codec sends more each time; with the sign drawn per step
  // (runCodecState) it walks, as a run's does, and sends a fraction of that.
  auto loader = testLoader();
  const auto data = smallData();
  const experiments::Experiment e = thresholdWithErrorFeedback(loader);
  const std::map<uint64_t, std::vector<float>> gradients = codecCalibrationGradients(e, data);
  const std::vector<float>& grad = gradients.at(784 * 32);
  // tau at 4x the gradient's mean magnitude: the same gradient crosses it within a few steps wherever it is large.
  double mean = 0;
  for (float g : grad) mean += std::fabs(g) / static_cast<double>(grad.size());
  auto plugin = loader.loadCompressor("threshold");
  const auto instance = plugin->instantiate({{"tau", std::to_string(4 * mean)}});
  TensorInfo info;
  info.dtype = DType::kF32;
  info.numel = grad.size();
  info.ndim = 1;
  info.shape[0] = static_cast<int64_t>(grad.size());
  info.world_size = e.workers();
  const CodecOptions options = experiments::codecOptions(e);
  ASSERT_TRUE(options.error_feedback);
  // The schedule's own steps, twice from a fresh codec: seeded, so the same bytes.
  const std::vector<uint64_t> walked = runCodecState(*makeCodec(instance, info, 1, options), grad);
  ASSERT_EQ(walked.size(), static_cast<std::size_t>(kCodecStateSteps));
  EXPECT_EQ(runCodecState(*makeCodec(instance, info, 1, options), grad), walked);
  // The same gradient at every step.
  auto same = makeCodec(instance, info, 1, options);
  std::vector<std::byte> payload(same->sizes(0).max_output_bytes);
  std::vector<float> out(grad.size());
  uint64_t straight = 0;
  for (int s = 0; s < kCodecStateSteps; ++s) {
    straight = same->encode(0, 0, grad.data(), {}, payload);
    same->decode(0, std::span<const std::byte>(payload).first(straight), -1, out.data(), true);
  }
  // Measured: the last step sends 13,296 bytes walked against 55,584 straight.
  EXPECT_LT(2 * walked.back(), straight) << walked.back() << " bytes walked, " << straight << " straight";
}

TEST(CalibratedRun, SizesBetweenTheMeasuredOnesAreInterpolated) {
  CalibrationPlan plan;
  plan.workload = "w#0";
  plan.batch = 10;
  plan.layers = {{1, 2}};
  plan.codec = "c#0";
  plan.optimizer = "o#0";
  plan.sizes = {100, 1000};
  CalibrationTable t;
  for (const std::string& k : plan.keys()) t.seconds[k] = 1;
  t.seconds["compress c#0 r0 n100"] = 1e-6;
  t.seconds["compress c#0 r0 n1000"] = 4e-6;
  t.seconds["forward w#0 L0 b10"] = 3e-3;
  const auto costs = makeCostTable(plan, t);
  const auto compress = [&](double n) { return costs->seconds({.kind = rt::CostKind::kCompress, .size = n}); };
  EXPECT_DOUBLE_EQ(compress(100), 1e-6);
  EXPECT_DOUBLE_EQ(compress(550), 2.5e-6);  // halfway
  EXPECT_DOUBLE_EQ(compress(50), 0.5e-6);   // in proportion below the smallest
  EXPECT_DOUBLE_EQ(compress(2000), 8e-6);   // and above the largest
  EXPECT_EQ(compress(0), 0);
  // A forward of 5 examples is half the batch of 10's.
  EXPECT_DOUBLE_EQ(costs->seconds({.kind = rt::CostKind::kForward, .layer = 0, .size = 5}), 1.5e-3);
  EXPECT_EQ(costs->seconds({}), 0);
  // A table without one of the plan's keys cannot be made into costs.
  t.seconds.erase("compress c#0 r0 n100");
  EXPECT_THROW(makeCostTable(plan, t), InternalError);
}

// A parameter server's pull compressor has curves of its own: a pull codec is priced by what it costs, not by the run's
// compressor's times at the same size.
TEST(CalibratedRun, APullCodecIsPricedFromCurvesOfItsOwn) {
  CalibrationPlan plan;
  plan.workload = "w#0";
  plan.batch = 10;
  plan.layers = {{1, 2}};
  plan.codec = "c#0";
  plan.pull_codec = "p#0";
  plan.optimizer = "o#0";
  plan.sizes = {100, 1000};
  CalibrationTable t;
  for (const std::string& k : plan.keys()) t.seconds[k] = 1;
  EXPECT_TRUE(t.seconds.count("compress p#0 r0 n1000") && t.seconds.count("decompress p#0 n100"));
  t.seconds["compress c#0 r0 n100"] = 1e-6;
  t.seconds["compress p#0 r0 n100"] = 5e-6;
  t.seconds["decompress c#0 n100"] = 2e-6;
  t.seconds["decompress p#0 n100"] = 7e-6;
  const auto costs = makeCostTable(plan, t);
  const auto cost = [&](rt::CostKind kind, int codec) {
    return costs->seconds({.kind = kind, .size = 100, .codec = codec});
  };
  EXPECT_DOUBLE_EQ(cost(rt::CostKind::kCompress, rt::kRunCodec), 1e-6);
  EXPECT_DOUBLE_EQ(cost(rt::CostKind::kCompress, rt::kPullCodec), 5e-6);
  EXPECT_DOUBLE_EQ(cost(rt::CostKind::kDecompress, rt::kRunCodec), 2e-6);
  EXPECT_DOUBLE_EQ(cost(rt::CostKind::kDecompress, rt::kPullCodec), 7e-6);
  t.seconds.erase("decompress p#0 n1000");
  EXPECT_THROW(makeCostTable(plan, t), InternalError);
}

// The dense warm-up's codec (compression_start_step) likewise: its steps are charged what `none` costs.
TEST(CalibratedRun, ADenseWarmupIsPricedFromCurvesOfItsOwn) {
  CalibrationPlan plan;
  plan.workload = "w#0";
  plan.batch = 10;
  plan.layers = {{1, 2}};
  plan.codec = "c#0";
  plan.dense_codec = "none#0";
  plan.optimizer = "o#0";
  plan.sizes = {100};
  CalibrationTable t;
  for (const std::string& k : plan.keys()) t.seconds[k] = 1;
  t.seconds["compress c#0 r0 n100"] = 1e-6;
  t.seconds["compress none#0 r0 n100"] = 3e-6;
  t.seconds["decompress c#0 n100"] = 2e-6;
  t.seconds["decompress none#0 n100"] = 9e-6;
  const auto costs = makeCostTable(plan, t);
  const auto cost = [&](rt::CostKind kind, int codec) {
    return costs->seconds({.kind = kind, .size = 100, .codec = codec});
  };
  EXPECT_DOUBLE_EQ(cost(rt::CostKind::kCompress, rt::kRunCodec), 1e-6);
  EXPECT_DOUBLE_EQ(cost(rt::CostKind::kCompress, rt::kDenseCodec), 3e-6);
  EXPECT_DOUBLE_EQ(cost(rt::CostKind::kDecompress, rt::kRunCodec), 2e-6);
  EXPECT_DOUBLE_EQ(cost(rt::CostKind::kDecompress, rt::kDenseCodec), 9e-6);
  t.seconds.erase("decompress none#0 n100");
  EXPECT_THROW(makeCostTable(plan, t), InternalError);
}

// End to end: a simulated parameter-server run with top-k pushes and top-k pulls calibrates the pull codec under a key
// of its own (the same compressor, without the run's error feedback) and charges it.
TEST(CalibratedRun, ACompressedPullRunCalibratesItsPullCodec) {
  auto loader = testLoader();
  const fs::path root = freshDir("calibrated_pull");
  const std::string pull =
      "mode: ASYNC\nparameter_server { pull_compressor { name: \"topk\" params { key: \"ratio\" value: "
      "\"0.01\" } } }\n";
  const Ran r = runCalibrated(loader, calibratedStudy(pull), root);
  const std::string table = readFile(r.dir / "calibration.json");
  std::vector<std::string> subjects;
  for (std::size_t at = table.find("\"compress topk#"); at != std::string::npos;
       at = table.find("\"compress topk#", at + 1)) {
    const std::string key = table.substr(at + 1, table.find(' ', table.find('#', at)) - at - 1);
    if (std::find(subjects.begin(), subjects.end(), key) == subjects.end()) subjects.push_back(key);
  }
  EXPECT_EQ(subjects.size(), 2u) << ::testing::PrintToString(subjects);
  const auto metrics = readMetrics(r.dir);
  ASSERT_FALSE(metrics.empty());
  const Json& last = metrics.back();
  EXPECT_GT(getNumber(last, "pull_payload_bytes_per_worker").value_or(0), 0);

  // The workers' decodes are charged from the pull codec's curve: one shard, so every tensor is a piece, at a size the
  // table holds, and each worker's pulls but its first decode every piece once. N worker steps of W workers:
  // decompress_s_per_step = (N - W) / N x the sum of the pull codec's decompress times.
  const experiments::Experiment e =
      experiments::loadStudyText(calibratedStudy(pull), "u", runnerConfigOptions(&loader)).experiments.at(0);
  auto model = workloads::makeWorkload(e.workload().name(), detail::workloadOptions(e), smallData());
  auto instance = loader.loadCompressor("topk")->instantiate(experiments::pluginParams(e.compressor()));
  const CalibrationPlan plan = planCalibration(e, *model, *instance);
  ASSERT_FALSE(plan.pull_codec.empty());
  EXPECT_NE(plan.pull_codec, plan.codec);
  const CalibrationTable t = CalibrationTable::load(r.dir / "calibration.json");
  double per_pull = 0;
  for (const auto& p : model->params())
    per_pull += t.seconds.at("decompress " + plan.pull_codec + " n" + std::to_string(p.numel()));
  const double W = e.workers(), N = getNumber(last, "step").value_or(0) * W;
  ASSERT_GT(N, W);
  EXPECT_NEAR(getNumber(last, "decompress_s_per_step").value_or(0), (N - W) / N * per_pull, 1e-6 * per_pull);
}

// The same with a pull compressor of phases (dgc's warm-up over steps 0-3, two stages): each phase of the pull codec is
// calibrated at its first step under a key of its own, and each worker's decode of a pull of step s is charged the
// phase of s (terse/phases_v1.h).
TEST(CalibratedRun, APhasedPullCodecIsChargedEachPullsOwnPhase) {
  auto loader = testLoader();
  const std::string pull =
      "mode: SSP\nstaleness_bound: 0\nparameter_server { pull_compressor { name: \"dgc\" params { key: \"ratio\" "
      "value: \"0.01\" } "
      "params { key: \"warmup_steps\" value: \"4\" } params { key: \"warmup_stages\" value: \"2\" } } }\n";
  const Ran r = runCalibrated(loader, calibratedStudy(pull), freshDir("calibrated_pull_phases"));
  const experiments::Experiment e =
      experiments::loadStudyText(calibratedStudy(pull), "u", runnerConfigOptions(&loader)).experiments.at(0);
  auto model = workloads::makeWorkload(e.workload().name(), detail::workloadOptions(e), smallData());
  auto instance = loader.loadCompressor("topk")->instantiate(experiments::pluginParams(e.compressor()));
  auto pull_instance =
      loader.loadCompressor("dgc")->instantiate(experiments::pluginParams(e.parameter_server().pull_compressor()));
  const CalibrationPlan plan = planCalibration(e, *model, *instance, pull_instance.get());
  ASSERT_EQ(plan.pull_codec_phases, (std::vector<uint64_t>{2, 4}));
  EXPECT_TRUE(planCalibration(e, *model, *instance).pull_codec_phases.empty());
  const CalibrationTable t = CalibrationTable::load(r.dir / "calibration.json");
  std::vector<double> per_pull(3);
  for (int ph = 0; ph < 3; ++ph)
    for (const auto& p : model->params())
      per_pull[ph] += t.seconds.at("decompress " + plan.pullPhaseSubject(ph) + " n" + std::to_string(p.numel()));
  ASSERT_NE(per_pull[0], per_pull[2]);
  // Each worker decodes the pulls of its steps 1 .. S-1 (the first pull is the initial model), S = N / W apiece: SSP
  // with bound 0 keeps the workers in lockstep, so each makes the same S steps.
  const auto metrics = readMetrics(r.dir);
  ASSERT_FALSE(metrics.empty());
  const double W = e.workers(), N = getNumber(metrics.back(), "step").value_or(0) * W;
  const auto S = static_cast<int>(N / W);
  ASSERT_GT(S, 5);
  double want = 0;
  for (int s = 1; s < S; ++s) want += W * per_pull[s < 2 ? 0 : s < 4 ? 1 : 2];
  EXPECT_NEAR(getNumber(metrics.back(), "decompress_s_per_step").value_or(0) * N, want, 1e-6 * want);
}

// End to end: a simulated run with a dense warm-up calibrates `none` under a key of its own and charges it for the
// steps before compression_start_step, the run's top-k after them.
TEST(CalibratedRun, ADenseWarmupChargesTheDenseCodecUntilItsStartStep) {
  auto loader = testLoader();
  const std::string warm = "compression_start_step: 4\n";
  const Ran r = runCalibrated(loader, calibratedStudy(warm), freshDir("calibrated_warmup"));
  const experiments::Experiment e =
      experiments::loadStudyText(calibratedStudy(warm), "u", runnerConfigOptions(&loader)).experiments.at(0);
  auto model = workloads::makeWorkload(e.workload().name(), detail::workloadOptions(e), smallData());
  auto instance = loader.loadCompressor("topk")->instantiate(experiments::pluginParams(e.compressor()));
  const CalibrationPlan plan = planCalibration(e, *model, *instance);
  ASSERT_EQ(plan.dense_codec.rfind("none#", 0), 0u) << plan.dense_codec;
  // The key a run of compressor none on the same model and data has: the two share one time.
  const experiments::Experiment none_run =
      experiments::loadStudyText(calibratedStudy("", "none"), "u", runnerConfigOptions(&loader)).experiments.at(0);
  EXPECT_EQ(plan.dense_codec, planCalibration(none_run, *model, *loader.loadCompressor("none")->instantiate({})).codec);
  const CalibrationTable t = CalibrationTable::load(r.dir / "calibration.json");
  double dense = 0, topk = 0;  // one step's compress: every tensor once
  for (const auto& p : model->params()) {
    dense += t.seconds.at("compress " + plan.dense_codec + " r0 n" + std::to_string(p.numel()));
    topk += t.seconds.at("compress " + plan.codec + " r0 n" + std::to_string(p.numel()));
  }
  ASSERT_NE(dense, topk);
  // compress_s_per_step is the run's mean so far. At step 4 that is the 4 dense steps' (within 5%: a record counts
  // what finished by then). At the end, drained, the run without the warm-up's total less 4 steps of top-k plus 4 of
  // `none`.
  const auto metrics = readMetrics(r.dir);
  ASSERT_GE(metrics.size(), 2u);
  EXPECT_EQ(getNumber(metrics[0], "step"), 4);
  EXPECT_NEAR(getNumber(metrics[0], "compress_s_per_step").value_or(0), dense, 0.05 * dense);
  const auto plain = readMetrics(runCalibrated(loader, calibratedStudy(), freshDir("calibrated_no_warmup")).dir);
  const double n = getNumber(metrics.back(), "step").value_or(0);
  ASSERT_EQ(getNumber(plain.back(), "step"), n);
  const double total = n * getNumber(metrics.back(), "compress_s_per_step").value_or(0);
  const double want = n * getNumber(plain.back(), "compress_s_per_step").value_or(0) - 4 * topk + 4 * dense;
  EXPECT_NEAR(total, want, 1e-6 * want);
  // Without a warm-up the plan, and so every key a table held before the field, is as it was.
  EXPECT_TRUE(planCalibration(
                  experiments::loadStudyText(calibratedStudy(), "u", runnerConfigOptions(&loader)).experiments.at(0),
                  *model, *instance)
                  .dense_codec.empty());
}

// terse/phases_v1.h: a compressor of several phases (dgc's warm-up, two stages over steps 0-5) is timed at the first
// step of each under keys of their own, and each step is charged its own phase's times: the run's compress and
// decompress seconds are each phase's steps at that phase's time (without phases every step paid step 0's, the
// densest stage's). A compressor of one phase keeps the keys it had.
TEST(CalibratedRun, APhasedCodecIsChargedEachStepsOwnPhase) {
  auto loader = testLoader();
  const std::string text =
      "study: \"unit\"\n"
      "workload { name: \"mlp\" hidden_sizes: [32] }\n"
      "data { batch_size: 32 train_subset: 960 test_subset: 100 }\n"
      "optimizer { lr: 0.05 momentum: 0.9 }\n"
      "compressor { name: \"dgc\" params { key: \"ratio\" value: \"0.01\" }\n"
      "  params { key: \"warmup_steps\" value: \"6\" } params { key: \"warmup_stages\" value: \"2\" } }\n"
      "error_feedback: true\n"
      "workers: 3\n"
      "epochs: 1\n"
      "eval { every_steps: 1 }\n"
      "seed: 7\n"
      "clock: SIMULATED\n";
  const Ran r = runCalibrated(loader, text, freshDir("calibrated_phases"));
  const experiments::Experiment e =
      experiments::loadStudyText(text, "u", runnerConfigOptions(&loader)).experiments.at(0);
  auto model = workloads::makeWorkload(e.workload().name(), detail::workloadOptions(e), smallData());
  auto instance = loader.loadCompressor("dgc")->instantiate(experiments::pluginParams(e.compressor()));
  const CalibrationPlan plan = planCalibration(e, *model, *instance);
  ASSERT_EQ(plan.codec_phases, (std::vector<uint64_t>{3, 6}));
  ASSERT_EQ(plan.phaseSubject(2), plan.codec + " @6");
  const CalibrationTable t = CalibrationTable::load(r.dir / "calibration.json");
  std::vector<double> compress(3), decompress(3);  // one step of each phase: every tensor once
  for (int ph = 0; ph < 3; ++ph) {
    for (const auto& p : model->params()) {
      const std::string n = " n" + std::to_string(p.numel());
      compress[ph] += t.seconds.at("compress " + plan.phaseSubject(ph) + " r0" + n);
      decompress[ph] += t.seconds.at("decompress " + plan.phaseSubject(ph) + n);
    }
  }
  ASSERT_NE(compress[0], compress[2]);  // else the sums below could not tell the phases apart
  ASSERT_NE(decompress[0], decompress[2]);
  // Each step's charge, from the records of every step (compress_s_per_step is the mean so far). Encode also pays
  // error feedback's pass over the residual (an accumulate kernel), the same every step: so the steps of a phase
  // cost the same, and two phases differ by exactly their codecs' difference.
  const auto metrics = readMetrics(r.dir);
  ASSERT_EQ(metrics.size(), 10u);  // 960 examples, 3 workers of 32: 10 steps
  std::vector<double> step_c, step_d;
  double before_c = 0, before_d = 0;
  for (const auto& m : metrics) {
    const double k = getNumber(m, "step").value_or(0);
    const double c = k * getNumber(m, "compress_s_per_step").value_or(0);
    const double d = k * getNumber(m, "decompress_s_per_step").value_or(0);
    step_c.push_back(c - before_c);
    step_d.push_back(d - before_d);
    before_c = c;
    before_d = d;
  }
  const double tol = 1e-9;
  EXPECT_NEAR(step_c[1], step_c[2], tol);  // phase 0 (the first step's record may hold a set-up charge: not compared)
  EXPECT_NEAR(step_c[3], step_c[5], tol);  // phase 1: steps 3-5
  EXPECT_NEAR(step_c[6], step_c[9], tol);  // phase 2: steps 6-9
  EXPECT_NEAR(step_c[2] - step_c[3], compress[0] - compress[1], tol);
  EXPECT_NEAR(step_c[5] - step_c[6], compress[1] - compress[2], tol);
  // Decode has no such pass: each step is its phase's decodes, one per rank's payload (3).
  for (std::size_t k = 0; k < step_d.size(); ++k)
    EXPECT_NEAR(step_d[k], 3 * decompress[k < 3 ? 0 : k < 6 ? 1 : 2], tol) << "step " << k;
  // The run's table replays (simulation.calibration): its phase keys are all there, and the records come back the same.
  const Ran again =
      runCalibrated(loader, text + "simulation { calibration: \"" + (r.dir / "calibration.json").string() + "\" }\n",
                    freshDir("calibrated_phases_replay"));
  EXPECT_EQ(again.metrics, r.metrics);
  // Without a warm-up: one phase, and the keys any table held before phases.
  auto plain = loader.loadCompressor("dgc")->instantiate({{"ratio", "0.01"}});
  const CalibrationPlan one = planCalibration(e, *model, *plain);
  EXPECT_TRUE(one.codec_phases.empty());
  EXPECT_EQ(one.phaseSubject(0), one.codec);
  for (const std::string& k : one.keys()) EXPECT_EQ(k.find(" @"), std::string::npos) << k;
}

TEST(CalibratedRun, CodecsAreTimedInAChildWhoseFailuresComeBackNamed) {
  const pid_t parent = ::getpid();
  // The child is a process of its own, and its times come back bit for bit, keys with spaces and all.
  const auto got = timeInChild("test", [&] {
    return std::map<std::string, double>{
        {"own process", ::getpid() != parent ? 1.0 : 0.0}, {"compress topk#1 r0 n7", 1e-9 * 3}, {"k", 0.1}};
  });
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(got.at("own process"), 1.0);
  EXPECT_EQ(got.at("compress topk#1 r0 n7"), 1e-9 * 3);
  EXPECT_EQ(got.at("k"), 0.1);
  // A child's terse error comes back as its kind, with its message and status.
  try {
    timeInChild("test", []() -> std::map<std::string, double> {
      throw PluginError("compressor 'x': compress failed", TERSE_ERR_INVALID_PAYLOAD);
    });
    ADD_FAILURE() << "a child's error was not rethrown";
  } catch (const PluginError& e) {
    EXPECT_STREQ(e.what(), "compressor 'x': compress failed");
    EXPECT_EQ(e.status(), TERSE_ERR_INVALID_PAYLOAD);
  }
  EXPECT_THROW(timeInChild("test", []() -> std::map<std::string, double> { throw InvalidArgument("bad"); }),
               InvalidArgument);
  // A child that crashes takes only itself down: the error names what it was timing and how it ended.
  try {
    timeInChild("calibration: timing codec 'x#1'", []() -> std::map<std::string, double> {
      std::raise(SIGSEGV);
      return {};
    });
    ADD_FAILURE() << "a crashed child was not reported";
  } catch (const PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("calibration: timing codec 'x#1': its process died of SIGSEGV"),
              std::string::npos)
        << e.what();
  }
}

TEST(CalibratedRun, ACustomCodecIsTimedDecodingTheWorldsAggregateAsItsRunDoes) {
  // bad_custom (mode ok): an identity codec whose CUSTOM reduce sums. A run folds the world's payloads and decodes
  // the aggregate, the sum; decoding one rank's payload (what calibration timed before: signSGD's bit where the run
  // decodes a count, at a fifth of the cost) would give the gradient itself.
  auto loader = PluginLoader::withSearchDirs({{TERSE_TEST_FIXTURE_PLUGIN_DIR, "fixtures", true}});
  const auto instance =
      loader.loadCompressor(std::string(TERSE_TEST_FIXTURE_PLUGIN_DIR) + "/terse_compressor_bad_custom.so")
          ->instantiate({{"mode", "ok"}});
  const std::vector<float> grad = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f};
  for (const int world : {1, 2, 4}) {
    TensorInfo info;
    info.dtype = DType::kF32;
    info.numel = grad.size();
    info.ndim = 1;
    info.shape[0] = static_cast<int64_t>(grad.size());
    info.world_size = world;
    const std::vector<float> out = calibrationStepOutput(*makeCodec(instance, info, 1, {}), grad);
    for (std::size_t i = 0; i < grad.size(); ++i) EXPECT_EQ(out[i], grad[i] * static_cast<float>(world)) << world;
  }
  // Its cost follows the world, so its key names it; a codec that sums or gathers keeps one key for every world.
  auto plugins = testLoader();
  const auto data = smallData();
  const auto codecKey = [&](const std::string& compressor, int workers) {
    std::string text = calibratedStudy("", compressor);
    const std::string three = "workers: 3";
    text.replace(text.find(three), three.size(), "workers: " + std::to_string(workers));
    const experiments::Experiment e =
        experiments::loadStudyText(text, "u", runnerConfigOptions(&plugins)).experiments.at(0);
    auto model = workloads::makeWorkload(e.workload().name(), detail::workloadOptions(e), data);
    return planCalibration(e, *model, *plugins.loadCompressor(compressor)->instantiate({})).codec;
  };
  EXPECT_NE(codecKey("signsgd", 4), codecKey("signsgd", 2));
  EXPECT_EQ(codecKey("topk", 4), codecKey("topk", 2));
}

}  // namespace
}  // namespace terse::runner
