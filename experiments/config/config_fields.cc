// The experiment schema's fields, one table per section (config_table.h says what an entry holds), then the checks
// that span fields, each a named function with its message. experiment.proto says what a field means at length;
// here each field is named once with its default and the values it accepts, and that one entry fills the default,
// checks the value and writes its row of the README's field reference (`terse config reference`).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <system_error>
#include <unordered_set>

#include "core/plugin/loader.h"
#include "experiments/config/config_table.h"

namespace terse::experiments {
namespace table {
namespace {

// ---- When a section, a default or a check applies.
bool isCnn(const Experiment& e) {
  return e.workload().name() == "cnn";
}
bool isGlove(const Experiment& e) {
  return e.workload().name() == "glove";
}
bool isPyTorch(const Experiment& e) {
  return e.workload().name() == "pytorch";
}
bool torchvisionModel(const Experiment& e) {
  return e.workload().pytorch().has_torchvision();
}
bool syntheticTorchvision(const Experiment& e) {
  return torchvisionModel(e) && e.workload().pytorch().data() == PyTorch::SYNTHETIC;
}
bool notSsp(const Experiment& e) {
  return e.mode() != Experiment::SSP;
}
bool adamKind(const Experiment& e) {
  return e.optimizer().kind() == Optimizer::ADAM || e.optimizer().kind() == Optimizer::ADAMW;
}
bool stepSchedule(const Experiment& e) {
  return e.optimizer().schedule() == Optimizer::STEP;
}
bool hasTopology(const Experiment& e) {
  return e.simulation().has_topology();
}

constexpr When kCnn{"workload cnn", &isCnn};
constexpr When kGlove{"workload glove", &isGlove};
constexpr When kPyTorch{"workload pytorch", &isPyTorch};
constexpr When kTorchvision{"a torchvision model", &torchvisionModel};
constexpr When kSyntheticTorchvision{"a torchvision model on data SYNTHETIC", &syntheticTorchvision};
constexpr When kAdam{"kind ADAM or ADAMW", &adamKind};
constexpr When kNotSsp{"a mode other than SSP (SSP requires it)", &notSsp};
constexpr When kStep{"schedule STEP", &stepSchedule};
constexpr When kHasTopology{"simulation.topology set", &hasTopology};

// ---- Computed defaults.
std::string firstSeed(const Experiment& e) {
  return std::to_string(e.seeds_size() > 0 ? e.seeds(0) : 1);
}
// data.global_batch_size over the workers and their micro-batches; rounded down but at least 1 where it does not
// divide (rule `global-batch` then says so).
std::string batchSize(const Experiment& e) {
  if (!e.data().has_global_batch_size()) return "32";
  const int64_t share = int64_t{e.workers()} * std::max(1, e.gradient_accumulation_steps());
  return std::to_string(std::max<int64_t>(1, e.data().global_batch_size() / std::max<int64_t>(1, share)));
}
std::string linkBandwidth(const Experiment& e) {
  return e.link().bandwidth();
}
std::string linkLatency(const Experiment& e) {
  return e.link().latency();
}

// The calibrated table prices a simulation's kernel regions; a real-time run keeps the mode it always resolved to
// (unused there), so a real-time config resolves as it did before CALIBRATED existed.
std::string defaultCompute(const Experiment& e) {
  return e.clock() == Experiment::SIMULATED ? "CALIBRATED" : "MEASURED";
}

// ---- Rules of one string field.
void checkCalibrationPath(Checks& c, const std::string& path, const std::string& v) {
  if (v.empty())
    c.fail(path) << " must name a calibration.json (leave it unset to use the cache)";
  else if (v.size() > 4096)
    c.fail(path) << " is a path of " << v.size() << " bytes, above 4096";
}
void checkBindAddress(Checks& c, const std::string& path, const std::string& v) {
  for (char ch : v) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == ':' || ch == '-' || ch == '_')) {
      c.fail(path) << " '" << v << "' is not a host name or address";
      return;
    }
  }
}
void checkAllreduce(Checks& c, const std::string& path, const std::string& v) {
  std::string problem;
  if (!parseCollective(v, comm::parseAllreduceAlgorithm, comm::allreduceAlgorithmChoices(), problem))
    c.fail(path) << problem;
}
void checkAllgather(Checks& c, const std::string& path, const std::string& v) {
  std::string problem;
  if (!parseCollective(v, comm::parseAllgatherAlgorithm, comm::allgatherAlgorithmChoices(), problem))
    c.fail(path) << problem;
}
// The driver calls getattr(torchvision.models, name): a plain identifier, never an expression.
void checkTorchvision(Checks& c, const std::string& path, const std::string& v) {
  if (!std::all_of(v.begin(), v.end(),
                   [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; }))
    c.fail(path) << " must be a torchvision.models constructor name like \"resnet18\", got " << quoted(v);
  if (v.empty()) c.fail(path) << " is empty";
}

constexpr std::string_view kCpuOrCuda[] = {"cpu", "cuda"};
constexpr std::string_view kOneOrThree[] = {"1", "3"};

// ---- The sections. Experiment's own scalars first, then its messages in the order of experiment.proto.
constexpr Field kExperiment[] = {
    {.name = "study",
     .def = none("required"),
     .rule = folderName(),
     .doc = "Names the study; results go to "
            "<output_dir>/<study>/<variant>/."},
    {.name = "variant",
     .def = value(kBaseVariantName),
     .rule = folderName(),
     .doc = "Set by the loader; in a file only to name the base of a study without variants."},
    {.name = "workers",
     .def = value("1"),
     .rule = between(1, limits::kWorkers),
     .doc = "Data-parallel workers (ranks).",
     .note = " (the most `terse launch -n` starts and the simulator is studied at)"},
    {.name = "mode",
     .def = value("SYNC"),
     .rule = free("one the runner supports (rule `mode-supported`)"),
     .doc = "SYNC: allreduce / allgather every step; ASYNC, SSP: parameter server; HOGWILD: INPROC, lock-free."},
    {.name = "staleness_bound",
     .def = value("0", kNotSsp),
     .rule = between(0, limits::kStalenessBound),
     .doc = "SSP: how many steps a worker may run ahead of the slowest; 0 = lockstep. Required with SSP.",
     .if_set = true},
    {.name = "transport",
     .def = value("INPROC"),
     .rule = free("one the runner supports (rule `transport-supported`)"),
     .doc = "INPROC: ranks are threads (a PyTorch workload's: processes of this machine); TCP: one process per rank "
            "(`terse launch`); NCCL: one process per GPU."},
    {.name = "compute_jitter",
     .def = unfilled("0"),
     .rule = finite(between(0, limits::kComputeJitter)),
     .doc = "sigma: each worker's step compute x exp(sigma |Z|), Z ~ N(0, 1) seeded by (seed, worker, step); 0 = off.",
     .if_set = true},
    {.name = "error_feedback",
     .def = value("false"),
     .doc = "Error feedback around the compressor, by error_feedback_rule (EF: residual memory)."},
    {.name = "error_feedback_rule",
     .def = unfilled("EF"),
     .rule = enumValue(),
     .doc = "EF: residual memory; EF21: each rank's estimate of its gradient, the change to it sent (rule "
            "`error-feedback`).",
     .if_set = true},
    {.name = "ef21_momentum",
     .def = unfilled("1"),
     .rule = finite(above(0, 1)),
     .doc = "EF21-SGDM's eta: the estimates follow v = (1 - eta) v + eta g; 1 = plain EF21. With EF21 only.",
     .if_set = true},
    {.name = "compression_start_step",
     .def = unfilled("0"),
     .rule = between(0, limits::kCompressionStartStep),
     .doc = "Steps allreduced uncompressed (compressor none) before the compressor and its error feedback take over "
            "(rule `compression-start`).",
     .if_set = true},
    {.name = "max_groups_in_flight",
     .def = unfilled("1"),
     .rule = between(1, 64),
     .doc = "SYNC, host transports: scheduler groups whose collectives may be in flight at once within the credit.",
     .if_set = true},
    {.name = "plugin_timeout",
     .def = value("60s"),
     .rule = duration(3600, false),
     .doc = "How long one plugin call may run before its rank fails naming it; \"0s\" turns the watchdog off."},
    {.name = "trace",
     .def = unfilled("false"),
     .doc = "Per-rank Chrome trace trace.rank<R>.json in the results folder (`terse trace merge`)."},
    {.name = "step_trace",
     .def = unfilled("false"),
     .doc = "Per-rank step trace steps.rank<R>.jsonl in the results folder, for a replay at another scale."},
    {.name = "clock",
     .def = value("REAL_TIME"),
     .rule = enumValue(),
     .doc = "REAL_TIME: host time, links paced in real time; SIMULATED (INPROC): every time figure from SimGrid."},
    {.name = "sparse_gradients",
     .def = value("false"),
     .doc = "Row-sparse tensors (glove's) travel as (row ids, rows), outside the compressor."},
    {.name = "epochs", .def = value("1"), .rule = between(1, limits::kEpochs), .doc = "Passes over the training set."},
    {.name = "seed",
     .def = computed("1, or the first of `seeds`", &firstSeed),
     .doc = "Seeds data order, initialization and every compressor's random stream."},
    {.name = "seeds",
     .def = none("none: one run of `seed`"),
     .rule = free("no repeats (rule `seeds`)"),
     .doc = "Run each variant once per seed into <variant>/seed-<N>/; `terse compare` reports means and intervals."},
    {.name = "gradient_accumulation_steps",
     .def = unfilled("1"),
     .rule = between(1, limits::kGradientAccumulationSteps),
     .doc = "Micro-batches of data.batch_size per optimizer step, one communication per step.",
     .if_set = true},
    {.name = "output_dir", .def = value("results"), .rule = nonEmpty(), .doc = "Results root."},
};

constexpr Field kWorkload[] = {
    {.name = "name",
     .def = none("required"),
     .rule = free("one the runner knows (rule `workload-known`)"),
     .doc = "linear_regression, softmax, mlp, cnn, glove, or pytorch (a PyTorch model through terse's DDP hook)."},
    {.name = "hidden_sizes",
     .def = none("the workload's: mlp [256, 128], cnn none"),
     .rule = between(1, limits::kHiddenSize),
     .doc = "mlp: hidden layer widths; cnn: fully-connected layers before the "
            "classifier."},
    {.name = "conv_channels",
     .def = none("[8, 16] for cnn"),
     .rule = between(1, limits::kConvChannelsEach),
     .doc = "cnn only: output channels of its two convolutions (rule `cnn-only-fields`)."},
    {.name = "dropout",
     .def = value("0", kCnn),
     .rule = upTo(0, 1),
     .doc = "cnn only: dropout probability on the hidden layers in training.",
     .check_when = kCnn},
};

