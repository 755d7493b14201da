// The calibrated compute model of a simulation (simulation.compute: CALIBRATED, DESIGN.md section 9): before the
// simulation starts, each kernel the run will charge is timed in isolation on the calling thread, and the simulated
// runtime charges every kernel region the table's time for its key (core/sim/runtime.h). A table depends on the
// CPU and the code, so it is keyed by both, cached under ${XDG_CACHE_HOME:-~/.cache}/terse/calibration/ (a study's
// variants, and the next study, reuse what is there and measure only the keys they add) and written into the results
// folder as calibration.json, which `simulation.calibration` replays.
//
// The keys (entry names in the file, "kind subject size"):
//   forward <workload>#<hash> L<layer> b<batch>      a layer's forward over one batch of the run's batch size
//   backward <workload>#<hash> L<layer> b<batch>     its backward
//   compress <compressor>#<hash>[ @<step>] r<round> n<elements>, decompress ... n<elements>, reduce ... n<elements>
//                                                     (" @<step>": a later phase of a compressor that reports phases,
//                                                     terse/phases_v1.h, timed at that step; CalibrationPlan)
//   sum <dtype> n<elements>, optimizer <options hash> n<elements>, accumulate n<elements>
// A workload cannot run one layer alone (Workload::forwardBackward is the whole pass), so the whole pass is timed and
// split among the layers' forward and backward by their FLOP counts (Workload::layerFlops); a batch of another size
// (the epoch's last, a micro-batch) is charged in proportion. Codecs are timed at every tensor size of the model on
// that tensor's real gradient (the model's at one fixed initialization over the first training batch): a codec whose
// work follows its input (threshold keeps what exceeds tau; top-k's selection) costs what it costs on gradients, not
// on unit gaussians, where threshold at tau 0.03 keeps 98% of the elements instead of the gradient's few percent. The
// per-element kernels run at the same sizes on seeded gaussian data, which their cost does not depend on. A region of
// another size (a scheduler's chunk or fused group, a parameter-server piece, a ring's segment) is charged by linear
// interpolation between the two measured sizes around it, in proportion beyond the ends.
//
// Each time is the minimum thread CPU time over repetitions (at least kMinRepetitions, more until the kernel budget,
// CalibrationInputs::kernel_budget) in each of kCalibrationPasses passes over all the kernels: the kernel's cost with
// nothing preempting it, what a quiet run measures. The minimum resists time slicing and short bursts of load; it does
// not undo load that lasts the whole calibration on a core's sibling hyperthread or in the shared caches
// (calibrated.md in results/reference/simulation has the spread between calibrations on a shared host). Forward,
// backward, sums and the optimizer are timed with warm caches; a codec's kernels start each repetition on cold ones,
// as a run meets them (calibration.cc, evictCaches; results/reference/simulation/codec_ranking.md). The codecs are
// timed in a forked child (timeInChild): a plugin that crashes there fails its variant's run, naming the codec and
// the signal, instead of ending the process and every variant after it.
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/dtype.h"
#include "core/sim/runtime.h"
#include "core/train/workload.h"
#include "experiments/config/config.h"

namespace terse {
class Compressor;
class PluginLoader;
class TensorCodec;
}  // namespace terse
namespace terse::workloads {
struct DataSplit;
}

