// Loading an experiment config (DESIGN.md section 7): a .textproto file of experiment.proto's Experiment is parsed,
// checked as a whole, and turned into one resolved Experiment per variant, before anything trains. A config error found
// an hour into a study costs the hour, so every check that can run up front does: syntax, types and enum names
// (protobuf's text parser), values and their combinations, link emulation strings (the comm parsers), and the plugins
// themselves (loaded and instantiated with their parameters, so a misspelt name or a bad `ratio` fails here) -- those
// of every variant, or of the variants a run selected (ConfigOptions::plugin_variants).
//
// Every problem is reported as "FILE:LINE:COL: message" when the file says where it is (always for parse errors; for
// semantic errors the line of the field that holds the bad value), else "FILE: message". Messages name the field path
// and the value, e.g.
//   quickstart.textproto:14:5: optimizer.lr must be > 0, got -0.1
//   quickstart.textproto:40:7: variants[2] ("topk-ef").compressor.name: compressor 'topk2' not found: ...
// A semantic error in a field a variant set is prefixed with that variant; one in a base field is reported once, not
// once per variant.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <google/protobuf/text_format.h>

#include "core/comm/host_communicator.h"
#include "core/comm/link_emulation.h"
#include "core/common/error.h"
#include "core/compress/make_codec.h"
#include "core/plugin/compressor.h"
#include "core/sim/platform.h"
#include "experiments/config/experiment.pb.h"
#include "experiments/config/field_override.h"
#include "experiments/config/limits.h"

namespace terse {
class PluginLoader;
}

namespace terse::experiments {

inline constexpr std::string_view kDefaultDatasetDir = "/usr/share/datasets/fashion-mnist";
inline constexpr std::string_view kBaseVariantName = "base";

// A config that cannot run. what() lists every error; errors() has them one per entry, each already prefixed with the
// file (and line and column where known).
class ConfigError : public InvalidArgument {
 public:
  ConfigError(const std::string& message, std::string source, std::vector<std::string> errors)
      : InvalidArgument(message), source_(std::move(source)), errors_(std::move(errors)) {}
  const std::string& source() const noexcept { return source_; }
  const std::vector<std::string>& errors() const noexcept { return errors_; }