constexpr Field kGloveFields[] = {
    {.name = "corpus",
     .def = value("/usr/share/games/fortunes"),
     .rule = nonEmpty(" must name a text file or a directory of them"),
     .doc = "A text file, or a directory of them read in name order (Debian's `fortunes` by default)."},
    {.name = "window", .def = value("10"), .rule = between(1, 1000), .doc = "Context window, weighted 1/distance."},
    {.name = "vocab_size",
     .def = value("10000"),
     .rule = between(2, 1 << 24, {}, "2^24"),
     .doc = "Vocabulary cap: the most frequent words."},
    {.name = "min_count", .def = value("5"), .rule = atLeast(1), .doc = "Words rarer than this are dropped."},
    {.name = "dim", .def = value("50"), .rule = between(1, 4096), .doc = "Vector size."},
    {.name = "x_max",
     .def = value("100"),
     .rule = finite(above(0)),
     .doc = "Weighting f(x) = min(1, (x / x_max)^alpha)."},
    {.name = "alpha", .def = value("0.75"), .rule = above(0, 1), .doc = "The weighting's exponent."},
    {.name = "optimizer",
     .def = value("ADAGRAD"),
     .rule = enumValue(),
     .doc = "ADAGRAD (the paper's; optimizer.lr is its step) or SGD (the optimizer block)."},
    {.name = "test_fraction",
     .def = value("0.1"),
     .rule = upTo(0, 1),
     .doc = "Share of the nonzero counts held out for evaluation."},
    {.name = "cache_dir",
     .def = value(""),
     .doc = "Where the counts are cached; \"\" = $XDG_CACHE_HOME/terse, else $HOME/.cache/terse, else none."},
};

constexpr Field kPyTorchFields[] = {
    {.name = "torchvision",
     .def = none("one of torchvision, module"),
     .rule = custom(&checkTorchvision, "a torchvision.models constructor name"),
     .doc = "A constructor of torchvision.models, called with num_classes.",
     .if_set = true},
    {.name = "module",
     .def = none("one of torchvision, module"),
     .rule = nonEmpty(" is empty"),
     .doc = "A Python file (relative to the config) defining model() and data(rank, world).",
     .if_set = true},
    {.name = "data", .def = value("FASHION_MNIST", kTorchvision), .doc = "FASHION_MNIST or SYNTHETIC (random images)."},
    {.name = "image_size",
     .def = value("32", kTorchvision),
     .rule = between(8, 1024),
     .doc = "The input's side in "
            "pixels.",
     .if_set = true},
    {.name = "channels",
     .def = value("3", kTorchvision),
     .rule = oneOf(kOneOrThree),
     .doc = "Input channels.",
     .if_set = true},
    {.name = "num_classes",
     .def = value("10", kTorchvision),
     .rule = between(2, 100000),
     .doc = "Output classes.",
     .if_set = true},
    {.name = "synthetic_examples",
     .def = value("4096", kSyntheticTorchvision),
     .rule = between(1, limits::kSyntheticExamples, {}, "2^24"),
     .doc = "SYNTHETIC: training examples over all workers (the test set is a tenth of it).",
     .if_set = true},
    {.name = "max_steps_per_epoch",
     .def = value("0"),
     .rule = atLeast(0),
     .doc = "> 0: at most this many steps per epoch (each rank's shard cut); 0 = the whole shard."},
    {.name = "device",
     .def = value("cpu"),
     .rule = oneOf(kCpuOrCuda),
     .doc = "\"cuda\": rank r on device r mod the visible devices (NCCL)."},
    {.name = "find_unused_parameters",
     .def = value("false"),
     .doc = "DDP's find_unused_parameters: a model whose steps may leave parameters unused trains."},
    {.name = "loader_workers",
     .def = unfilled("0"),
     .rule = between(0, 64),
     .doc = "A module's Datasets: the DataLoader's worker processes; 0 reads in the rank's process.",
     .if_set = true},
};

constexpr Field kData[] = {
    {.name = "dataset_dir",
     .def = value(kDefaultDatasetDir),
     .rule = nonEmpty(),
     .doc = "Directory with the IDX files (Debian's dataset-fashion-mnist)."},
    {.name = "batch_size",
     .def = computed("32, or global_batch_size / (workers x gradient_accumulation_steps)", &batchSize),
     .rule = between(1, limits::kBatchSize),
     .doc = "Examples per worker per step; the global batch is workers x batch_size."},
    {.name = "global_batch_size",
     .def = none("none: batch_size is per worker"),
     .rule = between(1, limits::kGlobalBatchSize),
     .doc = "Examples per optimizer step over all workers; sets batch_size (rule `global-batch`).",
     .if_set = true},
    {.name = "train_subset",
     .def = value("0"),
     .rule = atLeast(0),
     .doc = "Only the first N training examples; 0 = all.",
     .note = " (0 = all)"},
    {.name = "test_subset",
     .def = value("0"),
     .rule = atLeast(0),
     .doc = "Evaluate on the first N test examples; 0 = "
            "all.",
     .note = " (0 = all)"},
    {.name = "partition",
     .def = unfilled("IID"),
     .rule = enumValue(),
     .doc = "IID: one reshuffle of the whole set per epoch, cut in shards; DIRICHLET: fixed non-IID shards (rule "
            "`data-partition`).",
     .if_set = true},
    {.name = "dirichlet_alpha",
     .def = none("required with DIRICHLET"),
     .rule = free("in [0.001, 1000] (rule `data-partition`)"),
     .doc = "The Dirichlet concentration of each worker's class mix: 0.1 strongly skewed, 100 near IID.",
     .if_set = true},
    {.name = "partition_seed",
     .def = none("the run's seed"),
     .rule = free("DIRICHLET; ignored by an explicit IID (rule `data-partition`)"),
     .doc = "The seed of the DIRICHLET draw; set it to keep one partition across `seeds` repeats.",
     .if_set = true},
};

// kind is written in for workload pytorch alone (the only one with a choice), so that the resolved configs of terse's
// own workloads, and the reference results' config.textproto, read as before it existed; unset reads SGD.
constexpr Field kOptimizer[] = {
    {.name = "kind",
     .def = value("SGD", kPyTorch),
     .rule = enumValue(),
     .doc = "SGD (every workload; unset = SGD), ADAM or ADAMW (torch.optim's, workload pytorch only: rule "
            "`optimizer-kind`).",
     .if_set = true},
    {.name = "beta1",
     .def = value("0.9", kAdam),
     .rule = upTo(0, 1),
     .doc = "ADAM, ADAMW: decay of the gradient's moving average (torch's betas[0]).",
     .if_set = true},
    {.name = "beta2",
     .def = value("0.999", kAdam),
     .rule = upTo(0, 1),
     .doc = "ADAM, ADAMW: decay of the squared gradient's moving average (torch's betas[1]).",
     .if_set = true},
    {.name = "eps",
     .def = value("1e-8", kAdam),
     .rule = finite(above(0)),
     .doc = "ADAM, ADAMW: added to the denominator against division by zero.",
     .if_set = true},
    {.name = "lr",
     .def = value("0.01"),
     .rule = finite(above(0)),
     .doc = "Learning rate (per worker's batch unless scale_lr_by_world_size)."},
    {.name = "momentum",
     .def = value("0"),
     .rule = upTo(0, 1),
     .doc = "SGD's heavy-ball momentum; 0 with momentum_correction (rule `momentum-correction`) and with ADAM, ADAMW."},
    {.name = "nesterov", .def = value("false"), .doc = "SGD's Nesterov momentum (rule `nesterov-needs-momentum`)."},
    {.name = "weight_decay",
     .def = value("0"),
     .rule = finite(atLeast(0)),
     .doc = "Weight decay: L2 with SGD and ADAM, decoupled with ADAMW."},
    {.name = "warmup_steps",
     .def = value("0"),
     .rule = atLeast(0),
     .doc = "Linear warm-up from 0 over this many steps (rule `warmup-once`)."},
    {.name = "warmup_epochs", .def = value("0"), .rule = finite(atLeast(0)), .doc = "Linear warm-up over epochs."},
    {.name = "schedule",
     .def = value("CONSTANT"),
     .rule = enumValue(),
     .doc = "STEP: lr x gamma at each milestone; COSINE: decay to 0 over the run, after warm-up."},
    {.name = "milestones",
     .def = none("none"),
     .rule = free("epochs >= 1, increasing (rule `step-milestones`)"),
     .doc = "STEP only: epochs at which lr is multiplied by gamma."},
    {.name = "gamma", .def = value("0.1"), .rule = above(0, 1), .doc = "STEP: the factor.", .check_when = kStep},
    {.name = "scale_lr_by_world_size",
     .def = value("false"),
     .doc = "Goyal et al.'s linear scaling rule: lr x workers."},
    {.name = "clip_grad_norm",
     .def = unfilled("0"),
     .rule = finite(atLeast(0)),
     .doc = "> 0: clip the aggregated gradient to this global L2 norm (torch's clip_grad_norm_); 0 = off."},
};

constexpr Field kTcp[] = {
    {.name = "timeout",
     .def = value("30s"),
     .rule = duration(limits::kTimeoutSeconds, true),
     .doc = "Connection setup, and how long a dead or silent peer takes to be declared failed."},
    {.name = "socket_buffer_bytes",
     .def = value("0"),
     .rule = between(0, limits::kSocketBufferBytes),
     .doc = "SO_SNDBUF / SO_RCVBUF per connection; 0 = the OS default (with autotuning)."},
    {.name = "bind_address",
     .def = value(""),
     .rule = custom(&checkBindAddress, "a host name or address"),
     .doc = "\"\" = TERSE_BIND_ADDR, else loopback for a loopback master, else every interface."},
};

constexpr Field kParameterServer[] = {
    {.name = "servers",
     .def = value("1"),
     .rule = between(1, limits::kServers),
     .doc = "Server shards (ranks 0 .. servers - 1); the parameters are split among them by key ranges."},
    {.name = "staleness_aware_lr", .def = value("false"), .doc = "Divide each push's learning rate by its staleness."},
    {.name = "pull_dtype", .def = value("F32"), .rule = enumValue(), .doc = "The dtype of pulled parameters."},
    {.name = "worker_timeout",
     .def = value("10s"),
     .rule = duration(limits::kTimeoutSeconds, true),
     .doc = "A worker silent this long is dropped; must exceed one step's compute."},
};

constexpr Field kWorkerSettings[] = {
    {.name = "worker",
     .def = none("required"),
     .rule = free("in [0, workers), each once (rule `worker-settings`)"),
     .doc = "Which worker."},
    {.name = "slowdown",
     .def = value("1"),
     .rule = finite(between(1, limits::kSlowdown)),
     .doc = "Compute-time factor of a straggler (every mode)."},
    {.name = "fail_after_steps",
     .def = value("0"),
     .rule = atLeast(0),
     .doc = "ASYNC, SSP, HOGWILD: stop dead after this many steps; 0 = never."},
};

