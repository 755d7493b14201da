// The calibrated compute model's table: its keys, its file, the measurements and the run's lookup (calibration.h).
#include "experiments/runner/calibration.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>

#include "core/comm/reduce.h"
#include "core/common/error.h"
#include "core/common/json.h"
#include "core/common/log.h"
#include "core/common/subprocess.h"
#include "core/compress/make_codec.h"
#include "core/plugin/loader.h"
#include "core/train/optimizer.h"
#include "experiments/runner/async_detail.h"
#include "experiments/runner/runner_detail.h"
#include "experiments/workloads/workloads.h"
#include "results/build_commit.h"
#include "results/result_writer.h"
#include "results/sha256.h"

namespace terse::runner {
namespace {

constexpr std::string_view kFormat = "terse calibration 1";
// The flags compilers and kernel libraries dispatch on: two CPUs that differ in them run different code.
constexpr std::string_view kKernelFlags[] = {"sse4_2",   "avx",      "avx2",     "fma",         "f16c",
                                             "avx512f",  "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16",
                                             "amx_bf16", "amx_tile", "avx_vnni", "avx512_vnni"};
constexpr std::string_view kSumDtypes[] = {"f32", "f16", "bf16"};

std::string shortHash(std::string_view text) {
  return results::sha256Hex(text).substr(0, 12);
}

std::string sizeKey(std::string_view kind, std::string_view subject, uint64_t n) {
  std::string key(kind);
  key += ' ';
  if (!subject.empty()) {
    key += subject;
    key += ' ';
  }
  return key + "n" + std::to_string(n);
}

bool isCodecKey(std::string_view key) {
  return key.starts_with("compress ") || key.starts_with("decompress ") || key.starts_with("reduce ");
}

std::string layerKey(std::string_view kind, const CalibrationPlan& plan, int layer) {
  return std::string(kind) + " " + plan.workload + " L" + std::to_string(layer) + " b" + std::to_string(plan.batch);
}

std::string roundSubject(const std::string& codec, int round) {
  return codec + " r" + std::to_string(round);
}

DType sumDtype(std::string_view name) {
  if (name == "f16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  return DType::kF32;
}

std::string_view sumDtypeName(int dtype) {
  if (dtype == static_cast<int>(DType::kF16)) return "f16";
  if (dtype == static_cast<int>(DType::kBF16)) return "bf16";
  return "f32";
}

// Seconds of one call, as the header says: the least thread CPU time over the repetitions. `prepare` runs untimed
// before each (a multi-round codec's earlier rounds).
// `repetitions` > 0: exactly that many, without the warm call (a stateful codec's fixed schedule, calibration.h).
double timeKernel(std::chrono::milliseconds kernel_budget, const std::function<void()>& fn,
                  const std::function<void()>& prepare = {}, int repetitions = 0) {
  if (repetitions <= 0) {
    if (prepare) prepare();
    fn();  // warm: first-touch page faults and lazily grown buffers are not the kernel's steady cost
  }
  double best = INFINITY;
  const double start = sim::threadCpuSeconds();
  const double budget = std::chrono::duration<double>(kernel_budget).count();
  for (int rep = 0; rep < (repetitions > 0 ? repetitions : kMaxRepetitions); ++rep) {
    if (prepare) prepare();
    const double t0 = sim::threadCpuSeconds();
    fn();
    best = std::min(best, sim::threadCpuSeconds() - t0);
    if (repetitions <= 0 && rep + 1 >= kMinRepetitions && sim::threadCpuSeconds() - start > budget) break;
  }
  return std::max(best, 0.0);
}

// Bytes of the caches a core's loads go through (each level's size from sysfs, the shared last level whole); 32 MiB
// where sysfs does not say. sysconf's LEVEL3_CACHE_SIZE is the host's in a virtual machine (256 MiB where the guest's
// is 32), so it is not asked.
uint64_t cacheBytes() {
  uint64_t total = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream type(dir + "type"), size(dir + "size");
    std::string t, sz;
    if (!(type >> t) || !(size >> sz) || t == "Instruction" || sz.empty()) continue;
    uint64_t v = std::strtoull(sz.c_str(), nullptr, 10);
    if (sz.back() == 'K') v <<= 10;
    if (sz.back() == 'M') v <<= 20;
    total += v;
  }
  return total != 0 ? std::min<uint64_t>(total, uint64_t{512} << 20) : uint64_t{32} << 20;
}

// Evicts what the caches hold by reading 1.25x their size, a load per cache line: a codec in a run meets its gradient,
// its state (a residual, a momentum) and its payload after other work went through the caches -- in a simulation
// every rank's step runs on this host's caches, and a model of real size does not fit them. Timed warm, the minimum
// priced the memory-bound codecs (a cast, a copy, a residual's pass) at a third of what a run measures and ranked the
// zoo's codecs at Spearman 0.79-0.86 against MEASURED compute (which agrees with itself at 0.95-0.96); timed after
// this, 0.89-0.94 (results/reference/simulation/codec_ranking.md). Reads, not writes: dirty lines would be written
// back inside the timed kernel. The buffer stays for the process (40 MiB on a 32 MiB last level).
void evictCaches() {
  static const std::vector<uint64_t> lines((cacheBytes() + cacheBytes() / 4) / sizeof(uint64_t), 1);
  uint64_t sum = 0;
  for (std::size_t i = 0; i < lines.size(); i += 64 / sizeof(uint64_t)) sum += lines[i];
  volatile uint64_t sink = sum;
  (void)sink;
}

std::vector<float> gaussian(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// One entry per size: seconds(n) by linear interpolation between the measured sizes around n, in proportion beyond.
class SizeCurve {
 public:
  SizeCurve() = default;
  SizeCurve(const std::vector<uint64_t>& sizes, const std::vector<double>& seconds) {
    for (std::size_t i = 0; i < sizes.size(); ++i) points_.emplace_back(static_cast<double>(sizes[i]), seconds[i]);
  }
  double at(double n) const noexcept {
    if (points_.empty() || !(n > 0)) return 0.0;
    if (n <= points_.front().first) return points_.front().second * n / points_.front().first;
    if (n >= points_.back().first) return points_.back().second * n / points_.back().first;
    const auto hi = std::lower_bound(points_.begin(), points_.end(), n,
                                     [](const std::pair<double, double>& p, double x) { return p.first < x; });
    const auto lo = hi - 1;
    const double f = (n - lo->first) / (hi->first - lo->first);
    return lo->second + f * (hi->second - lo->second);
  }

 private:
  std::vector<std::pair<double, double>> points_;
};

// The run's view of a table: every key resolved up front, so a lookup inside a simulation cannot fail (it runs in a
// kernel region's destructor).
class RunCosts final : public sim::CostTable {
 public:
  RunCosts(const CalibrationPlan& plan, const runner::CalibrationTable& table) : batch_(plan.batch) {
    const auto get = [&](const std::string& key) {
      const auto it = table.seconds.find(key);
      TERSE_CHECK(it != table.seconds.end(), InternalError, "the calibration table lacks kernel '" << key << "'");
      return it->second;
    };
    for (int l = 0; l < static_cast<int>(plan.layers.size()); ++l) {
      forward_.push_back(get(layerKey("forward", plan, l)));
      backward_.push_back(get(layerKey("backward", plan, l)));
    }
    const auto curve = [&](std::string_view kind, std::string_view subject) {
      std::vector<double> s;
      for (uint64_t n : plan.sizes) s.push_back(get(sizeKey(kind, subject, n)));
      return SizeCurve(plan.sizes, s);
    };
    // A sums-only plan (a collective benchmark's) charges nothing else: its other curves stay empty (0 s).
    if (!plan.sums_only) {
      for (int ph = 0; ph < plan.phases(); ++ph) {
        const std::string subject = plan.phaseSubject(ph);
        compress_.emplace_back();
        for (int r = 0; r < plan.rounds; ++r) compress_.back().push_back(curve("compress", roundSubject(subject, r)));
        decompress_.push_back(curve("decompress", subject));
        reduce_.push_back(plan.reduce ? curve("reduce", subject) : SizeCurve());
      }
      optimizer_ = curve("optimizer", plan.optimizer);
      accumulate_ = curve("accumulate", "");
      for (int ph = 0; ph < plan.pullPhases() && !plan.pull_codec.empty(); ++ph) {
        pull_compress_.push_back(curve("compress", roundSubject(plan.pullPhaseSubject(ph), 0)));
        pull_decompress_.push_back(curve("decompress", plan.pullPhaseSubject(ph)));
      }
      if (!plan.dense_codec.empty()) {
        dense_compress_ = curve("compress", roundSubject(plan.dense_codec, 0));
        dense_decompress_ = curve("decompress", plan.dense_codec);
      }
    }
    for (std::string_view d : kSumDtypes)
      sum_.push_back(std::find(plan.sum_dtypes.begin(), plan.sum_dtypes.end(), d) != plan.sum_dtypes.end()
                         ? curve("sum", d)
                         : SizeCurve());
    description_ = std::to_string(table.seconds.size()) + " kernels on " + table.identity.describe();
  }

  double seconds(const rt::Cost& c) const override {
    const double count = c.count > 0 ? c.count : 0.0;
    switch (c.kind) {
      case rt::CostKind::kNone:
        return 0.0;
      case rt::CostKind::kForward:
      case rt::CostKind::kBackward: {
        const auto& v = c.kind == rt::CostKind::kForward ? forward_ : backward_;
        if (c.layer < 0 || static_cast<std::size_t>(c.layer) >= v.size() || batch_ <= 0) return 0.0;
        return v[static_cast<std::size_t>(c.layer)] * c.size / static_cast<double>(batch_) * count;
      }
      case rt::CostKind::kCompress: {
        if (c.codec == rt::kPullCodec)
          return pull_compress_.empty() ? 0.0 : pull_compress_[pullPhase(c)].at(c.size) * count;
        if (c.codec == rt::kDenseCodec) return dense_compress_.at(c.size) * count;
        if (compress_.empty()) return 0.0;
        const std::vector<SizeCurve>& rounds = compress_[phase(c)];
        if (rounds.empty()) return 0.0;
        const auto r = static_cast<std::size_t>(std::clamp(c.layer, 0, static_cast<int>(rounds.size()) - 1));
        return rounds[r].at(c.size) * count;
      }
      case rt::CostKind::kDecompress:
        if (c.codec == rt::kPullCodec)
          return pull_decompress_.empty() ? 0.0 : pull_decompress_[pullPhase(c)].at(c.size) * count;
        if (c.codec == rt::kDenseCodec) return dense_decompress_.at(c.size) * count;
        return decompress_.empty() ? 0.0 : decompress_[phase(c)].at(c.size) * count;
      case rt::CostKind::kReduce:
        return reduce_.empty() ? 0.0 : reduce_[phase(c)].at(c.size) * count;
      case rt::CostKind::kSum: {
        const std::string_view d = sumDtypeName(c.dtype);
        for (std::size_t i = 0; i < std::size(kSumDtypes); ++i)
          if (kSumDtypes[i] == d) return sum_[i].at(c.size) * count;
        return 0.0;
      }
      case rt::CostKind::kOptimizer:
        return optimizer_.at(c.size) * count;
      case rt::CostKind::kAccumulate:
        return accumulate_.at(c.size) * count;
    }
    return 0.0;
  }
  std::string describe() const override { return description_; }

 private:
  int64_t batch_;
  std::vector<double> forward_, backward_;
  // The phase a run codec's call is charged as, clamped to the phases calibrated (terse/phases_v1.h).
  // A call's phase among `curves`' entries (one per phase, not empty), clamped to those calibrated.
  static std::size_t phaseIn(const rt::Cost& c, const std::vector<SizeCurve>& curves) {
    return static_cast<std::size_t>(std::clamp(c.phase, 0, static_cast<int>(curves.size()) - 1));
  }
  std::size_t phase(const rt::Cost& c) const { return phaseIn(c, decompress_); }

  // The run codec's curves, one entry per phase (CalibrationPlan::phases): compress_[phase][round].
  std::vector<std::vector<SizeCurve>> compress_;
  std::vector<SizeCurve> decompress_, reduce_;
  SizeCurve optimizer_, accumulate_;
  std::size_t pullPhase(const rt::Cost& c) const { return phaseIn(c, pull_decompress_); }
  // A parameter server's pull compressor, one entry per phase (empty: none, 0 s).
  std::vector<SizeCurve> pull_compress_, pull_decompress_;
  SizeCurve dense_compress_, dense_decompress_;  // the dense warm-up's codec (empty: none, 0 s)
  std::vector<SizeCurve> sum_;
  std::string description_;
};

// The run's workload at kCalibrationSeed's initialization, whatever the run's seed: a seed changes the gradient's
// values, not what a pass or a codec costs, and one input per workload lets every seed of a study share one timing (its
// ± then measures training, not the calibration's noise). makeWorkload builds the host version (a CUDA workload runs
// only under NCCL, never on the simulated clock).
std::unique_ptr<train::Workload> calibrationReplica(const experiments::Experiment& e,
                                                    std::shared_ptr<const workloads::DataSplit> data) {
  workloads::WorkloadOptions options = detail::workloadOptions(e);
  options.seed = kCalibrationSeed;
  return workloads::makeWorkload(e.workload().name(), options, std::move(data));
}

// The first batch_size examples of the model's training data (all of them when there are fewer).
std::vector<int64_t> firstBatch(const train::Workload& model, int64_t batch_size) {
  std::vector<int64_t> batch(
      static_cast<std::size_t>(std::max<int64_t>(std::min<int64_t>(batch_size, model.numTrainExamples()), 0)));
  std::iota(batch.begin(), batch.end(), 0);
  return batch;
}

// The model's gradient per tensor size, after a pass; where two tensors share a size, the first in the model's order.
std::map<uint64_t, std::vector<float>> gradientsBySize(train::Workload& model) {
  std::map<uint64_t, std::vector<float>> out;
  for (const train::ParamTensor& t : model.params()) {
    if (t.numel() == 0 || out.count(t.numel())) continue;
    TERSE_CHECK(t.grad.size() == t.numel(), InternalError,
                "calibration: tensor '" << t.name << "' has " << t.grad.size() << " gradient elements on the host, "
                                        << t.numel() << " values");
    out.emplace(t.numel(), t.grad);
  }
  return out;
}

// One rank's step of a codec on its own: every round in order (a round's prev is the round before's payload: one rank's
// aggregate), then the decode, as a run's step decodes: a SUM codec's payload as the aggregate (source -1), an
// allgather codec's as one rank's payload accumulated onto the output, and a CUSTOM codec's (signSGD's majority vote)
// aggregate of the world's payloads, folded by its reduce (fold(), untimed), as the aggregate (source -1). A run
// decodes that aggregate, not a rank's payload: signSGD's is a count per element where the payload is a bit, and
// decoding the payload priced its decode at a fifth (77 against 352 us at 200,704 elements). One step throughout: 0,
// or the first step of the compressor's phase being timed (terse/phases_v1.h), never a run's sequence of steps: a
// plugin's behaviour at a given step (a fixture failing at step 12) is the run's to see. The state steps
// (runCodecState) and the timed repetitions (Measurer::measureCodec) both run it.
class CodecStep {
 public:
  CodecStep(TensorCodec& codec, uint64_t n, uint64_t step = 0)
      : codec_(codec),
        step_(step),
        rounds_(codec.caps().num_rounds),
        payload_(static_cast<std::size_t>(rounds_)),
        bytes_(static_cast<std::size_t>(rounds_)),
        out_(n),
        aggregation_(codec.caps().aggregation) {
    for (int r = 0; r < rounds_; ++r) payload_[static_cast<std::size_t>(r)].resize(codec.sizes(r).max_output_bytes);
    if (aggregation_ == Aggregation::kCustom)
      for (auto& r : reduced_) r.resize(codec.sizes(rounds_ - 1).max_reduced_bytes);
  }
  int rounds() const { return rounds_; }
  std::span<const float> output() const { return out_; }
  void encode(int r, const float* grad) {
    const auto i = static_cast<std::size_t>(r);
    const std::span<const std::byte> prev =
        r == 0 ? std::span<const std::byte>() : std::span<const std::byte>(payload_[i - 1]).first(bytes_[i - 1]);
    bytes_[i] = codec_.encode(step_, r, grad, prev, payload_[i]);
  }
  std::span<const std::byte> finalPayload() const {
    const auto last = static_cast<std::size_t>(rounds_ - 1);
    return std::span<const std::byte>(payload_[last]).first(bytes_[last]);
  }
  // A CUSTOM codec's aggregate of `world` ranks' payloads, each this one's, folded as a run folds them (world - 1
  // reduces, CompressionPipeline::fold): what decode() then decodes. Nothing for the others.
  void fold(int world) {
    if (aggregation_ != Aggregation::kCustom) return;
    foldStart();
    for (int i = 1; i < world; ++i) foldNext();
  }
  // A fold's pieces, for timing its reduces one by one: the aggregate of one rank, then one more rank's payload.
  void foldStart() {
    aggregate_ = finalPayload();
    folded_ = 1;
  }
  void foldNext() {
    std::vector<std::byte>& dst = reduced_[folded_ % 2];
    aggregate_ =
        std::span<const std::byte>(dst).first(codec_.reduce(step_, rounds_ - 1, aggregate_, finalPayload(), dst));
    ++folded_;
  }
  void decode() {
    switch (aggregation_) {
      case Aggregation::kSum:
        codec_.decode(step_, finalPayload(), -1, out_.data(), false);
        break;
      case Aggregation::kAllgather:
        codec_.decode(step_, finalPayload(), 0, out_.data(), true);
        break;
      case Aggregation::kCustom:
        codec_.decode(step_, aggregate_, -1, out_.data(), false);
        break;
    }
  }
  // EF21's commit after the decode, as a step makes it once (CompressionPipeline::commitAggregate charges it apart):
  // the state walk makes it, the timed decode does not.
  void commit() { codec_.aggregated(step_, out_.data(), nullptr, 0); }

 private:
  TensorCodec& codec_;
  uint64_t step_;
  int rounds_;
  std::vector<std::vector<std::byte>> payload_;
  std::vector<uint64_t> bytes_;
  std::vector<float> out_;
  Aggregation aggregation_;
  std::vector<std::byte> reduced_[2];
  std::span<const std::byte> aggregate_;
  std::size_t folded_ = 0;  // ranks in aggregate_
};

// Times every key of `plan` that `want` names, adding them to `into`.
class Measurer {
 public:
  // `in`: the run's experiment, for its workload, codec and optimizer; nullptr for a sums-only plan.
  Measurer(const CalibrationInputs* in, const CalibrationPlan& plan)
      : in_(in), plan_(plan), budget_(in != nullptr ? in->kernel_budget : CalibrationInputs::kDefaultKernelBudget) {}

  void measure(const std::vector<std::string>& want, std::map<std::string, double>& into) {
    std::vector<std::string> kernels, codecs;
    for (const std::string& key : want) (isCodecKey(key) ? codecs : kernels).push_back(key);
    inPasses(kernels, kCalibrationPasses, into, [this](const auto& wanted, auto& got) { measureKernels(wanted, got); });
    if (codecs.empty()) return;
    // In a child of its own (timeInChild). The gradients are taken and the plugin loaded here; it is instantiated
    // there, so that no plugin thread or lock is ever forked.
    train::Workload& model = replica();
    if (!gradients_) {
      model.forwardBackward(firstBatch(model, in_->experiment.data().batch_size()), {});
      gradients_ = gradientsBySize(model);
    }
    plugin_ = in_->loader.loadCompressor(in_->experiment.compressor().name());
    if (!plan_.pull_codec.empty()) pull_plugin_ = detail::loadPullCompressor(in_->experiment, in_->loader);
    dense_plugin_ = detail::densePlugin(in_->experiment, in_->loader);
    const std::map<std::string, double> times = timeInChild("calibration: timing codec '" + plan_.codec + "'", [&] {
      std::map<std::string, double> got;
      inPasses(codecs, kCalibrationPasses, got, [this](const auto& wanted, auto& t) { measureCodecs(wanted, t); });
      return got;
    });
    into.insert(times.begin(), times.end());
  }

 private:
  double timed(const std::function<void()>& fn, const std::function<void()>& prepare = {}, int repetitions = 0) const {
    return std::max(0.0, timeKernel(budget_, fn, prepare, repetitions) - floor_);
  }

  using Wanted = std::function<bool(const std::string&)>;

  // `passes` passes over every kernel `want` names, each kernel keeping its least time: a host whose cores are shared
  // (another process on the sibling hyperthread, a compiler filling the caches) is quiet at some moments, and passes
  // spread over the whole calibration catch more of them than one burst per kernel would. The clock's own cost (two
  // reads of the thread CPU clock, a system call each) is in every time: taken off, or a ten-element kernel would
  // cost what the clock does.
  template <typename Fn>
  void inPasses(const std::vector<std::string>& want, int passes, std::map<std::string, double>& into, Fn&& fn) {
    if (want.empty()) return;
    const Wanted wanted = [&](const std::string& key) {
      return std::find(want.begin(), want.end(), key) != want.end();
    };
    for (int pass = 0; pass < passes; ++pass) {
      floor_ = pass == 0 ? timeKernel(budget_, [] {}) : std::min(floor_, timeKernel(budget_, [] {}));
      std::map<std::string, double> got;
      fn(wanted, got);
      for (const auto& [key, s] : got) into[key] = pass == 0 ? s : std::min(into[key], s);
    }
  }

  // Every kernel but the codecs'.
  void measureKernels(const Wanted& wanted, std::map<std::string, double>& into) {
    measureSums(wanted, into);
    if (plan_.sums_only) return;
    const experiments::Experiment& e = in_->experiment;
    // Forward and backward: the whole pass at the run's batch size, split by the layers' flops.
    bool layers = false;
    for (int l = 0; l < static_cast<int>(plan_.layers.size()); ++l)
      layers = layers || wanted(layerKey("forward", plan_, l)) || wanted(layerKey("backward", plan_, l));
    if (layers) {
      train::Workload& model = replica();
      const std::vector<int64_t> batch = firstBatch(model, plan_.batch);
      const double pass = timed([&] { model.forwardBackward(batch, {}); }) * static_cast<double>(plan_.batch) /
                          static_cast<double>(std::max<std::size_t>(batch.size(), 1));
      double total = 0;
      for (const auto& f : plan_.layers) total += f.forward + f.backward;
      for (int l = 0; l < static_cast<int>(plan_.layers.size()); ++l) {
        const auto& f = plan_.layers[static_cast<std::size_t>(l)];
        // A model without flops (none declared) splits evenly.
        const double nl = static_cast<double>(plan_.layers.size());
        into[layerKey("forward", plan_, l)] = total > 0 ? pass * f.forward / total : pass / (2 * nl);
        into[layerKey("backward", plan_, l)] = total > 0 ? pass * f.backward / total : pass / (2 * nl);
      }
    }
    train::SgdOptions sgd = detail::trainerOptions(e).sgd;
    for (uint64_t n : plan_.sizes) {
      const std::vector<float> g = gaussian(n, 2 * n + 1);
      std::vector<float> a = gaussian(n, 2 * n + 2);
      if (wanted(sizeKey("accumulate", "", n))) {
        // A multiply-add pass like SyncTrainer::accumulate's.
        into[sizeKey("accumulate", "", n)] = timed([&] {
          for (uint64_t i = 0; i < n; ++i) a[i] = a[i] * 0.5f + 0.25f * g[i];
        });
      }
      if (wanted(sizeKey("optimizer", plan_.optimizer, n))) {
        std::vector<train::ParamTensor> p(1);
        p[0].name = "calibration";
        p[0].shape = {static_cast<int64_t>(n)};
        p[0].value = gaussian(n, 2 * n + 3);
        p[0].grad = g;
        train::SgdOptimizer opt(p, sgd);
        into[sizeKey("optimizer", plan_.optimizer, n)] = timed([&] { opt.update(0, p[0], 1e-3); });
      }
    }
  }

  void measureCodecs(const Wanted& wanted, std::map<std::string, double>& into) {
    const experiments::Experiment& e = in_->experiment;
    std::shared_ptr<Compressor> instance = plugin_->instantiate(experiments::pluginParams(e.compressor()));
    const CodecOptions codec_options = experiments::codecOptions(e);
    std::shared_ptr<Compressor> pull;
    if (pull_plugin_)
      pull = pull_plugin_->instantiate(experiments::pluginParams(e.parameter_server().pull_compressor()));
    std::shared_ptr<Compressor> dense;
    if (dense_plugin_ && !plan_.dense_codec.empty()) dense = dense_plugin_->instantiate({});
    for (uint64_t n : plan_.sizes) {
      if (dense && (wanted(sizeKey("compress", roundSubject(plan_.dense_codec, 0), n)) ||
                    wanted(sizeKey("decompress", plan_.dense_codec, n))))
        measureCodec(dense, CodecOptions{}, n, plan_.dense_codec, false, into);
      for (int ph = 0; ph < plan_.phases(); ++ph) {
        const std::string subject = plan_.phaseSubject(ph);
        bool codec = wanted(sizeKey("decompress", subject, n)) || wanted(sizeKey("reduce", subject, n));
        for (int r = 0; r < plan_.rounds; ++r)
          codec = codec || wanted(sizeKey("compress", roundSubject(subject, r), n));
        if (codec) measureCodec(instance, codec_options, n, subject, plan_.reduce, into, false, plan_.phaseStep(ph));
      }
      for (int ph = 0; pull && ph < plan_.pullPhases(); ++ph) {
        const std::string subject = plan_.pullPhaseSubject(ph);
        if (wanted(sizeKey("compress", roundSubject(subject, 0), n)) || wanted(sizeKey("decompress", subject, n)))
          measureCodec(pull, CodecOptions{}, n, subject, false, into, /*delta_passes=*/true, plan_.pullPhaseStep(ph));
      }
    }
  }

  void measureSums(const Wanted& wanted, std::map<std::string, double>& into) {
    for (uint64_t n : plan_.sizes) {
      for (std::string_view d : kSumDtypes) {
        const std::string key = sizeKey("sum", d, n);
        if (!wanted(key)) continue;
        const DType dt = sumDtype(d);
        std::vector<std::byte> dst(n * dtypeSize(dt)), src(n * dtypeSize(dt));
        // Zero bytes are zeros in every summed dtype: the sum stays finite however often it runs.
        into[key] = timed([&] { comm::sumInto(dst.data(), src.data(), n, dt); });
      }
    }
  }

  // `subject`: the codec's name in the keys (a phase of plan_.codec, or plan_.pull_codec); `reduce`: its reduce is
  // charged; `delta_passes`: a pull codec's, whose kernels a parameter server runs with a pass each around them (the
  // change params - replica before the encode, the add into the copy after the decode: param_server_shard.cc), timed
  // with them; `step`: the step every call is made at, the first of the phase timed (terse/phases_v1.h).
  void measureCodec(const std::shared_ptr<Compressor>& instance, const CodecOptions& options, uint64_t n,
                    const std::string& subject, bool reduce, std::map<std::string, double>& into,
                    bool delta_passes = false, uint64_t step = 0) {
    const experiments::Experiment& e = in_->experiment;
    TensorInfo info;
    info.dtype = DType::kF32;
    info.numel = n;
    info.ndim = 1;
    info.shape[0] = static_cast<int64_t>(n);
    info.world_size = e.workers();
    std::unique_ptr<TensorCodec> codec = makeCodec(instance, info, e.seed(), options);
    // The real gradient of this size (calibration.h says why), taken by measure() outside every timed region.
    const auto found = gradients_->find(n);
    TERSE_CHECK(found != gradients_->end(), InternalError,
                "calibration: the model has no gradient of " << n << " elements to time codec '" << subject << "' on");
    const float* grad = found->second.data();
    CodecStep one(*codec, n, step);
    const int rounds = one.rounds();
    // The delta passes' operands: a replica of zeros leaves the change the gradient itself, what the codec is timed on;
    // the decode adds into a copy of its own, so that the change stays the same whatever the repetitions.
    std::vector<float> change(delta_passes ? n : 0), replica(delta_passes ? n : 0), copy(delta_passes ? n : 0);
    const auto encodeRound = [&](int r) {
      if (!delta_passes) return one.encode(r, grad);
      for (uint64_t i = 0; i < n; ++i) change[i] = grad[i] - replica[i];
      one.encode(r, change.data());
    };
    const auto decode = [&] {
      one.decode();
      if (!delta_passes) return;
      const std::span<const float> out = one.output();
      for (uint64_t i = 0; i < n; ++i) copy[i] += out[i];
    };
    // A stateful codec's fixed schedule (calibration.h): the state's steps, each every round and the decode as a step
    // runs them, then a count of timed repetitions the budget does not change. A stateless codec repeats as long as
    // the budget allows, every repetition alike.
    const bool stateful = codec->caps().stateful || options.error_feedback || options.momentum_correction > 0;
    const int repetitions = stateful ? kCodecRepetitions : 0;
    if (stateful) runCodecState(*codec, found->second, step);
    // Every codec kernel starts on cold caches (evictCaches says why).
    for (int r = 0; r < rounds; ++r) {
      into[sizeKey("compress", roundSubject(subject, r), n)] = timed([&] { encodeRound(r); },
                                                                     [&] {
                                                                       for (int q = 0; q < r; ++q) encodeRound(q);
                                                                       evictCaches();
                                                                     },
                                                                     repetitions);
    }
    // A CUSTOM codec's aggregate is folded before each decode (CodecStep), untimed: its reduce is the next key's.
    into[sizeKey("decompress", subject, n)] = timed(
        decode,
        [&] {
          one.fold(e.workers());
          evictCaches();
        },
        repetitions);
    if (reduce) {
      // A run's fold of w payloads makes w - 1 reduces: the first of two payloads, the others of the aggregate and a
      // payload (signSGD's: a count per element against a bit), each timed on cold caches; the key is their mean.
      const int world = e.workers();
      const double first = timed([&] { one.foldNext(); },
                                 [&] {
                                   one.foldStart();
                                   evictCaches();
                                 },
                                 repetitions);
      const double later = world < 3 ? first
                                     : timed([&] { one.foldNext(); },
                                             [&] {
                                               one.foldStart();
                                               one.foldNext();
                                               evictCaches();
                                             },
                                             repetitions);
      into[sizeKey("reduce", subject, n)] = world < 3 ? first : (first + (world - 2) * later) / (world - 1);
    }
  }

  // The model every pass times and takes the codecs' gradients from (calibrationReplica), built on first use.
  train::Workload& replica() {
    if (!replica_) replica_ = calibrationReplica(in_->experiment, in_->data);
    return *replica_;
  }

  const CalibrationInputs* in_;
  const CalibrationPlan& plan_;
  std::chrono::milliseconds budget_;
  double floor_ = 0;
  std::unique_ptr<train::Workload> replica_;
  std::optional<std::map<uint64_t, std::vector<float>>> gradients_;
  std::shared_ptr<const CompressorPlugin> plugin_;
  std::shared_ptr<const CompressorPlugin> pull_plugin_;   // plan_.pull_codec's
  std::shared_ptr<const CompressorPlugin> dense_plugin_;  // plan_.dense_codec's
};

}  // namespace

std::string CalibrationIdentity::describe() const {
  return "cpu '" + cpu + "' (flags " + (flags.empty() ? std::string("none") : flags) + ") at commit " + commit;
}

CalibrationIdentity thisMachine() {
  CalibrationIdentity id;
  id.cpu = results::cpuDescription();
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    const std::string flags = " " + line.substr(line.find(':') + 1) + " ";
    for (std::string_view f : kKernelFlags) {
      if (flags.find(" " + std::string(f) + " ") == std::string::npos) continue;
      if (!id.flags.empty()) id.flags += ' ';
      id.flags += f;
    }
    break;
  }
  id.commit = std::string(results::buildCommit());
  return id;
}

std::string CalibrationTable::toJson() const {
  Json kernels = Json::object();
  for (const auto& [key, s] : seconds) kernels[key] = s;
  Json j = {{"format", std::string(kFormat)},
            {"cpu", identity.cpu},
            {"flags", identity.flags},
            {"commit", identity.commit},
            {"seconds", kernels}};
  return dumpJson(j, 1) + "\n";
}

CalibrationTable CalibrationTable::parse(std::string_view text, const std::string& file) {
  std::string error;
  const auto j = parseJsonObject(text, &error);
  TERSE_CHECK(j.has_value(), InvalidArgument, "calibration table " << file << ": not JSON: " << error);
  TERSE_CHECK(getString(*j, "format") == std::string(kFormat), InvalidArgument,
              "calibration table " << file << ": field 'format' must be \"" << kFormat << "\"");
  CalibrationTable t;
  for (auto [field, into] : {std::pair{"cpu", &t.identity.cpu}, std::pair{"flags", &t.identity.flags},
                             std::pair{"commit", &t.identity.commit}}) {
    const auto v = getString(*j, field);
    TERSE_CHECK(v.has_value(), InvalidArgument,
                "calibration table " << file << ": field '" << field << "' is missing or not a string");
    *into = *v;
  }
  const Json* kernels = findMember(*j, "seconds");
  TERSE_CHECK(kernels != nullptr && kernels->is_object(), InvalidArgument,
              "calibration table " << file << ": field 'seconds' is missing or not an object");
  for (const auto& [key, value] : kernels->items()) {
    TERSE_CHECK(value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() >= 0, InvalidArgument,
                "calibration table " << file << ": kernel '" << key << "' must have a finite time >= 0 in seconds");
    t.seconds[key] = value.get<double>();
  }
  return t;
}

CalibrationTable CalibrationTable::load(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  TERSE_CHECK(in.good(), InvalidArgument, "calibration table " << file.string() << ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), file.string());
}