 private:
  std::string source_;
  std::vector<std::string> errors_;
};

// What the caller knows that the schema does not. config does not depend on experiments/workloads or the trainer;
// they pass their names and abilities in.
struct ConfigOptions {
  // Workload names the runner implements; empty = workload.name is only checked to be non-empty.
  std::vector<std::string> workloads;
  // Of those, the ones with a CUDA version: what transport NCCL (which trains on the GPU) accepts.
  std::vector<std::string> cuda_workloads;
  // Resolves and instantiates compressor and scheduler plugins with their params. Null = names only checked to be
  // non-empty (for tools that read results without running anything).
  PluginLoader* loader = nullptr;
  // The variants (Experiment.variant, as --variant names them) whose plugins `loader` loads; empty = every variant's.
  // The others are checked as without a loader, every field but the plugins' existence and params, so that a variant
  // naming a plugin this machine lacks does not stop another from running, while a typo anywhere still fails.
  std::vector<std::string> plugin_variants;
  // Scheduler names served without a plugin file (accepted without loading anything, params must be empty). Empty by
  // default: every scheduler, the default "fifo" included, is a plugin from schedulers/ loaded by name.
  std::vector<std::string> builtin_schedulers;
  // The modes and transports the runner implements; the schema reserves more.
  std::vector<Experiment::Mode> modes{Experiment::SYNC};
  std::vector<Experiment::Transport> transports{Experiment::INPROC};
  // The folder a relative workload.pytorch.module is named from (the config's; `terse run` and terse.Recipe set it):
  // set, the module must be a file there, so that a misspelt path fails with the config's errors rather than in every
  // rank of every variant, and the resolved experiments name it by its absolute, canonical path (config.cc,
  // settlePyTorchPaths). Unset (a config given as text, as in tests), the module is neither looked for nor rewritten.
  std::optional<std::filesystem::path> module_dir;
  // `--set PATH=VALUE` (field_override.h), applied in order to every variant once merged (every one in
  // plugin_variants, when that is set: resolveVariants), before defaults and checks, so each gets the checks a value
  // in the file gets; its lists and strings are bounded as the file's are. A message about an overridden field names
  // the override ("--set optimizer.lr=-1: optimizer.lr must be > 0, got -1") instead of a line of the file, once for
  // the variants it holds in alike.
  std::vector<FieldOverride> overrides;
  // `--grid PATH=V1,V2,...` (grid.h parseGridOption), in order: axes added to the file's grid, or replacing the values
  // of the file's axis of that PATH. Checked with the file's axes; messages name the option.
  std::vector<std::string> grid;
};

// A loaded study: the file as parsed, and the experiments to run, in variant order, each resolved (merged, defaults
// filled, `variants` cleared, `variant` set) and validated.
struct Study {
  std::string source;  // the name messages use for the file
  Experiment file;
  std::vector<Experiment> experiments;
};

// Parses text-format `text` into an Experiment. Throws ConfigError with "SOURCE:LINE:COL: message" for a syntax error,
// an unknown field, a value of the wrong type, an unknown enum name (protobuf's parser stops at the first), messages
// nested deeper than limits::kNesting, or text longer than limits::kConfigBytes. `tree`, when given, receives the
// location of every field for later messages.
Experiment parseConfigText(std::string_view text, const std::string& source,
                           google::protobuf::TextFormat::ParseInfoTree* tree = nullptr);

// Reads, parses, resolves and validates. Throws InvalidArgument when the file cannot be read, ConfigError listing every
// problem otherwise (the first kMaxReportedErrors of them). `source` in messages is the path as given. The work is
// linear in the file's size: lists and strings are bounded (limits.h) before the variants are resolved.
inline constexpr std::size_t kMaxReportedErrors = 100;
Study loadStudy(const std::filesystem::path& path, const ConfigOptions& options);
Study loadStudyText(std::string_view text, const std::string& source, const ConfigOptions& options);

// Merges a variant's overrides onto `base` by the rules at the top of experiment.proto: protobuf's MergeFrom, except
// that a non-empty repeated field or map replaces the base's and a PluginSpec replaces the base's whole PluginSpec.
void mergeOverrides(Experiment& base, const Experiment& overrides);

// Fills every unset field with its default (the field tables of config_fields.cc, which experiment.proto's comments
// and the README's reference repeat), so a resolved config written out says everything the run used.
void applyDefaults(Experiment& experiment);

// The field reference of experiments/configs/README.md in Markdown: every section's fields with their defaults, the
// values they accept and what they mean, then the checks across fields, all from the tables that fill and check them.
std::string configReference();
// `text` (a README) with its generated reference, between the marker lines configReference's section starts and ends
// with, replaced by configReference(). Throws InvalidArgument naming `source` when the markers are missing.
std::string withConfigReference(std::string_view text, const std::string& source);

// One experiment per variant (the base alone, named `variant` or "base", when there are none), or with a grid one per
// variant and point (grid.h: variant-major, named "<variant>.<label>-<value>...", grid_point set, grid cleared):
// merged, placed at its point, overridden by `overrides` in order, and defaulted, not validated. With `only` (the
// variants a run selected, by the file's name or a point's), the overrides go to those alone: the others, which will
// not run, are resolved as the file has them, so an override they would refuse (a compressor parameter, a momentum a
// DGC variant cannot take) does not stop the run. Assumes variant names are present and unique and the grid valid
// (loadStudy checks that first; a bad grid throws ConfigError).
std::vector<Experiment> resolveVariants(const Experiment& file, const std::vector<FieldOverride>& overrides = {},
                                        const std::vector<std::string>& only = {});

// The most entries the repeated field or map `field` of experiment.proto may hold in a config (limits.h), or -1 for
// one without a limit (tests/config checks that every list of the schema has one).
int listLimit(const google::protobuf::FieldDescriptor& field);

// Semantic checks of one resolved experiment; each entry is "PATH message" (e.g. "optimizer.lr must be > 0, got
// -0.1") or "PATH: message" (for a plugin's or parser's own message), without file or variant.
std::vector<std::string> validateExperiment(const Experiment& experiment, const ConfigOptions& options);

// Text format, fields in schema order, for the results folder. parseConfigText of it gives back an equal message.
std::string toText(const Experiment& experiment);
// Writes toText(experiment) to `path` (replacing it). Throws InvalidArgument when it cannot.
void writeResolvedConfig(const Experiment& experiment, const std::filesystem::path& path);

// --variant NAME (repeatable): the experiments named, in the order given; no names = all. A grid study's variant is
// named by the file's name (every point of it, in grid order) or by a point's ("topk.workers-8"). Throws
// InvalidArgument naming the unknown variant and listing the study's.
std::vector<Experiment> selectVariants(const Study& study, const std::vector<std::string>& names);

// Repeats (experiment.proto's `seeds`): each experiment once per seed in its `seeds`, in list order, with `seed` set
// to it (the list kept); an experiment without `seeds` once, as it is.
std::vector<Experiment> expandRepeats(const std::vector<Experiment>& experiments);
// Runs that train the same thing under different names: their resolved configs are equal but for `variant` and the
// fields the run ignores (data.dirichlet_alpha and partition_seed without partition DIRICHLET). A grid axis over a
// field some variant ignores makes them, as do override values that parse alike (0.1 and 0.10). One message per group
// of such runs, naming their folders (resultsSubfolder), in run order; empty when every run is its own.
std::vector<std::string> sameRunWarnings(const std::vector<Experiment>& runs);
// Whether the run of `e` is among `selected` (a run's --variant list: the file's variant names, or a grid point's);
// an empty list selects every run.
bool isSelected(const std::vector<std::string>& selected, const Experiment& e);
// Study and variant names become folders under output_dir: [A-Za-z0-9._-], not "." or "..". Anything else could
// escape it or collide. Public because terse.torch's ResultsLogger takes its names from Python keywords, not from a
// config, and must refuse what a config would (experiments/python/hook_results.cc).
inline bool isFolderName(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}
// Where under <root>/<study>/ a run writes its results: the variant's name, or "<variant>/seed-<seed>" for one of a
// set of repeats (results/compare/reader.h reads both).
std::string resultsSubfolder(const Experiment& experiment);
// A repeat's folder under its study: "<variant>/seed-<seed>" (resultsSubfolder's, for a study that lists seeds).
std::string repeatSubfolder(const std::string& variant, uint64_t seed);

// --seeds LIST: replaces every experiment's `seeds` by LIST (and `seed` by its first), so a one-seed study runs as
// repeats (`scripts/run --seeds 1,2,3`); call before expandRepeats. Throws InvalidArgument for an empty list,
// ConfigError for a seed listed twice or more than the config allows.
void overrideSeeds(std::vector<Experiment>& experiments, std::span<const uint64_t> seeds,
                   const std::string& source = "--seeds");

// Modes ASYNC and SSP: a parameter server whose shards are ranks before the workers'.
inline bool usesParameterServer(const Experiment& e) {
  return e.mode() == Experiment::ASYNC || e.mode() == Experiment::SSP;
}
// Ranks of the job: the workers, plus the parameter server's shards in ASYNC and SSP.
inline int jobRanks(const Experiment& e) {
  return e.workers() + (usesParameterServer(e) ? e.parameter_server().servers() : 0);
}

// worker_settings of one worker, or the defaults (slowdown 1, never fails) when it has none.
inline WorkerSettings workerSettings(const Experiment& e, int worker) {
  for (const auto& w : e.worker_settings())
    if (w.worker() == worker) return w;
  WorkerSettings d;
  d.set_worker(worker);
  d.set_slowdown(1);
  d.set_fail_after_steps(0);
  return d;
}

// The pieces the runner hands to core, from a resolved (validated) experiment.
comm::EmulationConfig emulationConfig(const Experiment& experiment);
// simulation.topology with its preset applied (disabled when unset).
sim::TwoLevelTopology topology(const Experiment& experiment);
// The host transports' collective options: collectives.allreduce, allgather and ranks_per_node (or the topology's node
// size).
comm::HostCommOptions hostCommOptions(const Experiment& experiment);
CodecOptions codecOptions(const Experiment& experiment);
// Which error feedback `error_feedback` turns on, as runs are labelled (`terse run --dry-run`, `terse compare`'s
// error_feedback_rule): "EF", "EF21", or "EF21 eta=<ef21_momentum>" for EF21-SGDM. Whether it is on is the caller's
// to ask.
std::string errorFeedbackRuleLabel(const Experiment& experiment);
Params pluginParams(const PluginSpec& spec);  // sorted by key, so the plugin sees the same order every run

}  // namespace terse::experiments