// A resolved run has no grid (it is one point): these entries document the axes, which loadStudyText checks
// (experiments/config/grid.h) before the variants are resolved.
constexpr Field kGrid[] = {
    {.name = "path",
     .def = none("required"),
     .rule = free("a field --set sets; not study, variant(s), seed(s), output_dir, grid; no two axes overlap"),
     .doc = "The field the axis varies, as `--set` names it: workers, link.bandwidth, compressor.params.ratio."},
    {.name = "values",
     .def = none("required"),
     .rule = free("each as `--set PATH=VALUE` takes it; at least one, none twice, at most 100"),
     .doc = "Each variant runs once at each value (with the other axes': the product)."},
    {.name = "label",
     .def = none("the path's last part"),
     .rule = folderName(),
     .doc = "The axis in the runs' names: <variant>.<label>-<value>."},
};

constexpr Field kLink[] = {
    {.name = "bandwidth", .def = value("unlimited"), .rule = bandwidth(), .doc = "Per directed link."},
    {.name = "latency",
     .def = value("0"),
     .rule = duration(limits::kLatencySeconds, false),
     .doc = "One-way latency per link."},
    {.name = "nic", .def = value("unlimited"), .rule = bandwidth(), .doc = "Per-rank NIC egress, shared by its links."},
    {.name = "nic_ingress", .def = value("unlimited"), .rule = bandwidth(), .doc = "Per-rank NIC ingress."},
};

constexpr Field kLinkOverrides[] = {
    {.name = "src", .def = value("0"), .rule = free("a rank (rule `link-ranks`)"), .doc = "Sending rank."},
    {.name = "dst",
     .def = value("0"),
     .rule = free("a rank other than src (rule `link-ranks`)"),
     .doc = "Receiving rank; the last matching entry wins."},
    {.name = "bandwidth",
     .def = computed("link.bandwidth", &linkBandwidth),
     .rule = bandwidth(),
     .doc = "This link's bandwidth."},
    {.name = "latency",
     .def = computed("link.latency", &linkLatency),
     .rule = duration(limits::kLatencySeconds, false),
     .doc = "This link's latency."},
};

constexpr Field kCompressor[] = {
    {.name = "name",
     .def = value("none"),
     .rule = free("a plugin that loads with its params (rule `plugins`)"),
     .doc = "A plugin name (terse_compressor_<name>.so in the search path) or a path (contains '/' or ends in .so)."},
};

constexpr Field kPullCompressor[] = {
    {.name = "name",
     .def = value("none"),
     .rule = free("none, or a compressor a parameter server runs (rules `plugins`, `pull-compressor`)"),
     .doc = "Compressed pulls: each worker's pulls after its first send the change since its last one through this "
            "compressor, what it drops going with a later pull; none = pulls carry the parameters."},
};

constexpr Field kMomentumCorrection[] = {
    {.name = "factor",
     .def = value("0"),
     .rule = free("in [0, 1) (rule `momentum-correction`)"),
     .doc = "DGC momentum factor; 0 = off; implies error feedback."},
    {.name = "masking", .def = value("true"), .doc = "DGC momentum factor masking."},
    {.name = "nesterov", .def = value("false"), .doc = "DGC Nesterov variant."},
};

constexpr Field kLocalSgd[] = {
    {.name = "period",
     .def = value("0"),
     .rule = between(0, limits::kLocalSgdPeriod),
     .doc = "Steps between two model averagings (each worker steps on its own gradients between them; with "
            "qsr_alpha the shortest round); 0 = off: gradients allreduced every step. Also averaged at every "
            "evaluation point."},
    {.name = "start_step",
     .def = value("0"),
     .rule = between(0, limits::kLocalSgdStartStep),
     .doc = "Steps of synchronous SGD before the local steps begin (post-local SGD's warm-up)."},
    {.name = "outer_lr",
     .def = value("1"),
     .rule = free("finite, in (0, 100] (rule `local-sgd`)"),
     .doc = "The outer optimizer's step on the averaged change (DiLoCo, SlowMo); 1 with momentum 0 = plain "
            "averaging."},
    {.name = "outer_momentum",
     .def = value("0"),
     .rule = free("in [0, 1) (rule `local-sgd`)"),
     .doc = "The outer optimizer's momentum (SlowMo's slow momentum), kept alike on every rank."},
    {.name = "outer_nesterov",
     .def = value("false"),
     .doc = "Nesterov's form of the outer momentum (DiLoCo's outer optimizer); needs outer_momentum > 0."},
    {.name = "qsr_alpha",
     .def = value("0"),
     .rule = free("finite, >= 0; not over a warm-up (rule `local-sgd`)"),
     .doc = "The quadratic synchronization rule (Gu et al., ICLR 2024): rounds of max(period, floor((qsr_alpha / "
            "lr)^2)) steps, lr the rate before each round, so the period grows as the rate decays; 0 = every "
            "`period` steps."},
};

constexpr Field kScheduler[] = {
    {.name = "name",
     .def = value("fifo"),
     .rule = free("a plugin that loads with its params (rule `plugins`)"),
     .doc = "fifo, fusion (bucket_bytes), priority (partition_bytes, credit_bytes), or a path."},
};

constexpr Field kEval[] = {
    {.name = "every_steps",
     .def = value("0"),
     .rule = atLeast(0),
     .doc = "Evaluate every N optimizer steps; 0 = not by steps."},
    {.name = "per_epoch", .def = value("true"), .doc = "Evaluate at the end of every epoch (rule `eval-sometime`)."},
};

constexpr Field kSimulation[] = {
    {.name = "compute_scale",
     .def = value("1"),
     .rule = upTo(0, 1e6, "1e6"),
     .doc = "MEASURED: simulated seconds per measured CPU second (0.1 = a device ten times faster)."},
    {.name = "compute",
     .def = computed("CALIBRATED under clock SIMULATED, else MEASURED", &defaultCompute),
     .rule = enumValue(),
     .doc = "CALIBRATED: each kernel region charged its time from a table measured once per CPU and commit (rule "
            "`calibrated-clock`); MEASURED: the thread CPU time inside kernel regions x compute_scale; FLOP_MODEL: "
            "FLOP counts at flops_per_second."},
    {.name = "flops_per_second",
     .def = value("1e11"),
     .rule = between(limits::kMinFlopsPerSecond, limits::kMaxFlopsPerSecond),
     .doc = "FLOP_MODEL: the device's speed."},
    {.name = "calibration",
     .def = none("unset: the cache, measuring what it lacks"),
     .rule = custom(&checkCalibrationPath, "a calibration.json of at most 4096 bytes of path"),
     .doc = "CALIBRATED: replay this table (a results folder's calibration.json) instead of the cache (rule "
            "`calibration-replay`).",
     .if_set = true},
    {.name = "allow_foreign_calibration",
     .def = none("false"),
     .doc = "Replay a `calibration` measured on another CPU or commit; provenance records it (rule "
            "`calibration-replay`).",
     .if_set = true},
};

// Never filled: the preset fills what is unset, and an unset field keeps its meaning (core/sim/platform.h).
constexpr Field kTopology[] = {
    {.name = "preset",
     .def = none("none"),
     .rule = free("8xA100-4x200G, 8xH100-8x400G, 4xV100-1x100G (rule "
                  "`topology`)"),
     .doc = "Fills the fields below that are left unset."},
    {.name = "workers_per_node",
     .def = none("required unless a preset gives it"),
     .rule = atMost(limits::kWorkers),
     .doc = "Workers per node (blocks of consecutive ranks); >= 1 (rule `topology`).",
     .if_set = true},
    {.name = "intra_bandwidth",
     .def = unfilled("unlimited"),
     .rule = bandwidth(),
     .doc = "Per worker's link to its node's switch, each direction.",
     .if_set = true},
    {.name = "intra_latency",
     .def = unfilled("0"),
     .rule = duration(limits::kLatencySeconds, false),
     .doc = "One-way, within a node.",
     .if_set = true},
    {.name = "nic_bandwidth",
     .def = unfilled("unlimited"),
     .rule = bandwidth(),
     .doc = "Per NIC, each direction.",
     .if_set = true},
    {.name = "nic_latency",
     .def = unfilled("0"),
     .rule = duration(limits::kLatencySeconds, false),
     .doc = "One-way across the network.",
     .if_set = true},
    {.name = "nics_per_node",
     .def = unfilled("1"),
     .rule = atMost(limits::kNicsPerNode),
     .doc = "NICs per node.",
     .if_set = true},
    {.name = "oversubscription",
     .def = unfilled("1"),
     .rule = atMost(limits::kOversubscription),
     .doc = "Core (or leaf uplink) oversubscription; 1 = non-blocking; >= 1 (rule `topology`).",
     .if_set = true},
    {.name = "nodes_per_rack",
     .def = unfilled("0"),
     .rule = atMost(limits::kWorkers),
     .doc = "> 0: a leaf/spine fat-tree of racks of this many nodes; 0 = one core.",
     .if_set = true},
};

constexpr Field kCollectives[] = {
    {.name = "allreduce",
     .def = value("auto"),
     .rule = custom(&checkAllreduce,
                    "auto, ring, rd, hd, tree, "
                    "reduce_broadcast or hierarchical"),
     .doc = "Allreduce algorithm of the host transports (auto: the measured table of core/comm/allreduce_auto.h)."},
    {.name = "ranks_per_node",
     .def = none("the topology's workers_per_node, else 1"),
     .rule = free("in [1, workers] (rule `collectives-nodes`)"),
     .doc = "Workers per node for the hierarchical allreduce and allgather."},
    {.name = "allgather",
     .def = value("auto"),
     .rule = custom(&checkAllgather, "auto, ring, bruck or hierarchical"),
     .doc = "Allgatherv algorithm of the host transports."},
};