std::vector<std::string> CalibrationPlan::keys() const {
  std::vector<std::string> k;
  if (sums_only) {
    for (uint64_t n : sizes)
      for (const std::string& d : sum_dtypes) k.push_back(sizeKey("sum", d, n));
    return k;
  }
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    k.push_back(layerKey("forward", *this, l));
    k.push_back(layerKey("backward", *this, l));
  }
  for (uint64_t n : sizes) {
    for (int ph = 0; ph < phases(); ++ph) {
      const std::string subject = phaseSubject(ph);
      for (int r = 0; r < rounds; ++r) k.push_back(sizeKey("compress", roundSubject(subject, r), n));
      k.push_back(sizeKey("decompress", subject, n));
      if (reduce) k.push_back(sizeKey("reduce", subject, n));
    }
    for (std::string_view d : kSumDtypes) k.push_back(sizeKey("sum", d, n));
    k.push_back(sizeKey("optimizer", optimizer, n));
    k.push_back(sizeKey("accumulate", "", n));
    for (int ph = 0; ph < pullPhases() && !pull_codec.empty(); ++ph) {
      k.push_back(sizeKey("compress", roundSubject(pullPhaseSubject(ph), 0), n));
      k.push_back(sizeKey("decompress", pullPhaseSubject(ph), n));
    }
    if (!dense_codec.empty()) {
      k.push_back(sizeKey("compress", roundSubject(dense_codec, 0), n));
      k.push_back(sizeKey("decompress", dense_codec, n));
    }
  }
  return k;
}