namespace terse::runner {

// What a table is valid for: the CPU (model and the flags that pick kernels) and the code that ran.
struct CalibrationIdentity {
  std::string cpu;     // results::cpuDescription(): model name, family/model, logical CPUs, widest vector ISA
  std::string flags;   // the /proc/cpuinfo flags among those compilers and kernels dispatch on ("avx2 f16c fma")
  std::string commit;  // results::buildCommit(): the commit this binary was built from
  bool operator==(const CalibrationIdentity&) const = default;
  std::string describe() const;  // "cpu '...' (flags ...) at commit ..."
};
CalibrationIdentity thisMachine();

// A calibration table: its identity and the seconds of each kernel key.
struct CalibrationTable {
  CalibrationIdentity identity;
  std::map<std::string, double> seconds;
  std::string toJson() const;
  // Throws InvalidArgument naming `file` and what is wrong (a missing field, a negative time).
  static CalibrationTable parse(std::string_view text, const std::string& file);
  static CalibrationTable load(const std::filesystem::path& file);
};

// The kernels one run charges and their keys.
struct CalibrationPlan {
  std::string workload;  // "mlp#1a2b3c4d5e6f": the name and a hash of the workload config
  int64_t batch = 0;
  std::vector<train::LayerFlops> layers;
  std::string codec;  // "topk#...": the compressor, its parameters and the codec decorators
  // The compressor's phases (Compressor::phaseSteps, terse/phases_v1.h: a warm-up's stages): phase i > 0 is timed at
  // step codec_phases[i - 1] under its own subject (phaseSubject), phase 0 at step 0 under `codec`, and each step is
  // charged its phase's times (rt::Cost::phase). Empty for a compressor of one phase: its keys are as before.
  std::vector<uint64_t> codec_phases;
  int rounds = 1;
  bool reduce = false;  // CUSTOM aggregation: the codec's reduce is charged
  // A parameter server's pull compressor ("topk#..."; one round, no reduce: param_server_shard.h), timed as the run's
  // codec is, on the same gradients, without error feedback (a delta pull's feedback is the shard's replica, whose
  // pass is in the timed encode's place); empty: none.
  std::string pull_codec;
  std::vector<uint64_t> pull_codec_phases;  // the pull compressor's phases, as codec_phases (pullPhaseSubject)
  // The dense warm-up's codec (compression_start_step > 0: compressor `none` without decorators, charged as
  // rt::kDenseCodec; core/train/sync_trainer.h), timed likewise; empty: none.
  std::string dense_codec;
  std::string optimizer;        // a hash of the optimizer's options
  std::vector<uint64_t> sizes;  // ascending, no repeats, none zero
  // A collective benchmark's plan (planSums): the sums of sum_dtypes at `sizes` elements, and no other kernel.
  bool sums_only = false;
  std::vector<std::string> sum_dtypes = {"f32", "f16", "bf16"};
  std::vector<std::string> keys() const;
  // A codec's phases: 1 + its phase steps; phase p's first step (0 for phase 0); the name its kernels are keyed under
  // (`codec` for phase 0, "<codec> @<first step>" for a later one). For the run's codec and the pull codec alike.
  static int phaseCount(const std::vector<uint64_t>& steps) { return 1 + static_cast<int>(steps.size()); }
  static uint64_t phaseStart(const std::vector<uint64_t>& steps, int phase) {
    return phase == 0 ? 0 : steps[static_cast<std::size_t>(phase - 1)];
  }
  static std::string phaseKey(const std::string& codec, const std::vector<uint64_t>& steps, int phase) {
    return phase == 0 ? codec : codec + " @" + std::to_string(phaseStart(steps, phase));
  }
  int phases() const { return phaseCount(codec_phases); }
  uint64_t phaseStep(int phase) const { return phaseStart(codec_phases, phase); }
  std::string phaseSubject(int phase) const { return phaseKey(codec, codec_phases, phase); }
  int pullPhases() const { return phaseCount(pull_codec_phases); }
  uint64_t pullPhaseStep(int phase) const { return phaseStart(pull_codec_phases, phase); }
  std::string pullPhaseSubject(int phase) const { return phaseKey(pull_codec, pull_codec_phases, phase); }
};

// Adds `measured` to the calibration cache `file` (of identity `here`) under an exclusive lock of its folder's .lock:
// a time the file already holds -- another run of this commit on this CPU measured it first -- wins over ours and
// stays, so every run charges the same table. A file of another identity, or damaged, is replaced. Returns the table
// as written.
CalibrationTable mergeIntoCalibrationCache(const std::filesystem::path& file, const CalibrationIdentity& here,
                                           const std::map<std::string, double>& measured);

struct CalibrationOutcome {
  CalibrationTable table;                       // the entries of plan.keys(), with the run's identity
  std::vector<std::string> measured;            // keys timed for this run (neither cached nor replayed)
  std::string source;                           // "measured", "cache <file name>", "replayed <file>"
  bool foreign = false;                         // a replayed table from another CPU or commit, allowed by the config
  std::shared_ptr<const sim::CostTable> costs;  // what the simulated runtime charges from it
};

struct CalibrationInputs {
  const experiments::Experiment& experiment;
  std::shared_ptr<const workloads::DataSplit> data;
  PluginLoader& loader;
  // The cache folder; nullopt: ${XDG_CACHE_HOME:-$HOME/.cache}/terse/calibration.
  std::optional<std::filesystem::path> cache_dir;
  // Thread CPU time a kernel repeats for in each pass (at least kMinRepetitions); tests shorten or stretch it.
  static constexpr std::chrono::milliseconds kDefaultKernelBudget{60};
  std::chrono::milliseconds kernel_budget = kDefaultKernelBudget;
};

inline constexpr int kCalibrationPasses = 3;
inline constexpr int kMinRepetitions = 5;
inline constexpr int kMaxRepetitions = 200;
// A stateful codec (the plugin's caps say so, or error feedback or momentum correction wrap it) carries state from one
// encode to the next -- a residual, DGC's momentum, PowerSGD's warm start -- and what an encode costs follows that
// state: threshold with error feedback sends every element whose residual has grown past tau, so it sends more the
// more steps ran. Such a codec's kernels are timed on a fixed schedule, the same in every calibration: a fresh codec
// per pass, kCodecStateSteps untimed steps on the gradient (runCodecState below), then exactly kCodecRepetitions
// timed ones. As many repetitions as the budget allowed made the state, and with it threshold-ef's decode, differ 200x
// between two calibrations on one host (0.4 us against 92 us at 200,704 elements).
inline constexpr int kCodecStateSteps = 20;
inline constexpr int kCodecRepetitions = 10;
// Runs `measure` in a forked child and returns the kernel times it measured, bit for bit. A child's terse error comes
// back as the same kind of error with its message; a child that crashes or exits without reporting is a PluginError
// naming `what` and how it ended.
std::map<std::string, double> timeInChild(const std::string& what,
                                          const std::function<std::map<std::string, double>()>& measure);

// A stateful codec's state steps, before its timed repetitions: step s encodes every round of `grad` times a sign drawn
// for that step (seeded by kCalibrationSeed: the same in every calibration), then decodes the last round's payload, as
// a run's step does. Why the sign: a residual fed the same gradient at every step grows by it at every step, and
// threshold with error feedback then sent, and cost, about 1.5x what runs measure; a run's gradients partly cancel from
// step to step, and with the sign drawn per step the residual walks as theirs does
// (results/reference/simulation/codec_ranking.md). Returns each step's last-round payload bytes.
// `step`: the step of every call (0, or the first step of a compressor's phase: terse/phases_v1.h).
std::vector<uint64_t> runCodecState(TensorCodec& codec, std::span<const float> grad, uint64_t step = 0);

std::filesystem::path defaultCalibrationCache();
// The run's table: replayed from simulation.calibration (refused when from another CPU or commit unless
// allow_foreign_calibration, or when it lacks one of the run's keys), else the cache's entries with the missing ones
// measured now and added to the cache. Throws InvalidArgument naming the file or field at fault.
CalibrationOutcome calibrate(const CalibrationInputs& in);

// `terse bench allreduce --clock simulated --compute calibrated`: a collective charges its sums alone, so its table is
// `sum <dtype> n<elements>` at the element counts its frames are summed in (the caller's `sizes`), from the same cache
// as the runner's tables, or replayed from `replay` with the same refusal of another CPU's or commit's table (naming
// both) unless allow_foreign.
struct SumCalibrationInputs {
  DType dtype = DType::kF32;
  std::vector<uint64_t> sizes;  // elements; sorted and deduplicated here, zeros dropped
  std::optional<std::filesystem::path> replay;
  bool allow_foreign = false;
  std::optional<std::filesystem::path> cache_dir;  // nullopt: defaultCalibrationCache()
};
CalibrationOutcome calibrateSums(const SumCalibrationInputs& in);
CalibrationPlan planSums(DType dtype, std::vector<uint64_t> sizes);

// What the codecs are timed on, per tensor size: the gradient of the run's model at its initial parameters under
// kCalibrationSeed (not the run's seed) over the first batch_size examples of `data`; where two tensors share a size,
// the first in the model's order.
inline constexpr uint64_t kCalibrationSeed = 1;
std::map<uint64_t, std::vector<float>> codecCalibrationGradients(const experiments::Experiment& e,
                                                                 std::shared_ptr<const workloads::DataSplit> data);

// The pieces calibrate() is made of, for tests.
// One step of `codec` as calibration times it (calibration.cc, CodecStep): its rounds on `grad`, a CUSTOM codec's fold
// of info().world_size payloads (each this one's), then the decode as a run decodes; returns the decoded output.
std::vector<float> calibrationStepOutput(TensorCodec& codec, std::span<const float> grad);
// `pull_instance`: the parameter server's pull compressor's instance, for its phases (nullptr: none, or one phase).
CalibrationPlan planCalibration(const experiments::Experiment& e, const train::Workload& model,
                                const Compressor& compressor, const Compressor* pull_instance = nullptr);
std::shared_ptr<const sim::CostTable> makeCostTable(const CalibrationPlan& plan, const CalibrationTable& table);

}  // namespace terse::runner