constexpr Section kSections[] = {
    {.path = "", .fields = kExperiment},
    {.path = "workload", .fields = kWorkload},
    {.path = "workload.glove",
     .when = kGlove,
     .fields = kGloveFields,
     .doc = "GloVe word vectors on a corpus's co-occurrence counts; for any other workload it must be left unset."},
    {.path = "workload.pytorch",
     .when = kPyTorch,
     .fields = kPyTorchFields,
     .doc = "A PyTorch model trained through terse's DDP hook (README \"Real models from a config\"); exactly one of "
            "torchvision and module."},
    {.path = "data", .fields = kData},
    {.path = "optimizer", .fields = kOptimizer},
    {.path = "tcp", .fields = kTcp, .doc = "Transport TCP only."},
    {.path = "parameter_server", .fields = kParameterServer, .doc = "Modes ASYNC and SSP."},
    {.path = "parameter_server.pull_compressor",
     .fields = kPullCompressor,
     .doc = "`params`: key/value strings the plugin validates. One round, SUM or ALLGATHER, host code."},
    {.path = "worker_settings[]",
     .fields = kWorkerSettings,
     .doc = "Per worker, for straggler and elasticity studies."},
    {.path = "grid[]",
     .fields = kGrid,
     .doc = "Study axes: every variant runs at every point of the axes' product, in <variant>.<label>-<value>... "
            "(`terse run --grid PATH=V1,V2`); `terse compare` tables each point against its baseline. At most 8 "
            "axes, variants x points at most 10000."},
    {.path = "link", .fields = kLink, .doc = "Emulated network between the ranks (unlimited and 0: no emulation)."},
    {.path = "link.overrides[]", .fields = kLinkOverrides, .doc = "Per directed link (src -> dst)."},
    {.path = "compressor", .fields = kCompressor, .doc = "`params`: key/value strings the plugin validates."},
    {.path = "momentum_correction", .fields = kMomentumCorrection},
    {.path = "local_sgd",
     .fields = kLocalSgd,
     .doc = "Mode SYNC on INPROC or TCP: periodic model averaging (local SGD) through the compressor and scheduler "
            "(workload pytorch: through terse.torch.LocalSGD, scheduler-free)."},
    {.path = "scheduler", .fields = kScheduler, .doc = "`params`: key/value strings the plugin validates."},
    {.path = "eval", .fields = kEval},
    {.path = "simulation", .fields = kSimulation, .doc = "Clock SIMULATED."},
    {.path = "simulation.topology",
     .when = kHasTopology,
     .fields = kTopology,
     .doc = "A two-level cluster instead of `link`'s mesh: nodes of workers, NICs to a core or a leaf/spine "
            "fat-tree."},
    {.path = "collectives", .fields = kCollectives, .doc = "Host transports (INPROC, TCP)."},
};

constexpr std::string_view kNotInTables[] = {
    "compressor.params",  // the plugin checks its own parameters (rule `plugins`)
    "parameter_server.pull_compressor.params",
    "scheduler.params",
    "variants",  // the study's structure: names checked by loadStudyText, overrides are Experiments
    // Set by the loader in each resolved run of a grid study, never by a file (grid.h).
    "grid_point.variant",
    "grid_point.coordinates[].path",
    "grid_point.coordinates[].label",
    "grid_point.coordinates[].value",
};

// ---- Checks across fields, each with its message.
using Ctx = RuleContext;

void workloadKnown(Checks& c, const Experiment& e, const Ctx& ctx) {
  const auto& known = ctx.options.workloads;
  const std::string& name = e.workload().name();
  if (name.empty()) {
    c.fail("workload.name") << " must be set" << (known.empty() ? "" : " (one of: " + joined(known) + ")");
  } else if (!known.empty() && std::find(known.begin(), known.end(), name) == known.end()) {
    c.fail("workload.name") << ": unknown workload " << quoted(name) << " (known: " << joined(known) << ")";
  }
}

// Fields a workload does not read are errors, not silently ignored settings.
void workloadOnlyFields(Checks& c, const Experiment& e, const Ctx&) {
  const auto& w = e.workload();
  if (w.name().empty()) return;
  if (w.name() == "cnn") {
    if (w.conv_channels_size() != 0 && w.conv_channels_size() != 2)
      c.fail("workload.conv_channels")
          << ": cnn has two convolutions, give 2 channel counts (or none for [8, 16]), got " << w.conv_channels_size();
  } else {
    if (w.conv_channels_size() > 0)
      c.fail("workload.conv_channels") << ": only workload cnn has convolutions, not " << quoted(w.name());
    if (w.has_dropout()) c.fail("workload.dropout") << ": only workload cnn has dropout, not " << quoted(w.name());
  }
  if (w.name() != "glove" && w.has_glove())
    c.fail("workload.glove") << ": only workload glove reads it, not " << quoted(w.name());
  if (w.name() != "pytorch" && w.has_pytorch())
    c.fail("workload.pytorch") << ": only workload pytorch reads it, not " << quoted(w.name());
}

void gloveOptimizer(Checks& c, const Experiment& e, const Ctx&) {
  if (!isGlove(e) || e.workload().glove().optimizer() != Glove::ADAGRAD) return;
  if (e.optimizer().momentum() != 0)
    c.fail("workload.glove.optimizer") << ": ADAGRAD takes no momentum, got optimizer.momentum "
                                       << e.optimizer().momentum();
  if (e.mode() == Experiment::HOGWILD)
    c.fail("workload.glove.optimizer") << ": mode HOGWILD applies plain SGD; use SGD";
}

// workload pytorch: the model block, and what a DDP run through terse's hook can honour (experiment.proto PyTorch).
void pytorchModel(Checks& c, const Experiment& e, const Ctx& ctx) {
  if (!isPyTorch(e)) return;
  const PyTorch& t = e.workload().pytorch();
  if (t.has_torchvision() == t.has_module())
    c.fail("workload.pytorch") << " must name exactly one model: torchvision (a torchvision.models constructor) or "
                                  "module (a Python file defining model() and data(rank, world))";
  if (t.has_module() && !t.module().empty() && ctx.options.module_dir) {
    std::filesystem::path file(t.module());
    if (file.is_relative()) file = *ctx.options.module_dir / file;
    file = file.lexically_normal();
    std::error_code ec;
    const auto type = std::filesystem::status(file, ec).type();
    if (type == std::filesystem::file_type::not_found)
      c.fail("workload.pytorch.module") << ": no file " << quoted(file.string())
                                        << (std::filesystem::path(t.module()).is_relative()
                                                ? " (the module is named relative to the config's folder)"
                                                : "");
    else if (type != std::filesystem::file_type::regular)
      c.fail("workload.pytorch.module") << ": " << quoted(file.string()) << " is not a file"
                                        << (ec ? " (" + ec.message() + ")" : "");
  }
  if (t.has_module()) {
    for (const char* field : {"data", "image_size", "channels", "num_classes", "synthetic_examples"}) {
      const auto* f = PyTorch::descriptor()->FindFieldByName(field);
      if (PyTorch::GetReflection()->HasField(t, f))
        c.fail(std::string("workload.pytorch.") + field)
            << ": a module's data(rank, world) gives its inputs; " << field << " is for torchvision models";
    }
  }
  // Every rank draws the whole synthetic set at once (terse/train.py ImageData), train and a tenth more for test.
  if (t.data() == PyTorch::SYNTHETIC && t.synthetic_examples() >= 1 &&
      t.synthetic_examples() <= limits::kSyntheticExamples && t.image_size() >= 1 && t.image_size() <= 1024) {
    const double bytes =
        1.1 * static_cast<double>(t.synthetic_examples()) * t.channels() * t.image_size() * t.image_size() * 4.0;
    if (bytes > limits::kSyntheticBytes)
      c.fail("workload.pytorch.synthetic_examples")
          << " " << t.synthetic_examples() << " images of " << t.channels() << "x" << t.image_size() << "x"
          << t.image_size() << " f32 take " << bytes / (1 << 30) << " GiB per rank (with the test tenth), at most "
          << limits::kSyntheticBytes / (1 << 30) << " GiB";
  }
  if (t.has_torchvision() && t.has_loader_workers())
    c.fail("workload.pytorch.loader_workers")
        << ": a torchvision model's data is held as tensors, read in each rank's "
           "process; loader_workers is for a module whose data() returns Datasets";
  if (t.has_synthetic_examples() && t.data() != PyTorch::SYNTHETIC)
    c.fail("workload.pytorch.synthetic_examples") << ": only data SYNTHETIC reads it";
  if (t.has_num_classes() && t.data() == PyTorch::FASHION_MNIST && t.num_classes() < 10)
    c.fail("workload.pytorch.num_classes") << ": Fashion-MNIST has 10 classes, got " << t.num_classes();
}

// What DDP and the hook do not have: refused rather than ignored.
void pytorchDdp(Checks& c, const Experiment& e, const Ctx&) {
  if (!isPyTorch(e)) return;
  if (e.workload().hidden_sizes_size() > 0)
    c.fail("workload.hidden_sizes") << ": workload pytorch's model is the pytorch block's, not terse's mlp";
  if (e.mode() != Experiment::SYNC)
    c.fail("mode") << ": workload pytorch trains with DistributedDataParallel, which is synchronous (mode SYNC)";
  if (e.transport() != Experiment::INPROC && e.transport() != Experiment::TCP)
    c.fail("transport") << ": workload pytorch runs its ranks as processes on this host (INPROC) or one per "
                           "`terse launch` process (TCP); NCCL is chosen by device \"cuda\"";
  if (e.clock() != Experiment::REAL_TIME)
    c.fail("clock") << ": workload pytorch runs in real time (REAL_TIME); the simulated clock needs terse's own "
                       "workloads";
  if (e.scheduler().name() != "fifo")
    c.fail("scheduler.name") << ": workload pytorch is scheduler-free (DDP buckets and orders the gradients), got "
                             << quoted(e.scheduler().name());
  if (e.has_link() && (e.link().bandwidth() != "unlimited" || e.link().latency() != "0" ||
                       e.link().nic() != "unlimited" || e.link().overrides_size() > 0))
    c.fail("link") << ": workload pytorch has no link emulation (torch.distributed's own transport carries it)";
  if (e.sparse_gradients()) c.fail("sparse_gradients") << ": workload pytorch's gradients are dense";
  if (e.gradient_accumulation_steps() > 1)
    c.fail("gradient_accumulation_steps") << ": workload pytorch takes one batch per step";
  if (e.worker_settings_size() > 0) c.fail("worker_settings") << ": workload pytorch has no per-worker settings";
  if (e.compute_jitter() != 0)
    c.fail("compute_jitter") << ": workload pytorch has no per-step compute jitter (its steps are torch's), got "
                             << e.compute_jitter();
}

void sparseGradients(Checks& c, const Experiment& e, const Ctx&) {
  if (e.sparse_gradients() && e.mode() == Experiment::HOGWILD)
    c.fail("sparse_gradients") << ": mode HOGWILD sends nothing (its workers write one shared vector in memory); "
                                  "row-sparse tensors travel in modes SYNC, ASYNC and SSP (leave it false)";
  if (e.sparse_gradients() && e.transport() == Experiment::NCCL)
    c.fail("sparse_gradients") << ": transport NCCL trains on the GPU, whose tensors are dense (leave it false)";
}