namespace {

// The run codec's key: the compressor, its decorators and what its times were taken on (see planCalibration).
std::string codecKey(const experiments::Experiment& e, const std::string& workload, bool custom) {
  const CodecOptions co = experiments::codecOptions(e);
  std::ostringstream codec;
  codec.precision(17);
  codec << e.compressor().ShortDebugString() << " ef=" << co.error_feedback << " mc=" << co.momentum_correction
        << " mask=" << co.momentum_masking << " nesterov=" << co.momentum_nesterov;
  // EF21's passes differ from EF's; named only for it, so that every key written before the rule stays the same.
  if (co.error_feedback && co.error_feedback_rule == ErrorFeedbackRule::kEf21)
    codec << " rule=EF21 eta=" << co.ef21_momentum;
  // The codec is timed on the model's gradient (codecCalibrationGradients), so its key also names what made it: the
  // workload and the data (not the run's seed: the gradient is taken at kCalibrationSeed's initialization). Two runs
  // that share a codec and a tensor size share a time only on the same model and data.
  codec << " on " << workload << " data=" << e.data().ShortDebugString();
  // A CUSTOM codec's decode and reduces take the aggregate of the world's payloads (CodecStep::fold), whose size and
  // cost follow the world size.
  if (custom) codec << " world=" << e.workers();
  return e.compressor().name() + "#" + shortHash(codec.str());
}

}  // namespace

