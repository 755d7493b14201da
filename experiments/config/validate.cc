// Validation of a resolved experiment (config.h's validateExperiment): each field's range and the combinations the
// runners refuse, as "path message" strings that loadStudyText turns into file:line errors.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/plugin/loader.h"
#include "experiments/config/config.h"
#include "experiments/config/config_checks.h"

namespace terse::experiments {
namespace {

namespace pb = google::protobuf;

// Repeats per variant (limits::kSeeds): enough for any interval a table reports, few enough that a typo (a range
// pasted in) fails.
constexpr int kMaxSeeds = limits::kSeeds;

void checkSizeList(Checks& c, const std::string& path, const pb::RepeatedField<int32_t>& values, int32_t most) {
  for (int i = 0; i < values.size(); ++i) {
    if (values[i] < 1) {
      c.fail(path + "[" + std::to_string(i) + "]") << " must be >= 1, got " << values[i];
    } else if (values[i] > most) {
      c.fail(path + "[" + std::to_string(i) + "]") << " must be at most " << most << ", got " << values[i];
    }
  }
}

// A count's ceiling (limits.h); the floor the schema states is checked beside it, with its own message.
template <typename T, typename L>
void checkAtMost(Checks& c, const std::string& path, T value, L most, std::string_view why = {}) {
  if (value > most) c.fail(path) << " must be at most " << most << ", got " << value << why;
}

// A duration string (comm::parseDuration) no longer than max_s, and above 0 when `positive`. The limit keeps every
// conversion of it (to a clock's int64 nanoseconds, to milliseconds) in range; the parser refuses not-a-number and
// infinity.
void checkDuration(Checks& c, const std::string& path, const std::string& text, double max_s, bool positive) {
  try {
    const double s = comm::parseDuration(text, max_s);
    if (positive && !(s > 0)) c.fail(path) << " must be > 0, got '" << text << "'";
  } catch (const Error& e) {
    c.fail(path) << ": " << untagged(e);
  }
}

// A bandwidth string (comm::parseBandwidth): unlimited, or a rate in [kMinBandwidthBps, kMaxBandwidthBps].
void checkBandwidth(Checks& c, const std::string& path, const std::string& text) {
  try {
    const double bps = comm::parseBandwidth(text);
    if (bps != 0 && !(bps >= limits::kMinBandwidthBps && bps <= limits::kMaxBandwidthBps))
      c.fail(path) << " '" << text << "' must be in [" << comm::formatBandwidth(limits::kMinBandwidthBps) << ", "
                   << comm::formatBandwidth(limits::kMaxBandwidthBps) << "] or \"unlimited\"";
  } catch (const Error& e) {
    c.fail(path) << ": " << untagged(e);
  }
}

void checkPlugin(Checks& c, const std::string& what, const PluginSpec& spec, const ConfigOptions& options,
                 bool scheduler) {
  if (spec.name().empty()) {
    c.fail(what + ".name") << " must be set";
    return;
  }
  if (scheduler && std::find(options.builtin_schedulers.begin(), options.builtin_schedulers.end(), spec.name()) !=
                       options.builtin_schedulers.end()) {
    if (!spec.params().empty())
      c.fail(what + ".params") << ": the built-in scheduler " << quoted(spec.name()) << " takes no parameters";
    return;
  }
  if (options.loader == nullptr) return;
  // The params' line when there are any; otherwise the name's, which the reader is looking at anyway.
  const std::string params_path = what + (spec.params().empty() ? ".name" : ".params");
  try {
    if (scheduler) {
      auto plugin = options.loader->loadScheduler(spec.name());
      try {
        plugin->instantiate(pluginParams(spec));
      } catch (const Error& e) {
        c.fail(params_path) << ": " << untagged(e);
      }
    } else {
      auto plugin = options.loader->loadCompressor(spec.name());
      try {
        plugin->instantiate(pluginParams(spec));
      } catch (const Error& e) {
        c.fail(params_path) << ": " << untagged(e);
      }
    }
  } catch (const Error& e) {
    c.fail(what + ".name") << ": " << untagged(e);
  }
}

// workload.glove's ranges (glove.h, cooccurrence.h restate them for callers that bypass the config).
void checkGlove(Checks& c, const Experiment& e) {
  const Glove& g = e.workload().glove();
  if (g.corpus().empty()) c.fail("workload.glove.corpus") << " must name a text file or a directory of them";
  if (g.window() < 1 || g.window() > 1000)
    c.fail("workload.glove.window") << " must be in [1, 1000], got " << g.window();
  if (g.vocab_size() < 2 || g.vocab_size() > (int64_t{1} << 24))
    c.fail("workload.glove.vocab_size") << " must be in [2, 2^24], got " << g.vocab_size();
  if (g.min_count() < 1) c.fail("workload.glove.min_count") << " must be >= 1, got " << g.min_count();
  if (g.dim() < 1 || g.dim() > 4096) c.fail("workload.glove.dim") << " must be in [1, 4096], got " << g.dim();
  if (!(std::isfinite(g.x_max()) && g.x_max() > 0)) c.fail("workload.glove.x_max") << " must be > 0, got " << g.x_max();
  if (!(g.alpha() > 0 && g.alpha() <= 1)) c.fail("workload.glove.alpha") << " must be in (0, 1], got " << g.alpha();
  if (!(g.test_fraction() >= 0 && g.test_fraction() < 1))
    c.fail("workload.glove.test_fraction") << " must be in [0, 1), got " << g.test_fraction();
  if (g.optimizer() != Glove::ADAGRAD && g.optimizer() != Glove::SGD)
    c.fail("workload.glove.optimizer") << " must be ADAGRAD or SGD";
  if (g.optimizer() == Glove::ADAGRAD && e.optimizer().momentum() != 0)
    c.fail("workload.glove.optimizer") << ": ADAGRAD takes no momentum, got optimizer.momentum "
                                       << e.optimizer().momentum();
  if (g.optimizer() == Glove::ADAGRAD && e.mode() == Experiment::HOGWILD)
    c.fail("workload.glove.optimizer") << ": mode HOGWILD applies plain SGD; use SGD";
}

}  // namespace

// workload pytorch: the model block, and what a DDP run through terse's hook can honour (experiment.proto PyTorch).
void checkPyTorch(Checks& c, const Experiment& e) {
  const PyTorch& t = e.workload().pytorch();
  if (t.has_torchvision() == t.has_module())
    c.fail("workload.pytorch") << " must name exactly one model: torchvision (a torchvision.models constructor) or "
                                  "module (a Python file defining model() and data(rank, world))";
  if (t.has_torchvision() && !std::all_of(t.torchvision().begin(), t.torchvision().end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
      }))
    c.fail("workload.pytorch.torchvision")
        << " must be a torchvision.models constructor name like \"resnet18\", got " << quoted(t.torchvision());
  if (t.has_torchvision() && t.torchvision().empty()) c.fail("workload.pytorch.torchvision") << " is empty";
  if (t.has_module() && t.module().empty()) c.fail("workload.pytorch.module") << " is empty";
  if (t.has_module()) {
    for (const char* field : {"data", "image_size", "channels", "num_classes", "synthetic_examples"}) {
      const auto* f = PyTorch::descriptor()->FindFieldByName(field);
      if (PyTorch::GetReflection()->HasField(t, f))
        c.fail(std::string("workload.pytorch.") + field)
            << ": a module's data(rank, world) gives its inputs; " << field << " is for torchvision models";
    }
  }
  if (t.has_image_size() && (t.image_size() < 8 || t.image_size() > 1024))
    c.fail("workload.pytorch.image_size") << " must be in [8, 1024], got " << t.image_size();
  if (t.has_channels() && t.channels() != 1 && t.channels() != 3)
    c.fail("workload.pytorch.channels") << " must be 1 or 3, got " << t.channels();
  if (t.has_num_classes() && (t.num_classes() < 2 || t.num_classes() > 100000))
    c.fail("workload.pytorch.num_classes") << " must be in [2, 100000], got " << t.num_classes();
  if (t.has_synthetic_examples() && t.synthetic_examples() < 1)
    c.fail("workload.pytorch.synthetic_examples") << " must be >= 1, got " << t.synthetic_examples();
  checkAtMost(c, "workload.pytorch.synthetic_examples", t.synthetic_examples(), limits::kSyntheticExamples);
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
  if (t.has_synthetic_examples() && t.data() != PyTorch::SYNTHETIC)
    c.fail("workload.pytorch.synthetic_examples") << ": only data SYNTHETIC reads it";
  if (t.has_num_classes() && t.data() == PyTorch::FASHION_MNIST && t.num_classes() < 10)
    c.fail("workload.pytorch.num_classes") << ": Fashion-MNIST has 10 classes, got " << t.num_classes();
  if (t.max_steps_per_epoch() < 0)
    c.fail("workload.pytorch.max_steps_per_epoch") << " must be >= 0, got " << t.max_steps_per_epoch();
  if (t.device() != "cpu" && t.device() != "cuda")
    c.fail("workload.pytorch.device") << " must be \"cpu\" or \"cuda\", got " << quoted(t.device());
  // What DDP and the hook do not have: refused rather than ignored.
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
}

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