// The kind of update and the fields only one kind reads. terse's own workloads step with core's SGD (with ADAGRAD for
// glove's own choice); Adam is torch.optim's, in workload pytorch's driver.
void optimizerKind(Checks& c, const Experiment& e, const Ctx&) {
  const Optimizer& o = e.optimizer();
  const bool adam = adamKind(e);
  const std::string kind = Optimizer::Kind_Name(o.kind());
  if (adam && !e.workload().name().empty() && !isPyTorch(e))
    c.fail("optimizer.kind") << ": " << kind << " is for workload pytorch only (torch.optim's); terse's own workloads ("
                             << quoted(e.workload().name()) << ") implement SGD";
  if (adam) {
    if (o.momentum() != 0)
      c.fail("optimizer.momentum") << " is SGD's heavy-ball momentum, got " << o.momentum() << " with kind " << kind
                                   << ", whose moving average of the gradient is beta1: leave momentum 0";
    if (o.nesterov()) c.fail("optimizer.nesterov") << " is SGD's, got true with kind " << kind << ": leave it false";
    return;
  }
  for (const auto& [field, set] :
       {std::pair{"beta1", o.has_beta1()}, std::pair{"beta2", o.has_beta2()}, std::pair{"eps", o.has_eps()}}) {
    if (set)
      c.fail(std::string("optimizer.") + field)
          << ": only kind ADAM and ADAMW read it, got kind " << (o.has_kind() ? kind : "SGD (unset)");
  }
}

void nesterovNeedsMomentum(Checks& c, const Experiment& e, const Ctx&) {
  // With ADAM and ADAMW nesterov is refused whatever the momentum (rule optimizer-kind).
  if (e.optimizer().nesterov() && e.optimizer().momentum() == 0 && !adamKind(e))
    c.fail("optimizer.nesterov") << " needs optimizer.momentum > 0";
}

void warmupOnce(Checks& c, const Experiment& e, const Ctx&) {
  const auto& o = e.optimizer();
  if (o.warmup_steps() > 0 && o.warmup_epochs() > 0)
    c.fail("optimizer.warmup_epochs") << ": set warm-up in steps or in epochs, not both (warmup_steps "
                                      << o.warmup_steps() << ", warmup_epochs " << o.warmup_epochs() << ")";
}

void stepMilestones(Checks& c, const Experiment& e, const Ctx&) {
  const auto& o = e.optimizer();
  if (o.schedule() != Optimizer::STEP) {
    if (!o.milestones().empty())
      c.fail("optimizer.milestones") << " only apply with schedule STEP, got schedule "
                                     << Optimizer::Schedule_Name(o.schedule());
    return;
  }
  if (o.milestones().empty()) c.fail("optimizer.milestones") << " must list at least one epoch for schedule STEP";
  for (int i = 0; i < o.milestones_size(); ++i) {
    const std::string p = "optimizer.milestones[" + std::to_string(i) + "]";
    if (o.milestones(i) < 1) {
      c.fail(p) << " must be >= 1, got " << o.milestones(i);
    } else if (i > 0 && o.milestones(i) <= o.milestones(i - 1)) {
      c.fail(p) << " must be greater than the one before (" << o.milestones(i - 1) << "), got " << o.milestones(i);
    }
  }
}

template <typename T, typename Name>
std::string names(const std::vector<T>& values, Name name_of) {
  std::vector<std::string> out;
  for (auto v : values) out.push_back(name_of(v));
  return joined(out);
}

void modeSupported(Checks& c, const Experiment& e, const Ctx& ctx) {
  const auto& modes = ctx.options.modes;
  if (std::find(modes.begin(), modes.end(), e.mode()) == modes.end())
    c.fail("mode") << ": " << Experiment::Mode_Name(e.mode()) << " is not supported by this runner (supported: "
                   << names(modes, [](auto m) { return Experiment::Mode_Name(m); }) << ")";
}

void stalenessNeedsSsp(Checks& c, const Experiment& e, const Ctx&) {
  if (e.staleness_bound() > 0 && e.mode() != Experiment::SSP)
    c.fail("staleness_bound") << " only applies with mode SSP, got mode " << Experiment::Mode_Name(e.mode());
  // Left to a default, SSP would run in lockstep (s = 0, SYNC through the parameter server) under SSP's name. Said of
  // `mode`, the field that was set (in the file, or by --set mode=SSP, which the message then names).
  if (e.mode() == Experiment::SSP && !e.has_staleness_bound())
    c.fail("mode") << ": SSP needs staleness_bound set: how many steps a worker may run ahead of the slowest, e.g. "
                      "staleness_bound: 2 (0 is lockstep, the parameter server's BSP)";
}

bool asyncMode(const Experiment& e) {
  return e.mode() == Experiment::ASYNC || e.mode() == Experiment::SSP || e.mode() == Experiment::HOGWILD;
}

// Hogwild shares one parameter vector in memory: there is nothing to compress and no wire.
void hogwild(Checks& c, const Experiment& e, const Ctx&) {
  if (e.mode() != Experiment::HOGWILD) return;
  if (e.transport() != Experiment::INPROC)
    c.fail("transport") << ": mode HOGWILD shares memory between threads and needs INPROC, got "
                        << Experiment::Transport_Name(e.transport());
  if (e.compressor().name() != "none")
    c.fail("compressor.name") << ": mode HOGWILD sends nothing to compress, got '" << e.compressor().name() << "'";
  if (e.error_feedback()) c.fail("error_feedback") << ": mode HOGWILD sends nothing to compress";
  if (e.optimizer().momentum() > 0)
    c.fail("optimizer.momentum") << ": mode HOGWILD applies plain SGD (lock-free shared parameters have no agreed "
                                    "momentum buffer), got "
                                 << e.optimizer().momentum();
}

void traceSyncOnly(Checks& c, const Experiment& e, const Ctx&) {
  if (asyncMode(e) && e.trace()) c.fail("trace") << ": timelines are recorded in mode SYNC only";
}

void stepTraceSyncOnly(Checks& c, const Experiment& e, const Ctx&) {
  if (!e.step_trace()) return;
  // Async workers run no scheduler groups; the format has room for them (mode "async") once they are traced.
  if (asyncMode(e))
    c.fail("step_trace") << ": step traces are recorded in mode SYNC only, got mode "
                         << Experiment::Mode_Name(e.mode());
}

void groupsInFlight(Checks& c, const Experiment& e, const Ctx&) {
  if (e.max_groups_in_flight() > 1 && e.mode() != Experiment::SYNC)
    c.fail("max_groups_in_flight") << ": groups are the sync trainer's; mode " << Experiment::Mode_Name(e.mode())
                                   << " has none (leave it unset)";
  if (e.max_groups_in_flight() > 1 && e.transport() == Experiment::NCCL)
    c.fail("max_groups_in_flight") << ": transport NCCL runs one collective at a time on its stream (leave it unset)";
}

// The parameter server and Hogwild apply each worker's gradient as it arrives: a worker accumulates its own
// micro-batches and pushes (applies) once, and clips its own gradient before that (AsyncTrainerOptions). NCCL's
// workloads keep their gradients on the device, where the trainer does not accumulate or clip.
void accumulateAndClip(Checks& c, const Experiment& e, const Ctx&) {
  const double clip = e.optimizer().clip_grad_norm();
  for (const auto& [field, set] : {std::pair{"gradient_accumulation_steps", e.gradient_accumulation_steps() > 1},
                                   std::pair{"optimizer.clip_grad_norm", clip > 0}}) {
    if (set && e.transport() == Experiment::NCCL)
      c.fail(field) << ": transport NCCL keeps gradients on the device; it needs INPROC or TCP";
    // Mode SYNC applies row-sparse tensors as their rows arrive (SyncTrainer::runSparse): not accumulated, not in the
    // norm. A parameter-server worker accumulates and clips its own gradient before the push, rows and all.
    if (set && e.sparse_gradients() && !asyncMode(e))
      c.fail(field) << ": sparse_gradients applies each row-sparse tensor as its rows arrive, with no accumulated "
                       "step or global norm; set one of the two";
  }
}

// The simulated cluster runs the in-process threads (sync trainer, parameter server shards and workers) as SimGrid
// actors; other processes or GPUs keep real time, and so do Hogwild's threads, whose lock-free races happen between
// threads running at the same instant (actors run one at a time).
void simulatedClock(Checks& c, const Experiment& e, const Ctx&) {
  if (e.clock() != Experiment::SIMULATED) return;
  if (e.transport() != Experiment::INPROC)
    c.fail("clock") << ": SIMULATED simulates the in-process cluster and needs transport INPROC, got "
                    << Experiment::Transport_Name(e.transport()) << " (which runs in real time)";
  if (e.mode() == Experiment::HOGWILD)
    c.fail("clock") << ": SIMULATED runs modes SYNC, ASYNC and SSP; mode HOGWILD's lock-free races need threads "
                       "running at once and run in real time (clock REAL_TIME)";
}

bool linksEmulated(const Experiment& e) {
  try {
    return emulationConfig(e).enabled();
  } catch (const Error&) {
    return true;  // a malformed link value is reported under its own field; it still asks for emulation
  }
}

// The whole topology (preset filled in) is validated once its fields hold, each under its own name.
void topologyRule(Checks& c, const Experiment& e, const Ctx&) {
  if (!hasTopology(e)) return;
  if (e.clock() != Experiment::SIMULATED)
    c.fail("simulation.topology") << ": a topology is built for the simulated cluster (clock SIMULATED); the "
                                     "real-time emulation paces the per-link model of `link`";
  Checks fields;
  checkSection(fields, e, "simulation.topology");
  if (fields.take().empty()) {
    try {
      topology(e).validate();
    } catch (const Error& err) {
      c.fail("simulation.topology") << ": " << untagged(err);
    }
  }
  if (linksEmulated(e))
    c.fail("link") << ": simulation.topology describes the network; leave link (and its overrides) unset";
}

void collectivesNodes(Checks& c, const Experiment& e, const Ctx&) {
  const auto& co = e.collectives();
  if (co.has_ranks_per_node()) {
    const int per = co.ranks_per_node();
    if (per < 1 || per > std::max(1, e.workers()))
      c.fail("collectives.ranks_per_node") << " must be in [1, workers = " << e.workers() << "], got " << per;
  }
  if (co.has_ranks_per_node() || hasTopology(e)) return;
  if (comm::parseAllreduceAlgorithm(co.allreduce()) == comm::AllreduceAlgorithm::kHierarchical)
    c.fail("collectives.allreduce") << ": 'hierarchical' needs collectives.ranks_per_node (or a simulation "
                                       "topology) to know the nodes";
  if (comm::parseAllgatherAlgorithm(co.allgather()) == comm::AllgatherAlgorithm::kHierarchical)
    c.fail("collectives.allgather") << ": 'hierarchical' needs collectives.ranks_per_node (or a simulation "
                                       "topology) to know the nodes";
}

void workerSettingsRule(Checks& c, const Experiment& e, const Ctx&) {
  checkWorkerSettings(c, e);
}