CalibrationPlan planCalibration(const experiments::Experiment& e, const train::Workload& model,
                                const Compressor& compressor, const Compressor* pull_instance) {
  CalibrationPlan p;
  p.workload = e.workload().name() + "#" + shortHash(e.workload().ShortDebugString());
  p.batch = e.data().batch_size();
  for (int l = 0; l < model.numLayers(); ++l) p.layers.push_back(model.layerFlops(l));
  p.codec = codecKey(e, p.workload, compressor.caps(DType::kF32).aggregation == Aggregation::kCustom);
  const auto& pull = e.parameter_server().pull_compressor();
  if (!pull.name().empty() && pull.name() != "none") {
    // Its own key, which names it a pull codec: a compressor that is both gets two times (with and without the run's
    // error feedback and momentum correction).
    std::ostringstream pc;
    pc << "pull " << pull.ShortDebugString() << " on " << p.workload << " data=" << e.data().ShortDebugString();
    p.pull_codec = pull.name() + "#" + shortHash(pc.str());
    if (pull_instance != nullptr) {
      const std::span<const uint64_t> phases = pull_instance->phaseSteps();
      p.pull_codec_phases.assign(phases.begin(), phases.end());
    }
  }
  if (e.compression_start_step() > 0) {
    // `none` without decorators: the key a run of compressor none on the same model and data has, so that the two
    // share one time and the warm-up's steps are priced as the dense run's are.
    experiments::Experiment dense = e;
    dense.mutable_compressor()->Clear();
    dense.mutable_compressor()->set_name("none");
    dense.clear_error_feedback();
    dense.clear_error_feedback_rule();
    dense.clear_ef21_momentum();
    // The factor alone: masking and Nesterov are in the key as a resolved config holds them, whatever the factor.
    dense.mutable_momentum_correction()->set_factor(0);
    p.dense_codec = codecKey(dense, p.workload, false);
  }
  const std::span<const uint64_t> phases = compressor.phaseSteps();
  p.codec_phases.assign(phases.begin(), phases.end());
  p.rounds = std::max(1, compressor.caps(DType::kF32).num_rounds);
  p.reduce = compressor.caps(DType::kF32).aggregation == Aggregation::kCustom;
  const train::SgdOptions sgd = detail::trainerOptions(e).sgd;
  std::ostringstream opt;
  opt.precision(17);
  opt << "momentum=" << sgd.momentum << " nesterov=" << sgd.nesterov << " wd=" << sgd.weight_decay
      << " adagrad=" << sgd.adagrad << " eps=" << sgd.adagrad_eps;
  p.optimizer = "sgd#" + shortHash(opt.str());
  for (const train::ParamTensor& t : model.params())
    if (t.numel() > 0) p.sizes.push_back(t.numel());
  std::sort(p.sizes.begin(), p.sizes.end());
  p.sizes.erase(std::unique(p.sizes.begin(), p.sizes.end()), p.sizes.end());
  return p;
}