// worker_settings against the workers and the mode (also after --workers changed the count).
void checkWorkerSettings(Checks& c, const Experiment& e) {
  const bool async_mode =
      e.mode() == Experiment::ASYNC || e.mode() == Experiment::SSP || e.mode() == Experiment::HOGWILD;
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
    if (!(w.slowdown() >= 1 && std::isfinite(w.slowdown()))) {
      c.fail(p + ".slowdown") << " must be a finite factor >= 1, got " << w.slowdown();
    } else {
      checkAtMost(c, p + ".slowdown", w.slowdown(), limits::kSlowdown);
    }
    if (w.fail_after_steps() < 0) c.fail(p + ".fail_after_steps") << " must be >= 0, got " << w.fail_after_steps();
    if (w.fail_after_steps() > 0 && !async_mode)
      c.fail(p + ".fail_after_steps") << ": a failed worker stops a " << Experiment::Mode_Name(e.mode())
                                      << " run; only ASYNC, SSP and HOGWILD go on without it";
  }
}

// Repeats: at most kMaxSeeds, none twice (a hash map: --seeds lists come here without the file's bound), and `seed`,
// when given beside them, one of them.
void checkSeeds(Checks& c, const Experiment& e) {
  if (e.seeds_size() > kMaxSeeds) {
    // --seeds comes here without the file's list limit; the rest would only repeat the count's error.
    c.fail("seeds") << " lists " << e.seeds_size() << " seeds, at most " << kMaxSeeds;
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

std::vector<std::string> validateExperiment(const Experiment& e, const ConfigOptions& options) {
  return validateExperiment(e, options, nullptr);
}

std::vector<std::string> validateExperiment(const Experiment& e, const ConfigOptions& options, PluginCheckMemo* memo) {
  // A plugin spec's check (load, instantiate with the params) depends on the spec alone: with a memo each distinct one
  // is checked once per study.
  auto plugin = [&](Checks& c, const std::string& what, const PluginSpec& spec, bool scheduler) {
    if (memo == nullptr) return checkPlugin(c, what, spec, options, scheduler);
    std::string key = what + '\n' + spec.name();
    for (const auto& [k, v] : pluginParams(spec))
      key += '\n' + std::to_string(k.size()) + ':' + k + std::to_string(v.size()) + ':' + v;
    auto [it, inserted] = memo->try_emplace(std::move(key));
    if (inserted) {
      Checks mine;
      checkPlugin(mine, what, spec, options, scheduler);
      it->second = mine.take();
    }
    for (const auto& m : it->second) c.fail(m);
  };
  Checks c;
  const auto folder_rule = " must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got ";
  if (!isFolderName(e.study())) c.fail("study") << folder_rule << quoted(e.study());
  if (!isFolderName(e.variant())) c.fail("variant") << folder_rule << quoted(e.variant());

  const auto& w = e.workload();
  if (w.name().empty()) {
    c.fail("workload.name") << " must be set"
                            << (options.workloads.empty() ? "" : " (one of: " + joined(options.workloads) + ")");
  } else if (!options.workloads.empty() &&
             std::find(options.workloads.begin(), options.workloads.end(), w.name()) == options.workloads.end()) {
    c.fail("workload.name") << ": unknown workload " << quoted(w.name()) << " (known: " << joined(options.workloads)
                            << ")";
  }
  checkSizeList(c, "workload.hidden_sizes", w.hidden_sizes(), limits::kHiddenSize);
  checkSizeList(c, "workload.conv_channels", w.conv_channels(), limits::kConvChannelsEach);
  // Fields a workload does not read are errors, not silently ignored settings.
  if (w.name() == "cnn") {
    if (w.conv_channels_size() != 0 && w.conv_channels_size() != 2)
      c.fail("workload.conv_channels")
          << ": cnn has two convolutions, give 2 channel counts (or none for [8, 16]), got " << w.conv_channels_size();
    if (w.has_dropout() && !(w.dropout() >= 0 && w.dropout() < 1))
      c.fail("workload.dropout") << " must be in [0, 1), got " << w.dropout();
  } else if (!w.name().empty()) {
    if (w.conv_channels_size() > 0)
      c.fail("workload.conv_channels") << ": only workload cnn has convolutions, not " << quoted(w.name());
    if (w.has_dropout()) c.fail("workload.dropout") << ": only workload cnn has dropout, not " << quoted(w.name());
  }
  if (w.name() == "glove") {
    checkGlove(c, e);
  } else if (!w.name().empty() && w.has_glove()) {
    c.fail("workload.glove") << ": only workload glove reads it, not " << quoted(w.name());
  }
  if (w.name() == "pytorch") {
    checkPyTorch(c, e);
    if (w.hidden_sizes_size() > 0)
      c.fail("workload.hidden_sizes") << ": workload pytorch's model is the pytorch block's, not terse's mlp";
  } else if (!w.name().empty() && w.has_pytorch()) {
    c.fail("workload.pytorch") << ": only workload pytorch reads it, not " << quoted(w.name());
  }
  if (e.sparse_gradients() && e.mode() == Experiment::HOGWILD)
    c.fail("sparse_gradients") << ": mode HOGWILD sends nothing (its workers write one shared vector in memory); "
                                  "row-sparse tensors travel in modes SYNC, ASYNC and SSP (leave it false)";
  if (e.sparse_gradients() && e.transport() == Experiment::NCCL)
    c.fail("sparse_gradients") << ": transport NCCL trains on the GPU, whose tensors are dense (leave it false)";

  const auto& d = e.data();
  if (d.dataset_dir().empty()) c.fail("data.dataset_dir") << " must be set";
  if (d.batch_size() < 1) c.fail("data.batch_size") << " must be >= 1, got " << d.batch_size();
  checkAtMost(c, "data.batch_size", d.batch_size(), limits::kBatchSize);
  if (d.train_subset() < 0) c.fail("data.train_subset") << " must be >= 0 (0 = all), got " << d.train_subset();
  if (d.test_subset() < 0) c.fail("data.test_subset") << " must be >= 0 (0 = all), got " << d.test_subset();

  const auto& o = e.optimizer();
  if (!(std::isfinite(o.lr()) && o.lr() > 0)) c.fail("optimizer.lr") << " must be > 0, got " << o.lr();
  if (!(o.momentum() >= 0 && o.momentum() < 1))
    c.fail("optimizer.momentum") << " must be in [0, 1), got " << o.momentum();
  if (o.nesterov() && o.momentum() == 0) c.fail("optimizer.nesterov") << " needs optimizer.momentum > 0";
  if (!(std::isfinite(o.weight_decay()) && o.weight_decay() >= 0)) {
    c.fail("optimizer.weight_decay") << " must be >= 0, got " << o.weight_decay();
  }
  if (o.warmup_steps() < 0) c.fail("optimizer.warmup_steps") << " must be >= 0, got " << o.warmup_steps();
  if (!(std::isfinite(o.warmup_epochs()) && o.warmup_epochs() >= 0)) {
    c.fail("optimizer.warmup_epochs") << " must be >= 0, got " << o.warmup_epochs();
  }
  if (o.warmup_steps() > 0 && o.warmup_epochs() > 0) {
    c.fail("optimizer.warmup_epochs") << ": set warm-up in steps or in epochs, not both (warmup_steps "
                                      << o.warmup_steps() << ", warmup_epochs " << o.warmup_epochs() << ")";
  }
  if (o.schedule() == Optimizer::SCHEDULE_UNSPECIFIED)
    c.fail("optimizer.schedule") << " must be CONSTANT, STEP or COSINE";
  if (o.schedule() == Optimizer::STEP) {
    if (o.milestones().empty()) c.fail("optimizer.milestones") << " must list at least one epoch for schedule STEP";
    for (int i = 0; i < o.milestones_size(); ++i) {
      const std::string p = "optimizer.milestones[" + std::to_string(i) + "]";
      if (o.milestones(i) < 1) {
        c.fail(p) << " must be >= 1, got " << o.milestones(i);
      } else if (i > 0 && o.milestones(i) <= o.milestones(i - 1)) {
        c.fail(p) << " must be greater than the one before (" << o.milestones(i - 1) << "), got " << o.milestones(i);
      }
    }
    if (!(o.gamma() > 0 && o.gamma() <= 1)) c.fail("optimizer.gamma") << " must be in (0, 1], got " << o.gamma();
  } else if (!o.milestones().empty()) {
    c.fail("optimizer.milestones") << " only apply with schedule STEP, got schedule "
                                   << Optimizer::Schedule_Name(o.schedule());
  }

  if (e.workers() < 1) c.fail("workers") << " must be >= 1, got " << e.workers();
  checkAtMost(c, "workers", e.workers(), limits::kWorkers,
              " (the most `terse launch -n` starts and the simulator is studied at)");
  auto names = [](const auto& values, auto name_of) {
    std::vector<std::string> out;
    for (auto v : values) out.push_back(name_of(v));
    return joined(out);
  };
  if (std::find(options.modes.begin(), options.modes.end(), e.mode()) == options.modes.end()) {
    c.fail("mode") << ": " << Experiment::Mode_Name(e.mode()) << " is not supported by this runner (supported: "
                   << names(options.modes, [](auto m) { return Experiment::Mode_Name(m); }) << ")";
  }
  if (e.staleness_bound() < 0) c.fail("staleness_bound") << " must be >= 0, got " << e.staleness_bound();
  checkAtMost(c, "staleness_bound", e.staleness_bound(), limits::kStalenessBound);
  if (e.staleness_bound() > 0 && e.mode() != Experiment::SSP) {
    c.fail("staleness_bound") << " only applies with mode SSP, got mode " << Experiment::Mode_Name(e.mode());
  }
  const bool async_mode =
      e.mode() == Experiment::ASYNC || e.mode() == Experiment::SSP || e.mode() == Experiment::HOGWILD;
  const auto& ps = e.parameter_server();
  if (ps.servers() < 1) c.fail("parameter_server.servers") << " must be >= 1, got " << ps.servers();
  checkAtMost(c, "parameter_server.servers", ps.servers(), limits::kServers);
  if (ps.pull_dtype() == ParameterServer::PULL_DTYPE_UNSPECIFIED)
    c.fail("parameter_server.pull_dtype") << " must be F32, F16 or BF16";
  checkDuration(c, "parameter_server.worker_timeout", ps.worker_timeout(), limits::kTimeoutSeconds,
                /*positive=*/true);
  if (e.mode() == Experiment::HOGWILD) {
    // Hogwild shares one parameter vector in memory: there is nothing to compress and no wire.
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
  if (async_mode && e.trace()) c.fail("trace") << ": timelines are recorded in mode SYNC only";
  // Unset stays unset (1): a default written here would change every existing config's hash.
  if (e.has_max_groups_in_flight()) {
    // A lane is a thread (an actor in a simulation) per in-flight group: 64 is far above what a credit window needs.
    if (e.max_groups_in_flight() < 1 || e.max_groups_in_flight() > 64)
      c.fail("max_groups_in_flight") << " must be in [1, 64], got " << e.max_groups_in_flight();
    if (e.max_groups_in_flight() > 1 && e.mode() != Experiment::SYNC)
      c.fail("max_groups_in_flight") << ": groups are the sync trainer's; mode " << Experiment::Mode_Name(e.mode())
                                     << " has none (leave it unset)";
    if (e.max_groups_in_flight() > 1 && e.transport() == Experiment::NCCL)
      c.fail("max_groups_in_flight") << ": transport NCCL runs one collective at a time on its stream (leave it unset)";
  }
  if (e.has_gradient_accumulation_steps() && e.gradient_accumulation_steps() < 1)
    c.fail("gradient_accumulation_steps") << " must be >= 1, got " << e.gradient_accumulation_steps();
  checkAtMost(c, "gradient_accumulation_steps", e.gradient_accumulation_steps(), limits::kGradientAccumulationSteps);
  const double clip = e.optimizer().clip_grad_norm();
  if (!(std::isfinite(clip) && clip >= 0))
    c.fail("optimizer.clip_grad_norm") << " must be finite and >= 0, got " << clip;
  // The parameter server and Hogwild apply each worker's gradient as it arrives: a worker accumulates its own
  // micro-batches and pushes (applies) once, and clips its own gradient before that
  // (AsyncTrainerOptions::accumulation_steps, clip_grad_norm). NCCL's workloads keep their gradients on the device,
  // where the trainer does not accumulate or clip.
  for (const auto& [field, set] : {std::pair{"gradient_accumulation_steps", e.gradient_accumulation_steps() > 1},
                                   std::pair{"optimizer.clip_grad_norm", clip > 0}}) {
    if (set && e.transport() == Experiment::NCCL)
      c.fail(field) << ": transport NCCL keeps gradients on the device; it needs INPROC or TCP";
    // Mode SYNC applies row-sparse tensors as their rows arrive (SyncTrainer::runSparse): not accumulated, not in the
    // norm. A parameter-server worker accumulates and clips its own gradient before the push, rows and all.
    if (set && e.sparse_gradients() && !async_mode)
      c.fail(field) << ": sparse_gradients applies each row-sparse tensor as its rows arrive, with no accumulated "
                       "step or global norm; set one of the two";
  }
  if (e.clock() == Experiment::CLOCK_UNSPECIFIED) c.fail("clock") << " must be REAL_TIME or SIMULATED";
  if (e.clock() == Experiment::SIMULATED) {
    // The simulated cluster runs the in-process threads (sync trainer, parameter server shards and workers) as
    // SimGrid actors; other processes or GPUs keep real time, and so do Hogwild's threads, whose lock-free races
    // happen between threads running at the same instant (actors run one at a time).
    if (e.transport() != Experiment::INPROC)
      c.fail("clock") << ": SIMULATED simulates the in-process cluster and needs transport INPROC, got "
                      << Experiment::Transport_Name(e.transport()) << " (which runs in real time)";
    if (e.mode() == Experiment::HOGWILD)
      c.fail("clock") << ": SIMULATED runs modes SYNC, ASYNC and SSP; mode HOGWILD's lock-free races need threads "
                         "running at once and run in real time (clock REAL_TIME)";
  }
  if (e.simulation().has_topology()) {
    if (e.clock() != Experiment::SIMULATED)
      c.fail("simulation.topology") << ": a topology is built for the simulated cluster (clock SIMULATED); the "
                                       "real-time emulation paces the per-link model of `link`";
    // The fields' own bounds first, each under its name; the whole (preset filled in) is validated when they hold.
    const Topology& tf = e.simulation().topology();
    Checks fields;
    const std::string tp = "simulation.topology.";
    if (tf.has_intra_bandwidth()) checkBandwidth(fields, tp + "intra_bandwidth", tf.intra_bandwidth());
    if (tf.has_nic_bandwidth()) checkBandwidth(fields, tp + "nic_bandwidth", tf.nic_bandwidth());
    if (tf.has_intra_latency())
      checkDuration(fields, tp + "intra_latency", tf.intra_latency(), limits::kLatencySeconds, /*positive=*/false);
    if (tf.has_nic_latency())
      checkDuration(fields, tp + "nic_latency", tf.nic_latency(), limits::kLatencySeconds, /*positive=*/false);
    checkAtMost(fields, tp + "workers_per_node", tf.workers_per_node(), limits::kWorkers);
    checkAtMost(fields, tp + "nics_per_node", tf.nics_per_node(), limits::kNicsPerNode);
    checkAtMost(fields, tp + "nodes_per_rack", tf.nodes_per_rack(), limits::kWorkers);
    checkAtMost(fields, tp + "oversubscription", tf.oversubscription(), limits::kOversubscription);
    auto field_errors = fields.take();
    for (const auto& m : field_errors) c.fail(m);
    if (field_errors.empty()) {
      try {
        const sim::TwoLevelTopology t = topology(e);
        t.validate();
      } catch (const Error& err) {
        c.fail("simulation.topology") << ": " << untagged(err);
      }
    }
    bool links = false;
    try {
      links = emulationConfig(e).enabled();
    } catch (const Error&) {
      links = true;  // a malformed link value is reported under its own field
    }
    if (links) c.fail("link") << ": simulation.topology describes the network; leave link (and its overrides) unset";
  }
  {
    const auto& co = e.collectives();
    std::string reduce_problem, gather_problem;
    const auto reduce = parseCollective(co.allreduce(), comm::parseAllreduceAlgorithm,
                                        comm::allreduceAlgorithmChoices(), reduce_problem);
    const auto gather = parseCollective(co.allgather(), comm::parseAllgatherAlgorithm,
                                        comm::allgatherAlgorithmChoices(), gather_problem);
    if (!reduce) c.fail("collectives.allreduce") << reduce_problem;
    if (!gather) c.fail("collectives.allgather") << gather_problem;
    if (co.has_ranks_per_node()) {
      const int per = co.ranks_per_node();
      if (per < 1 || per > std::max(1, e.workers()))
        c.fail("collectives.ranks_per_node") << " must be in [1, workers = " << e.workers() << "], got " << per;
    }
    const bool nodes_known = co.has_ranks_per_node() || e.simulation().has_topology();
    if (reduce == comm::AllreduceAlgorithm::kHierarchical && !nodes_known)
      c.fail("collectives.allreduce") << ": 'hierarchical' needs collectives.ranks_per_node (or a simulation "
                                         "topology) to know the nodes";
    if (gather == comm::AllgatherAlgorithm::kHierarchical && !nodes_known)
      c.fail("collectives.allgather") << ": 'hierarchical' needs collectives.ranks_per_node (or a simulation "
                                         "topology) to know the nodes";
  }
  const double scale = e.simulation().compute_scale();
  if (!(scale >= 0 && scale < 1e6)) c.fail("simulation.compute_scale") << " must be in [0, 1e6), got " << scale;
  const Simulation& sim = e.simulation();
  if (sim.compute() == Simulation::COMPUTE_UNSPECIFIED)
    c.fail("simulation.compute") << " must be CALIBRATED, MEASURED or FLOP_MODEL";
  // The calibrated table prices the kernel regions of a simulation; a real-time run (any transport) and a TCP or NCCL
  // run take the time their kernels take and cannot honour it.
  if (sim.compute() == Simulation::CALIBRATED && e.clock() != Experiment::SIMULATED)
    c.fail("simulation.compute") << ": CALIBRATED charges the kernels of a simulated run (clock SIMULATED, transport "
                                    "INPROC); clock "
                                 << Experiment::Clock_Name(e.clock()) << " with transport "
                                 << Experiment::Transport_Name(e.transport()) << " runs in real time";
  if (sim.has_calibration()) {
    if (sim.compute() != Simulation::CALIBRATED)
      c.fail("simulation.calibration") << ": a table is replayed by compute CALIBRATED, got compute "
                                       << Simulation::Compute_Name(sim.compute());
    if (sim.calibration().empty())
      c.fail("simulation.calibration") << " must name a calibration.json (leave it unset to use the cache)";
    else if (sim.calibration().size() > 4096)
      c.fail("simulation.calibration") << " is a path of " << sim.calibration().size() << " bytes, above 4096";
  }
  if (sim.allow_foreign_calibration() && !sim.has_calibration())
    c.fail("simulation.allow_foreign_calibration") << ": true only applies to a replayed simulation.calibration";
  const double flops = e.simulation().flops_per_second();
  if (!(flops > 0 && std::isfinite(flops))) {
    c.fail("simulation.flops_per_second") << " must be finite and > 0, got " << flops;
  } else if (flops < limits::kMinFlopsPerSecond || flops > limits::kMaxFlopsPerSecond) {
    c.fail("simulation.flops_per_second")
        << " must be in [" << limits::kMinFlopsPerSecond << ", " << limits::kMaxFlopsPerSecond << "], got " << flops;
  }
  checkWorkerSettings(c, e);
  if (std::find(options.transports.begin(), options.transports.end(), e.transport()) == options.transports.end()) {
    c.fail("transport")
        << ": " << Experiment::Transport_Name(e.transport()) << " is not supported by this runner (supported: "
        << names(options.transports, [](auto t) { return Experiment::Transport_Name(t); }) << ")"
        << (e.transport() == Experiment::NCCL
                ? ": NCCL needs a terse built with CUDA and NCCL (nvcc and libnccl found when configuring)"
                : "");
  }
  const bool nccl_offered =
      std::find(options.transports.begin(), options.transports.end(), Experiment::NCCL) != options.transports.end();
  if (e.transport() == Experiment::NCCL && nccl_offered) {
    // One process per GPU, gradients kept on the device: bulk-synchronous only (the parameter server runs over TCP),
    // a model with a CUDA version, and no emulated links (NCCL runs at the hardware's speed).
    if (e.mode() != Experiment::SYNC)
      c.fail("mode") << ": transport NCCL runs mode SYNC (the parameter server modes run over TCP), got "
                     << Experiment::Mode_Name(e.mode());
    const auto& cw = options.cuda_workloads;
    if (std::find(cw.begin(), cw.end(), e.workload().name()) == cw.end())
      c.fail("workload.name") << ": transport NCCL trains on the GPU, and '" << e.workload().name()
                              << "' has no CUDA version (those with one: " << joined(cw) << ")";
    if (e.workload().name() == "cnn" && (e.workload().hidden_sizes_size() > 0 || e.workload().dropout() > 0))
      c.fail("workload.hidden_sizes") << ": transport NCCL trains on the GPU, whose cnn has no hidden layers or "
                                         "dropout yet (cnn_cuda.h); leave hidden_sizes and dropout unset";
    // Resolved defaults spell "no emulation" as unlimited bandwidth and zero latency.
    bool emulated = false;
    try {
      emulated = emulationConfig(e).enabled();
    } catch (const Error&) {
      emulated = true;  // a malformed link value is reported under its own field; it still asks for emulation
    }
    if (emulated)
      c.fail("link") << ": emulated links apply to the host transports (INPROC, TCP); transport NCCL runs at the "
                        "hardware's speed, so leave link unset";
  }

  try {
    const double plugin_timeout = comm::parseDuration(e.plugin_timeout());
    if (!(plugin_timeout >= 0 && plugin_timeout <= 3600))
      c.fail("plugin_timeout") << " must be in [0s, 1h] (0 turns the watchdog off), got '" << e.plugin_timeout() << "'";
  } catch (const Error& err) {
    c.fail("plugin_timeout") << ": " << untagged(err);
  }
  checkDuration(c, "tcp.timeout", e.tcp().timeout(), limits::kTimeoutSeconds, /*positive=*/true);
  if (e.tcp().socket_buffer_bytes() < 0)
    c.fail("tcp.socket_buffer_bytes") << " must be >= 0, got " << e.tcp().socket_buffer_bytes();
  checkAtMost(c, "tcp.socket_buffer_bytes", e.tcp().socket_buffer_bytes(), limits::kSocketBufferBytes);
  for (char ch : e.tcp().bind_address()) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == ':' || ch == '-' || ch == '_')) {
      c.fail("tcp.bind_address") << " '" << e.tcp().bind_address() << "' is not a host name or address";
      break;
    }
  }

  const auto& link = e.link();
  checkBandwidth(c, "link.bandwidth", link.bandwidth());
  checkDuration(c, "link.latency", link.latency(), limits::kLatencySeconds, /*positive=*/false);
  checkBandwidth(c, "link.nic", link.nic());
  checkBandwidth(c, "link.nic_ingress", link.nic_ingress());
  for (int i = 0; i < link.overrides_size(); ++i) {
    const std::string p = "link.overrides[" + std::to_string(i) + "]";
    checkBandwidth(c, p + ".bandwidth", link.overrides(i).bandwidth());
    checkDuration(c, p + ".latency", link.overrides(i).latency(), limits::kLatencySeconds, /*positive=*/false);
  }
  if (e.workers() >= 1) checkLinkRanks(c, e);

  plugin(c, "compressor", e.compressor(), /*scheduler=*/false);
  try {
    validateCodecOptions(codecOptions(e));
  } catch (const Error& err) {
    c.fail("momentum_correction.factor") << ": " << untagged(err);
  }
  if (e.momentum_correction().factor() > 0 && o.momentum() > 0) {
    c.fail("momentum_correction.factor") << " " << e.momentum_correction().factor()
                                         << " needs optimizer.momentum 0, got " << o.momentum()
                                         << ": DGC's momentum correction carries the momentum itself";
  }
  plugin(c, "scheduler", e.scheduler(), /*scheduler=*/true);

  if (e.epochs() < 1) c.fail("epochs") << " must be >= 1, got " << e.epochs();
  checkAtMost(c, "epochs", e.epochs(), limits::kEpochs);
  if (e.eval().every_steps() < 0) c.fail("eval.every_steps") << " must be >= 0, got " << e.eval().every_steps();
  if (e.eval().every_steps() == 0 && !e.eval().per_epoch()) {
    c.fail("eval.per_epoch") << ": false with eval.every_steps 0 would never evaluate";
  }
  if (e.output_dir().empty()) c.fail("output_dir") << " must be set";
  checkSeeds(c, e);
  return c.take();
}

}  // namespace terse::experiments