void transportSupported(Checks& c, const Experiment& e, const Ctx& ctx) {
  const auto& transports = ctx.options.transports;
  if (std::find(transports.begin(), transports.end(), e.transport()) == transports.end()) {
    c.fail("transport") << ": " << Experiment::Transport_Name(e.transport())
                        << " is not supported by this runner (supported: "
                        << names(transports, [](auto t) { return Experiment::Transport_Name(t); }) << ")"
                        << (e.transport() == Experiment::NCCL
                                ? ": NCCL needs a terse built with CUDA and NCCL (nvcc and libnccl found when "
                                  "configuring)"
                                : "");
  }
}

// One process per GPU, gradients kept on the device: bulk-synchronous only (the parameter server runs over TCP), a
// model with a CUDA version, and no emulated links (NCCL runs at the hardware's speed).
void nccl(Checks& c, const Experiment& e, const Ctx& ctx) {
  const auto& transports = ctx.options.transports;
  if (e.transport() != Experiment::NCCL ||
      std::find(transports.begin(), transports.end(), Experiment::NCCL) == transports.end())
    return;
  if (e.mode() != Experiment::SYNC)
    c.fail("mode") << ": transport NCCL runs mode SYNC (the parameter server modes run over TCP), got "
                   << Experiment::Mode_Name(e.mode());
  const auto& cw = ctx.options.cuda_workloads;
  if (std::find(cw.begin(), cw.end(), e.workload().name()) == cw.end())
    c.fail("workload.name") << ": transport NCCL trains on the GPU, and '" << e.workload().name()
                            << "' has no CUDA version (those with one: " << joined(cw) << ")";
  if (e.workload().name() == "cnn" && (e.workload().hidden_sizes_size() > 0 || e.workload().dropout() > 0))
    c.fail("workload.hidden_sizes") << ": transport NCCL trains on the GPU, whose cnn has no hidden layers or "
                                       "dropout yet (cnn_cuda.h); leave hidden_sizes and dropout unset";
  // Resolved defaults spell "no emulation" as unlimited bandwidth and zero latency.
  if (linksEmulated(e))
    c.fail("link") << ": emulated links apply to the host transports (INPROC, TCP); transport NCCL runs at the "
                      "hardware's speed, so leave link unset";
}

void linkRanks(Checks& c, const Experiment& e, const Ctx&) {
  if (e.workers() >= 1) checkLinkRanks(c, e);
}

bool parameterServerMode(const Experiment& e) {
  return e.mode() == Experiment::ASYNC || e.mode() == Experiment::SSP;
}

// The compressor's role under local SGD: its aggregate is applied as the models' mean change, and after a phase of
// gradient steps its state would carry gradients into parameter deltas.
table::PluginRole compressorRole(const Experiment& e) {
  if (parameterServerMode(e)) return table::PluginRole::kParameterServerCompressor;
  if (e.local_sgd().period() == 0)
    return e.error_feedback() && e.error_feedback_rule() == Experiment::EF21 ? table::PluginRole::kEf21Compressor
                                                                             : table::PluginRole::kCompressor;
  return e.local_sgd().start_step() > 0 ? table::PluginRole::kPostLocalSgdCompressor
                                        : table::PluginRole::kLocalSgdCompressor;
}

void plugins(Checks& c, const Experiment& e, const Ctx& ctx) {
  ctx.plugin(c, "compressor", e.compressor(), compressorRole(e), ctx.plugin_state);
  ctx.plugin(c, "scheduler", e.scheduler(), table::PluginRole::kScheduler, ctx.plugin_state);
  if (e.parameter_server().pull_compressor().name() != "none")
    ctx.plugin(c, "parameter_server.pull_compressor", e.parameter_server().pull_compressor(),
               table::PluginRole::kParameterServerCompressor, ctx.plugin_state);
}

// Delta pulls exist on a parameter server, replace the pull dtype's cast, and carry dense pieces only.
void pullCompressor(Checks& c, const Experiment& e, const Ctx&) {
  const std::string& name = e.parameter_server().pull_compressor().name();
  if (name == "none") {
    // `none` is no plugin here (pulls carry the parameters), so nothing else would read them: a grid over the params
    // of a forgotten name would run the same dense pulls under several names.
    if (!e.parameter_server().pull_compressor().params().empty())
      c.fail("parameter_server.pull_compressor.params") << ": pull compressor none (pulls carry the parameters) takes "
                                                           "no parameters; name the compressor they are for";
    return;
  }
  if (!parameterServerMode(e))
    c.fail("parameter_server.pull_compressor.name")
        << " " << quoted(name) << " in mode " << Experiment::Mode_Name(e.mode())
        << ": pulls exist in modes ASYNC and SSP (the parameter server's); leave it unset";
  if (e.parameter_server().pull_dtype() != ParameterServer::F32)
    c.fail("parameter_server.pull_dtype")
        << " " << ParameterServer::PullDtype_Name(e.parameter_server().pull_dtype()) << " beside pull_compressor "
        << quoted(name) << ": the compressor decides what travels down; leave pull_dtype F32";
  if (e.sparse_gradients())
    c.fail("parameter_server.pull_compressor.name")
        << " " << quoted(name)
        << " with sparse_gradients: row-sparse tensors travel as rows, outside every compressor; leave one unset";
}

// Non-IID shards split a classifier's labels (core/train/label_partition.h), on every rank alike.
void dataPartition(Checks& c, const Experiment& e, const Ctx&) {
  const Data& d = e.data();
  if (d.partition() != Data::DIRICHLET) {
    // An explicit IID ignores them (a study's IID variant of a DIRICHLET base cannot unset the base's alpha), but an
    // alpha must still be one a DIRICHLET variant could take.
    if (d.partition() == Data::IID) {
      if (d.has_dirichlet_alpha() && !(d.dirichlet_alpha() >= 0.001 && d.dirichlet_alpha() <= 1000))
        c.fail("data.dirichlet_alpha") << " must be in [0.001, 1000], got " << d.dirichlet_alpha();
      return;
    }
    for (const auto& [field, set] :
         {std::pair{"dirichlet_alpha", d.has_dirichlet_alpha()}, std::pair{"partition_seed", d.has_partition_seed()}}) {
      if (set)
        c.fail(std::string("data.") + field)
            << " with partition unset (IID): only partition DIRICHLET reads it; set partition: DIRICHLET, or "
               "partition: IID to keep it aside";
    }
    return;
  }
  if (!d.has_dirichlet_alpha())
    c.fail("data.partition") << " DIRICHLET needs data.dirichlet_alpha (0.1 strongly skewed, 100 near IID)";
  else if (!(d.dirichlet_alpha() >= 0.001 && d.dirichlet_alpha() <= 1000))
    c.fail("data.dirichlet_alpha") << " must be in [0.001, 1000], got " << d.dirichlet_alpha();
  const std::string& name = e.workload().name();
  if (isPyTorch(e)) {
    // The driver splits Fashion-MNIST's labels as the native runner does (terse.Recipe); a module's data(rank, world)
    // is already each rank's own, and synthetic labels are noise.
    if (e.workload().pytorch().has_module())
      c.fail("data.partition") << " DIRICHLET with workload.pytorch.module: its data(rank, world) gives each rank its "
                                  "own data, so split it there";
    else if (syntheticTorchvision(e))
      c.fail("data.partition") << " DIRICHLET with workload.pytorch.data SYNTHETIC: random labels have no classes "
                                  "worth splitting by; use data FASHION_MNIST";
  } else if (!name.empty() && name != "softmax" && name != "mlp" && name != "cnn") {
    c.fail("data.partition") << " DIRICHLET splits a classifier's labels; workload " << quoted(name)
                             << " has none (softmax, mlp, cnn and pytorch's torchvision models on Fashion-MNIST do)";
  }
}

// Local SGD averages the models through the sync trainer's pipelines (sync_trainer.h, "Local SGD"): host memory, one
// exchange per averaging; workload pytorch's driver through terse.torch.LocalSGD, with the same schedule and rules.
void localSgd(Checks& c, const Experiment& e, const Ctx&) {
  const LocalSgd& l = e.local_sgd();
  if (!(std::isfinite(l.outer_lr()) && l.outer_lr() > 0 && l.outer_lr() <= 100))
    c.fail("local_sgd.outer_lr") << " must be finite and in (0, 100], got " << l.outer_lr();
  if (!(l.outer_momentum() >= 0 && l.outer_momentum() < 1))
    c.fail("local_sgd.outer_momentum") << " must be in [0, 1), got " << l.outer_momentum();
  if (l.outer_nesterov() && l.outer_momentum() == 0)
    c.fail("local_sgd.outer_nesterov") << " needs local_sgd.outer_momentum > 0 (Nesterov's form of a momentum)";
  if (!(std::isfinite(l.qsr_alpha()) && l.qsr_alpha() >= 0))
    c.fail("local_sgd.qsr_alpha") << " must be finite and >= 0, got " << l.qsr_alpha();
  if (l.period() == 0) {
    for (const auto& [field, set] :
         {std::pair{"start_step", l.start_step() > 0}, std::pair{"outer_lr", l.outer_lr() != 1},
          std::pair{"outer_momentum", l.outer_momentum() != 0}, std::pair{"outer_nesterov", l.outer_nesterov()},
          std::pair{"qsr_alpha", l.qsr_alpha() != 0}}) {
      if (set)
        c.fail(std::string("local_sgd.") + field)
            << " with period 0: local SGD is off; set local_sgd.period or leave " << field << " unset";
    }
    return;
  }
  const std::string what = "local_sgd.period " + std::to_string(l.period());
  // A warm-up's rates rise from near 0, where the rule asks for the longest rounds: the paper's runs begin their local
  // steps after it (post-local SGD), and so must these.
  if (l.qsr_alpha() > 0 && e.optimizer().warmup_epochs() > 0)
    c.fail("local_sgd.qsr_alpha") << " " << l.qsr_alpha() << " with optimizer.warmup_epochs "
                                  << e.optimizer().warmup_epochs()
                                  << ": the warm-up's small rates would ask for the longest rounds first; give the "
                                     "warm-up as optimizer.warmup_steps and set local_sgd.start_step to at least it";
  if (l.qsr_alpha() > 0 && l.start_step() < e.optimizer().warmup_steps())
    c.fail("local_sgd.qsr_alpha") << " " << l.qsr_alpha() << " with local_sgd.start_step " << l.start_step()
                                  << " inside optimizer.warmup_steps " << e.optimizer().warmup_steps()
                                  << ": the warm-up's small rates would ask for the longest rounds first; set "
                                     "local_sgd.start_step to at least "
                                  << e.optimizer().warmup_steps() << " (post-local SGD)";
  if (e.mode() != Experiment::SYNC)
    c.fail("local_sgd.period") << " " << l.period() << " in mode " << Experiment::Mode_Name(e.mode())
                               << ": local SGD averages synchronous replicas (mode SYNC)";
  if (e.transport() == Experiment::NCCL)
    c.fail("local_sgd.period") << " " << l.period()
                               << " on transport NCCL: the local steps run on the host; use INPROC or TCP";
  if (e.sparse_gradients())
    c.fail("sparse_gradients") << " with " << what
                               << ": row-sparse tensors are applied as their rows arrive; leave one unset";
  if (l.start_step() > 0 && e.error_feedback())
    c.fail("error_feedback") << " with local_sgd.start_step " << l.start_step()
                             << ": the residual of the gradient steps would be added to the parameter deltas the "
                                "local phase averages; use start_step 0 (Qsparse-local-SGD) or no error feedback";
  if (e.momentum_correction().factor() > 0)
    c.fail("momentum_correction.factor")
        << " " << e.momentum_correction().factor() << " with " << what
        << ": DGC's momentum would run over the averagings' deltas (an outer momentum, while the local steps, which "
           "it requires to have optimizer.momentum 0, get none); use local_sgd.outer_momentum, or error_feedback "
           "alone";
}