std::vector<uint64_t> runCodecState(TensorCodec& codec, std::span<const float> grad, uint64_t step) {
  std::vector<float> negated(grad.size());
  std::transform(grad.begin(), grad.end(), negated.begin(), [](float x) { return -x; });
  CodecStep one(codec, grad.size(), step);
  std::mt19937_64 signs(kCalibrationSeed);
  std::vector<uint64_t> sent;
  for (int s = 0; s < kCodecStateSteps; ++s) {
    const float* g = (signs() & 1) != 0 ? negated.data() : grad.data();
    for (int r = 0; r < one.rounds(); ++r) one.encode(r, g);
    one.fold(static_cast<int>(codec.info().world_size));
    one.decode();
    one.commit();
    sent.push_back(one.finalPayload().size());
  }
  return sent;
}

namespace {

// A child's report: 'O' then one "<key length> <key> <seconds as %a>\n" per kernel, or 'E', the error's kind ('P' a
// PluginError, 'O' another), its terse_status_v1 code, a space and its message.
constexpr char kTimes = 'O';
constexpr char kFailed = 'E';
constexpr char kPluginError = 'P';
constexpr char kOtherError = 'O';

std::string encodeTimes(const std::map<std::string, double>& times) {
  std::string out(1, kTimes);
  char value[64];
  for (const auto& [key, s] : times) {
    std::snprintf(value, sizeof value, "%a", s);
    out += std::to_string(key.size()) + ' ' + key + ' ' + value + '\n';
  }
  return out;
}

std::map<std::string, double> decodeTimes(std::string_view text, const std::string& what) {
  std::map<std::string, double> times;
  while (!text.empty()) {
    const std::size_t space = text.find(' ');
    const unsigned long long length = std::strtoull(std::string(text.substr(0, space)).c_str(), nullptr, 10);
    const std::size_t end = space == std::string_view::npos ? space : text.find('\n', space + 1 + length);
    TERSE_CHECK(end != std::string_view::npos && space + 1 + length + 1 < end, InternalError,
                what << ": a child's report is cut short");
    const std::string key(text.substr(space + 1, length));
    times[key] = std::strtod(std::string(text.substr(space + 2 + length, end - space - 2 - length)).c_str(), nullptr);
    text.remove_prefix(end + 1);
  }
  return times;
}

[[noreturn]] void rethrow(bool plugin, terse_status_v1 status, const std::string& message) {
  if (plugin) throw PluginError(message, status);
  switch (status) {
    case TERSE_ERR_INVALID_ARGUMENT:
      throw InvalidArgument(message);
    case TERSE_ERR_INVALID_PAYLOAD:
      throw InvalidPayload(message);
    case TERSE_ERR_UNSUPPORTED:
      throw Unsupported(message);
    case TERSE_ERR_DEVICE:
      throw DeviceError(message);
    default:
      throw InternalError(message);
  }
}

}  // namespace