// EF21 keeps the sum of every rank's estimate from the aggregate each rank decodes (core/compress/ef21.h), so it needs
// a step that decodes one on every rank, of gradients; its momentum belongs to it alone.
void errorFeedback(Checks& c, const Experiment& e, const Ctx&) {
  const bool ef21 = e.error_feedback_rule() == Experiment::EF21;
  if (e.has_ef21_momentum() && e.ef21_momentum() != 1 && !ef21)
    c.fail("ef21_momentum") << " " << e.ef21_momentum() << " with error_feedback_rule "
                            << (e.has_error_feedback_rule()
                                    ? Experiment::ErrorFeedbackRule_Name(e.error_feedback_rule())
                                    : std::string("unset (EF)"))
                            << ": the momentum is EF21-SGDM's; set error_feedback_rule: EF21 or leave ef21_momentum "
                               "unset";
  if (!ef21) return;
  // The table's range lets through what rounds to 0 as a float, whose momentum would never move (Ef21 refuses it).
  if (e.has_ef21_momentum() && e.ef21_momentum() > 0 && !(static_cast<float>(e.ef21_momentum()) > 0.0f))
    c.fail("ef21_momentum") << " " << e.ef21_momentum() << " rounds to 0 as a float: the momentum would never move";
  if (!e.error_feedback())
    c.fail("error_feedback_rule") << " EF21 with error_feedback false: the rule says which error feedback "
                                     "error_feedback turns on; set error_feedback: true";
  if (e.mode() != Experiment::SYNC)
    c.fail("error_feedback_rule") << " EF21 in mode " << Experiment::Mode_Name(e.mode())
                                  << ": every rank keeps the sum of the ranks' estimates from the step's aggregate, "
                                     "which only mode SYNC decodes on every rank; use mode SYNC or rule EF";
  if (e.local_sgd().period() > 0)
    c.fail("error_feedback_rule") << " EF21 with local_sgd.period " << e.local_sgd().period()
                                  << ": EF21's estimates follow each rank's gradient, and local SGD's averagings "
                                     "compress parameter deltas; use rule EF (Qsparse-local-SGD) or no local SGD";
  // EF21-SGDM's v is the step's momentum, as DGC's is (rule `momentum-correction`): the paper's server steps plainly
  // on the mean of the estimates. A second momentum in the optimizer compounds with it: the quickstart's MLP with
  // eta 0.1 under SGD momentum 0.9 stayed at chance for 10 epochs, and learned with momentum 0.
  if (e.has_ef21_momentum() && e.ef21_momentum() < 1) {
    if (e.optimizer().momentum() > 0)
      c.fail("ef21_momentum") << " " << e.ef21_momentum() << " needs optimizer.momentum 0, got "
                              << e.optimizer().momentum()
                              << ": EF21-SGDM's momentum is the step's momentum, and a second one compounds with it; "
                                 "set optimizer.momentum 0, or leave ef21_momentum unset (plain EF21)";
    if (adamKind(e))
      c.fail("ef21_momentum") << " " << e.ef21_momentum() << " with optimizer kind "
                              << Optimizer::Kind_Name(e.optimizer().kind())
                              << ": EF21-SGDM's momentum is the step's momentum, and Adam's beta1 would average it "
                                 "again; use kind SGD, or ef21_momentum 1 (plain EF21)";
  }
  if (e.momentum_correction().factor() > 0)
    c.fail("error_feedback_rule") << " EF21 with momentum_correction.factor " << e.momentum_correction().factor()
                                  << ": DGC's velocity is error feedback's residual, which EF21 does not keep; use "
                                     "ef21_momentum for EF21-SGDM's momentum, or rule EF";
}

// The dense warm-up switches codecs at a step (sync_trainer.h, "Dense warm-up"): it needs a step that every rank
// aggregates at once, of gradients, and a compressor that carries no momentum of its own.
void compressionStart(Checks& c, const Experiment& e, const Ctx&) {
  const int64_t start = e.compression_start_step();
  if (start == 0) return;
  if (e.mode() != Experiment::SYNC)
    c.fail("compression_start_step") << " " << start << " in mode " << Experiment::Mode_Name(e.mode())
                                     << ": the switch to the compressor is a step every rank aggregates at once, "
                                        "which only mode SYNC has; use mode SYNC or leave compression_start_step 0";
  if (e.local_sgd().period() > 0)
    c.fail("compression_start_step") << " " << start << " with local_sgd.period " << e.local_sgd().period()
                                     << ": local SGD's gradient steps before local_sgd.start_step are its warm-up; "
                                        "set that instead";
  if (e.momentum_correction().factor() > 0)
    c.fail("compression_start_step")
        << " " << start << " with momentum_correction.factor " << e.momentum_correction().factor()
        << ": DGC's momentum lives in the compressor's decorator, which the dense steps do not run, and "
           "optimizer.momentum must be 0 beside it, so they would have no momentum at all; use optimizer.momentum "
           "with error_feedback, or leave compression_start_step 0";
}

void momentumCorrection(Checks& c, const Experiment& e, const Ctx&) {
  try {
    // EF21's options, which validateCodecOptions checks too, have rule `error-feedback` and their own fields.
    CodecOptions dgc = codecOptions(e);
    dgc.error_feedback_rule = ErrorFeedbackRule::kEf;
    validateCodecOptions(dgc);
  } catch (const Error& err) {
    c.fail("momentum_correction.factor") << ": " << untagged(err);
  }
  if (e.momentum_correction().factor() > 0 && e.optimizer().momentum() > 0) {
    c.fail("momentum_correction.factor") << " " << e.momentum_correction().factor()
                                         << " needs optimizer.momentum 0, got " << e.optimizer().momentum()
                                         << ": DGC's momentum correction carries the momentum itself";
  }
  if (e.momentum_correction().factor() > 0 && adamKind(e)) {
    c.fail("momentum_correction.factor") << " " << e.momentum_correction().factor() << " with optimizer kind "
                                         << Optimizer::Kind_Name(e.optimizer().kind())
                                         << ": DGC's momentum correction accumulates the momentum before the "
                                            "compressor for plain SGD to apply, and Adam's own moving average (beta1) "
                                            "would apply it a second time; use kind SGD, or leave the factor 0 "
                                            "(error_feedback alone suits Adam)";
  }
}

// A global batch is split evenly: every worker takes batch_size examples per micro-batch. A batch_size the file gave
// beside it (the default was not computed from it) must be that share.
void globalBatch(Checks& c, const Experiment& e, const Ctx&) {
  // A workers count out of range has its own message (and would divide by zero here).
  if (!e.data().has_global_batch_size() || e.workers() < 1) return;
  const int64_t global = e.data().global_batch_size();
  const int accumulation = std::max(1, e.gradient_accumulation_steps());
  const int64_t share = int64_t{e.workers()} * accumulation;
  const std::string over = "workers (" + std::to_string(e.workers()) + ") x gradient_accumulation_steps (" +
                           std::to_string(accumulation) + ")";
  if (global % share != 0) {
    c.fail("data.global_batch_size") << " " << global << " is not a multiple of " << over << " = " << share;
  } else if (e.data().batch_size() != global / share) {
    c.fail("data.batch_size") << " " << e.data().batch_size() << " is not data.global_batch_size " << global << " / "
                              << over << " = " << global / share << "; give one of the two";
  }
}

void evalSometime(Checks& c, const Experiment& e, const Ctx&) {
  if (e.eval().every_steps() == 0 && !e.eval().per_epoch())
    c.fail("eval.per_epoch") << ": false with eval.every_steps 0 would never evaluate";
}

// The calibrated table prices the kernel regions of a simulation; a real-time run (any transport) and a TCP or NCCL
// run take the time their kernels take and cannot honour it.
void calibratedClock(Checks& c, const Experiment& e, const Ctx&) {
  if (e.simulation().compute() == Simulation::CALIBRATED && e.clock() != Experiment::SIMULATED)
    c.fail("simulation.compute") << ": CALIBRATED charges the kernels of a simulated run (clock SIMULATED, transport "
                                    "INPROC); clock "
                                 << Experiment::Clock_Name(e.clock()) << " with transport "
                                 << Experiment::Transport_Name(e.transport()) << " runs in real time";
}

void calibrationReplay(Checks& c, const Experiment& e, const Ctx&) {
  const Simulation& sim = e.simulation();
  if (sim.has_calibration() && sim.compute() != Simulation::CALIBRATED)
    c.fail("simulation.calibration") << ": a table is replayed by compute CALIBRATED, got compute "
                                     << Simulation::Compute_Name(sim.compute());
  if (sim.allow_foreign_calibration() && !sim.has_calibration())
    c.fail("simulation.allow_foreign_calibration") << ": true only applies to a replayed simulation.calibration";
}

void seedsRule(Checks& c, const Experiment& e, const Ctx&) {
  checkSeeds(c, e);
}

constexpr CrossRule kRules[] = {
    {"workload-known", "workload.name", "a workload the runner does not implement (or none)", &workloadKnown},
    {"cnn-only-fields", "workload.conv_channels, dropout, glove, pytorch",
     "cnn without exactly 2 conv_channels; conv_channels or dropout for another workload; a glove or pytorch block "
     "for another workload",
     &workloadOnlyFields},
    {"glove-adagrad", "workload.glove.optimizer, optimizer.momentum, mode",
     "ADAGRAD with momentum, or in mode HOGWILD (plain SGD)", &gloveOptimizer},
    {"pytorch-model", "workload.pytorch",
     "not exactly one of torchvision and module; a module that is not a file (named relative to the config's "
     "folder); a module with the image fields; "
     "a synthetic set over 16 GiB per rank; synthetic_examples without data "
     "SYNTHETIC; fewer than 10 classes on Fashion-MNIST",
     &pytorchModel},
    {"pytorch-ddp",
     "mode, transport, clock, scheduler, link, sparse_gradients, gradient_accumulation_steps, "
     "worker_settings, workload.hidden_sizes",
     "workload pytorch with what DDP through the hook cannot honour: not SYNC, NCCL, SIMULATED, a scheduler but fifo, "
     "link emulation, sparse gradients, accumulation, per-worker settings, hidden_sizes",
     &pytorchDdp},
    {"sparse-gradients", "sparse_gradients, mode, transport", "sparse_gradients in mode HOGWILD or on NCCL",
     &sparseGradients},
    {"optimizer-kind", "optimizer.kind, momentum, nesterov, beta1, beta2, eps, workload.name",
     "ADAM or ADAMW for a workload but pytorch, or with momentum or nesterov; beta1, beta2 or eps with SGD",
     &optimizerKind},
    {"nesterov-needs-momentum", "optimizer.nesterov, momentum", "nesterov with momentum 0", &nesterovNeedsMomentum},
    {"warmup-once", "optimizer.warmup_epochs, warmup_steps", "warm-up given in both steps and epochs", &warmupOnce},
    {"step-milestones", "optimizer.milestones, schedule",
     "STEP without milestones, a milestone < 1 or not above the one before; milestones without STEP", &stepMilestones},
    {"mode-supported", "mode", "a mode the runner does not implement", &modeSupported},
    {"staleness-needs-ssp", "staleness_bound, mode", "staleness_bound > 0 outside mode SSP; SSP without it",
     &stalenessNeedsSsp},
    {"error-feedback",
     "error_feedback_rule, ef21_momentum, error_feedback, mode, local_sgd.period, momentum_correction.factor, "
     "optimizer.momentum, kind, compressor.name",
     "EF21 without error_feedback, outside mode SYNC, with local SGD, momentum correction or a compressor with "
     "CUSTOM aggregation (rule `plugins`); ef21_momentum without EF21, or below 1 with optimizer.momentum or ADAM",
     &errorFeedback},
    {"compression-start", "compression_start_step, mode, local_sgd.period, momentum_correction.factor",
     "compression_start_step outside mode SYNC, with local SGD or with momentum correction", &compressionStart},
    {"hogwild", "transport, compressor.name, error_feedback, optimizer.momentum, mode",
     "mode HOGWILD with a transport but INPROC, a compressor, error feedback or momentum", &hogwild},
    {"trace-sync-only", "trace, mode", "trace in modes ASYNC, SSP, HOGWILD", &traceSyncOnly},
    {"step-trace-sync-only", "step_trace, mode", "step_trace in modes ASYNC, SSP, HOGWILD", &stepTraceSyncOnly},
    {"groups-in-flight", "max_groups_in_flight, mode, transport", "max_groups_in_flight > 1 outside SYNC or on NCCL",
     &groupsInFlight},
    {"accumulate-and-clip", "gradient_accumulation_steps, optimizer.clip_grad_norm, transport, sparse_gradients",
     "accumulation or clipping on NCCL, or beside sparse_gradients in mode SYNC", &accumulateAndClip},
    {"simulated-clock", "clock, transport, mode", "clock SIMULATED with a transport but INPROC, or in mode HOGWILD",
     &simulatedClock},
    {"calibrated-clock", "simulation.compute, clock, transport", "compute CALIBRATED without clock SIMULATED",
     &calibratedClock},
    {"calibration-replay", "simulation.calibration, allow_foreign_calibration, compute",
     "a calibration table under a compute mode but CALIBRATED; allow_foreign_calibration without a table",
     &calibrationReplay},
    {"topology", "simulation.topology, clock, link",
     "a topology without clock SIMULATED, one core/sim/platform.h's validate() refuses, or beside link emulation",
     &topologyRule},
    {"collectives-nodes", "collectives.ranks_per_node, allreduce, allgather",
     "ranks_per_node outside [1, workers]; a hierarchical algorithm without ranks_per_node or a topology",
     &collectivesNodes},
    {"worker-settings", "worker_settings[].worker, fail_after_steps, workers, mode",
     "a worker unset, outside [0, workers) or listed twice; fail_after_steps in mode SYNC", &workerSettingsRule},
    {"transport-supported", "transport", "a transport the runner does not implement", &transportSupported},
    {"nccl", "mode, workload.name, workload.hidden_sizes, link",
     "transport NCCL outside SYNC, for a workload without a CUDA version, a cnn with hidden layers or dropout, or "
     "with link emulation",
     &nccl},
    {"link-ranks", "link.overrides[].src, dst, workers", "a rank outside the job's, or src = dst", &linkRanks},
    {"plugins",
     "compressor.name, compressor.params, scheduler.name, scheduler.params, parameter_server.pull_compressor.name, "
     "mode",
     "a plugin that does not load or instantiate with its params; in modes ASYNC and SSP a compressor or pull "
     "compressor a parameter server cannot decode alone (several rounds, CUSTOM aggregation, no host code)",
     &plugins},
    {"pull-compressor",
     "parameter_server.pull_compressor.name, params, mode, parameter_server.pull_dtype, sparse_gradients",
     "a pull compressor outside modes ASYNC and SSP, beside a pull_dtype but F32, or with sparse_gradients; params "
     "for none",
     &pullCompressor},
    {"data-partition", "data.partition, dirichlet_alpha, partition_seed, workload.name, workload.pytorch",
     "DIRICHLET without an alpha in [0.001, 1000] or for a workload without classes (not softmax, mlp, cnn, or "
     "pytorch's "
     "torchvision models on Fashion-MNIST); an alpha or a partition seed with partition unset",
     &dataPartition},
    {"local-sgd",
     "local_sgd.period, start_step, outer_lr, outer_momentum, outer_nesterov, qsr_alpha, mode, transport, "
     "sparse_gradients, error_feedback, momentum_correction.factor, optimizer.warmup_steps, warmup_epochs",
     "local SGD outside mode SYNC, on NCCL, with sparse_gradients or momentum correction; start_step, an outer "
     "optimizer or qsr_alpha without a period; outer_lr outside (0, 100], outer_momentum outside [0, 1), "
     "outer_nesterov without momentum; qsr_alpha negative or not finite, or with start_step inside the warm-up or "
     "with warmup_epochs; a compressor with CUSTOM aggregation; start_step > 0 with error feedback or a stateful "
     "compressor (rule `plugins`)",
     &localSgd},
    {"momentum-correction", "momentum_correction.factor, optimizer.momentum, optimizer.kind",
     "a factor outside [0, 1) (the codec's check), or beside optimizer momentum or kind ADAM, ADAMW",
     &momentumCorrection},
    {"eval-sometime", "eval.per_epoch, every_steps", "no evaluation at all", &evalSometime},
    {"global-batch", "data.global_batch_size, batch_size, workers, gradient_accumulation_steps",
     "a global batch that workers x gradient_accumulation_steps do not divide, or a batch_size beside it that is not "
     "its share",
     &globalBatch},
    {"seeds", "seeds, seed", "more than 100 seeds, a seed twice, or seed not among seeds", &seedsRule},
};

}  // namespace

std::span<const Section> sections() {
  return kSections;
}
std::span<const CrossRule> rules() {
  return kRules;
}
std::span<const std::string_view> notInTables() {
  return kNotInTables;
}

}  // namespace table

void checkLinkRanks(Checks& c, const Experiment& e) {
  // A parameter server's shards are ranks too (the first ones), and their links are emulated like the workers'.
  const int ranks = jobRanks(e);
  const std::string range = usesParameterServer(e) ? "servers + workers = " : "workers = ";
  for (int i = 0; i < e.link().overrides_size(); ++i) {
    const auto& o = e.link().overrides(i);
    const std::string p = "link.overrides[" + std::to_string(i) + "]";
    if (o.src() < 0 || o.src() >= ranks)
      c.fail(p + ".src") << " must be in [0, " << range << ranks << "), got " << o.src();
    if (o.dst() < 0 || o.dst() >= ranks)
      c.fail(p + ".dst") << " must be in [0, " << range << ranks << "), got " << o.dst();
    if (o.src() == o.dst()) c.fail(p + ".dst") << " must differ from src, got " << o.dst() << " for both";
  }
}

// worker_settings against the workers and the mode (also after --workers changed the count); each entry's own
// ranges are the table's.
void checkWorkerSettings(Checks& c, const Experiment& e) {
  const bool async_mode = table::asyncMode(e);
  // The workers listed so far: a set of the entries, not a flag per worker, so the work follows the list's length
  // whatever `workers` says.
  std::unordered_set<int32_t> listed;
  listed.reserve(static_cast<std::size_t>(e.worker_settings_size()));
  for (int i = 0; i < e.worker_settings_size(); ++i) {
    const auto& w = e.worker_settings(i);
    const std::string p = "worker_settings[" + std::to_string(i) + "]";
    if (!w.has_worker()) {
      c.fail(p + ".worker") << " must be set";
    } else if (w.worker() < 0 || w.worker() >= e.workers()) {
      c.fail(p + ".worker") << " must be in [0, workers = " << e.workers() << "), got " << w.worker();
    } else if (!listed.insert(w.worker()).second) {
      c.fail(p + ".worker") << ": worker " << w.worker() << " is listed twice";
    }
    if (w.fail_after_steps() > 0 && !async_mode)
      c.fail(p + ".fail_after_steps") << ": a failed worker stops a " << Experiment::Mode_Name(e.mode())
                                      << " run; only ASYNC, SSP and HOGWILD go on without it";
  }
}

// Repeats: at most limits::kSeeds, none twice (a hash map: --seeds lists come here without the file's bound), and
// `seed`, when given beside them, one of them.
void checkSeeds(Checks& c, const Experiment& e) {
  if (e.seeds_size() > limits::kSeeds) {
    // --seeds comes here without the file's list limit; the rest would only repeat the count's error.
    c.fail("seeds") << " lists " << e.seeds_size() << " seeds, at most " << limits::kSeeds;
    return;
  }
  std::unordered_map<uint64_t, int> first;  // seed -> its first entry
  for (int i = 0; i < e.seeds_size(); ++i) {
    if (const auto [it, inserted] = first.emplace(e.seeds(i), i); !inserted) {
      c.fail("seeds") << ": entry " << i << " repeats entry " << it->second << " (" << e.seeds(i)
                      << "): a seed run twice gives the same numbers twice, which "
                         "narrows the interval without measuring anything";
    }
  }
  if (e.seeds_size() > 0 && !first.contains(e.seed())) {
    std::string list;
    for (const uint64_t s : e.seeds()) list += (list.empty() ? "" : ", ") + std::to_string(s);
    c.fail("seed") << " " << e.seed() << " is not one of seeds [" << list
                   << "]: with seeds, give seed only to name one of them (or leave it out)";
  }
}

}  // namespace terse::experiments