std::map<std::string, double> timeInChild(const std::string& what,
                                          const std::function<std::map<std::string, double>()>& measure) {
  const ForkedChild child = forkWithPipe(what.c_str(), [&](int fd) {
    std::string report;
    try {
      report = encodeTimes(measure());
    } catch (const Error& e) {
      const char kind = dynamic_cast<const PluginError*>(&e) != nullptr ? kPluginError : kOtherError;
      report = std::string{kFailed, kind} + std::to_string(static_cast<int>(e.status())) + ' ' + e.what();
    } catch (const std::exception& e) {
      report =
          std::string{kFailed, kOtherError} + std::to_string(static_cast<int>(TERSE_ERR_INTERNAL)) + ' ' + e.what();
    }
    writeAll(fd, report);
    ::close(fd);
    // _exit: the atexit handlers and static destructors belong to the parent and run once, there.
    std::fflush(nullptr);
    ::_exit(0);
  });
  const ChildExit done = awaitChild(child);
  const std::string& r = done.report;
  if (r.size() >= 2 && r[0] == kFailed) {
    const std::size_t space = r.find(' ');
    rethrow(r[1] == kPluginError, static_cast<terse_status_v1>(std::atoi(r.substr(2, space).c_str())),
            space == std::string::npos ? std::string() : r.substr(space + 1));
  }
  TERSE_CHECK(!r.empty() && r[0] == kTimes && WIFEXITED(done.status) && WEXITSTATUS(done.status) == 0, PluginError,
              what << ": its process " << exitText(done.status)
                   << " before reporting (the plugin's code crashed or ended it; the message above, if any, says why)");
  return decodeTimes(std::string_view(r).substr(1), what);
}

std::vector<float> calibrationStepOutput(TensorCodec& codec, std::span<const float> grad) {
  CodecStep one(codec, grad.size());
  for (int r = 0; r < one.rounds(); ++r) one.encode(r, grad.data());
  one.fold(static_cast<int>(codec.info().world_size));
  one.decode();
  return {one.output().begin(), one.output().end()};
}

std::map<uint64_t, std::vector<float>> codecCalibrationGradients(const experiments::Experiment& e,
                                                                 std::shared_ptr<const workloads::DataSplit> data) {
  auto model = calibrationReplica(e, std::move(data));
  model->forwardBackward(firstBatch(*model, e.data().batch_size()), {});
  return gradientsBySize(*model);
}

std::shared_ptr<const sim::CostTable> makeCostTable(const CalibrationPlan& plan, const CalibrationTable& table) {
  return std::make_shared<RunCosts>(plan, table);
}

std::filesystem::path defaultCalibrationCache() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') return std::filesystem::path(xdg) / "terse" / "calibration";
  const char* home = std::getenv("HOME");
  TERSE_CHECK(home != nullptr && *home != '\0', InvalidArgument,
              "simulation.compute CALIBRATED caches its table under $XDG_CACHE_HOME or $HOME/.cache, and neither "
              "is set");
  return std::filesystem::path(home) / ".cache" / "terse" / "calibration";
}

namespace {

// Where a table comes from and how its faults are named: the runner's config fields, or the bench's flags.
struct TableSource {
  std::optional<std::filesystem::path> replay;  // a table to replay instead of the cache
  bool allow_foreign = false;
  std::string field;         // names the replayed file in messages: "simulation.calibration", "--calibration"
  std::string allow_hint;    // what lets a foreign table through
  std::string missing_hint;  // why a replayed table may lack a key
  std::optional<std::filesystem::path> cache_dir;
};

// The cache file's table, or an empty one of `here` when it is missing, damaged or another machine's or commit's.
CalibrationTable readCache(const std::filesystem::path& file, const CalibrationIdentity& here) {
  CalibrationTable cache;
  cache.identity = here;
  std::error_code ec;
  if (std::filesystem::exists(file, ec)) {
    try {
      CalibrationTable found = CalibrationTable::load(file);
      if (found.identity == here) cache = std::move(found);
    } catch (const Error& x) {
      // A damaged cache is measured again, not fatal: it is a cache.
      TERSE_LOG(LogLevel::kWarn, "ignoring the calibration cache: " << x.what());
    }
  }
  return cache;
}

// An exclusive flock on `dir`/.lock for as long as it lives (none when the file cannot be opened: the cache then works
// as before, racing).
class CacheLock {
 public:
  explicit CacheLock(const std::filesystem::path& dir)
      : fd_(::open((dir / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ >= 0) {
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~CacheLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  int fd_;
};

// The table of plan's keys (calibration.h, calibrate): replayed, refused when foreign unless allowed or when it lacks
// a key, else the cache's entries with the missing ones measured by `measure` and added to the cache.
CalibrationOutcome resolveTable(
    const CalibrationPlan& plan, const TableSource& src,
    const std::function<void(const std::vector<std::string>&, std::map<std::string, double>&)>& measure) {
  const CalibrationIdentity here = thisMachine();
  const std::vector<std::string> keys = plan.keys();
  CalibrationOutcome out;
  out.table.identity = here;
  if (src.replay) {
    const std::filesystem::path& file = *src.replay;
    const CalibrationTable given = CalibrationTable::load(file);
    if (!(given.identity == here)) {
      TERSE_CHECK(src.allow_foreign, InvalidArgument,
                  src.field << ": " << file.string() << " was measured on " << given.identity.describe()
                            << ", this run is on " << here.describe() << "; " << src.allow_hint
                            << " to replay it anyway");
      out.foreign = true;
    }
    out.table.identity = given.identity;
    for (const std::string& k : keys) {
      const auto it = given.seconds.find(k);
      TERSE_CHECK(it != given.seconds.end(), InvalidArgument,
                  src.field << ": " << file.string() << " has no time for kernel '" << k
                            << "', which this run charges (" << src.missing_hint << ")");
      out.table.seconds[k] = it->second;
    }
    out.source = "replayed " + file.string();
  } else {
    const std::filesystem::path dir = src.cache_dir.value_or(defaultCalibrationCache());
    const std::filesystem::path file = dir / (shortHash(here.cpu + "\n" + here.flags + "\n" + here.commit) + ".json");
    CalibrationTable cache = readCache(file, here);
    std::error_code ec;
    std::vector<std::string> missing;
    for (const std::string& k : keys)
      if (!cache.seconds.count(k)) missing.push_back(k);
    if (!missing.empty()) {
      std::map<std::string, double> measured, ours;
      measure(missing, measured);
      for (const std::string& k : missing) {
        TERSE_CHECK(measured.count(k), InternalError, "calibration did not measure kernel '" << k << "'");
        ours[k] = measured[k];
      }
      std::filesystem::create_directories(dir, ec);
      TERSE_CHECK(!ec, InvalidArgument,
                  "the calibration cache " << dir.string() << " cannot be created: " << ec.message());
      cache = mergeIntoCalibrationCache(file, here, ours);
      // What this run timed and charges; a key another run wrote first is charged at that run's time.
      for (const std::string& k : missing)
        if (cache.seconds.at(k) == ours[k]) out.measured.push_back(k);
    }
    for (const std::string& k : keys) out.table.seconds[k] = cache.seconds.at(k);
    // The cache file's name, not its path: provenance travels (committed reference results, other people's
    // machines) and the table itself is saved beside the run; the name is the CPU-and-commit key.
    out.source = out.measured.size() == keys.size() ? "measured" : "cache " + file.filename().string();
  }
  out.costs = makeCostTable(plan, out.table);
  return out;
}

}  // namespace

CalibrationTable mergeIntoCalibrationCache(const std::filesystem::path& file, const CalibrationIdentity& here,
                                           const std::map<std::string, double>& measured) {
  // Another run of this commit on this CPU may have measured and written since this one read the cache (two `terse
  // run`s side by side): under the lock, what the file holds now wins over what we measured, and ours fills the rest.
  // A written time then never changes, so every run charges the same table; before, the last writer's replaced the
  // first's, and one `terse run` charged its later variants from the other's measurements, about 2% apart.
  const CacheLock lock(file.parent_path());
  CalibrationTable table = readCache(file, here);
  for (const auto& [k, seconds] : measured) table.seconds.emplace(k, seconds);
  results::writeFileAtomic(file, table.toJson());
  return table;
}

CalibrationOutcome calibrate(const CalibrationInputs& in) {
  const experiments::Experiment& e = in.experiment;
  // The plan needs the model's layers and sizes, the compressor's caps and phases and the pull compressor's phases:
  // one replica and the instances, built here and gone before the codecs are timed in forked children (Measurer), so
  // that no plugin thread or lock is forked.
  const CalibrationPlan plan = [&] {
    auto model = workloads::makeWorkload(e.workload().name(), detail::workloadOptions(e), in.data);
    const std::shared_ptr<Compressor> instance =
        in.loader.loadCompressor(e.compressor().name())->instantiate(experiments::pluginParams(e.compressor()));
    std::shared_ptr<Compressor> pull;
    if (const auto& spec = e.parameter_server().pull_compressor(); !spec.name().empty() && spec.name() != "none")
      pull = detail::loadPullCompressor(e, in.loader)->instantiate(experiments::pluginParams(spec));
    return planCalibration(e, *model, *instance, pull.get());
  }();
  TableSource src;
  if (!e.simulation().calibration().empty()) src.replay = std::filesystem::path(e.simulation().calibration());
  src.allow_foreign = e.simulation().allow_foreign_calibration();
  src.field = "simulation.calibration";
  src.allow_hint = "set simulation.allow_foreign_calibration: true";
  src.missing_hint = "a table from a run of another workload, batch size, compressor or optimizer";
  src.cache_dir = in.cache_dir;
  return resolveTable(plan, src, [&](const std::vector<std::string>& want, std::map<std::string, double>& into) {
    Measurer(&in, plan).measure(want, into);
  });
}

CalibrationPlan planSums(DType dtype, std::vector<uint64_t> sizes) {
  CalibrationPlan p;
  p.sums_only = true;
  p.sum_dtypes = {std::string(sumDtypeName(static_cast<int>(dtype)))};
  sizes.erase(std::remove(sizes.begin(), sizes.end(), uint64_t{0}), sizes.end());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  p.sizes = std::move(sizes);
  return p;
}

CalibrationOutcome calibrateSums(const SumCalibrationInputs& in) {
  const CalibrationPlan plan = planSums(in.dtype, in.sizes);
  TableSource src;
  src.replay = in.replay;
  src.allow_foreign = in.allow_foreign;
  src.field = "--calibration";
  src.allow_hint = "add --allow-foreign-calibration";
  src.missing_hint =
      "the bench charges the sums of its frames, 'sum <dtype> n<elements>' at the element counts of "
      "its sweep: a table of another dtype, sweep or segment";
  src.cache_dir = in.cache_dir;
  return resolveTable(plan, src, [&](const std::vector<std::string>& want, std::map<std::string, double>& into) {
    Measurer(nullptr, plan).measure(want, into);
  });
}

}  // namespace terse::runner
