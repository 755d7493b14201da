#include "experiments/python/hook_results.h"

#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "core/comm/ring_model.h"
#include "core/common/error.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner_detail.h"
#include "results/build_commit.h"

namespace py = pybind11;

namespace terse::python {

HookResults::HookResults(DdpAggregator& aggregator, const std::filesystem::path& root, const std::string& study,
                         const std::string& variant, const std::string& description, const std::string& torch_version,
                         std::optional<uint64_t> repeat_seed, ScriptProvenance code,
                         std::optional<experiments::LocalSgd> local_sgd)
    : aggregator_(&aggregator),
      comm_(&aggregator.communicator()),
      repeat_seed_(repeat_seed),
      code_(std::move(code)),
      local_sgd_(std::move(local_sgd)) {
  start(root, study, variant, description, torch_version);
}

HookResults::HookResults(py::object group, const BaselineRun& baseline, const std::filesystem::path& root,
                         const std::string& study, const std::string& variant, const std::string& description,
                         const std::string& torch_version, std::optional<uint64_t> repeat_seed, ScriptProvenance code)
    : own_comm_(std::make_unique<TorchCommunicator>(std::move(group))),
      comm_(own_comm_.get()),
      baseline_(baseline),
      repeat_seed_(repeat_seed),
      code_(std::move(code)) {
  TERSE_CHECK(!baseline_.compressor.empty(), InvalidArgument, "terse.torch: ResultsLogger: compressor is empty");
  start(root, study, variant, description, torch_version);
}

void HookResults::start(const std::filesystem::path& root, const std::string& study, const std::string& variant,
                        const std::string& description, const std::string& torch_version) {
  start_ = std::chrono::steady_clock::now();
  // The names become folders under `root`, so they follow a config's rule for study and variant
  // (experiments/configs/README.md): "..", "a/b" or "../x" would write into the root, nest, or escape it. On every
  // rank and before anything is written, so a bad name raises everywhere alike and leaves no folder behind.
  for (const auto& [keyword, name] : {std::pair{"study", &study}, std::pair{"variant", &variant}}) {
    TERSE_CHECK(experiments::isFolderName(*name), InvalidArgument,
                "terse.torch: ResultsLogger: " << keyword << "='" << *name << "'"
                                               << " must be a folder name ([A-Za-z0-9._-], not '.' or '..'): the run "
                                                  "is written to <root>/<study>/<variant>/");
  }
  // A repeat's folder, as experiments::resultsSubfolder names it for `terse run --seeds`.
  const std::string folder = repeat_seed_ ? experiments::repeatSubfolder(variant, *repeat_seed_) : variant;
  folder_ = root / study / folder;
  // Parsed on every rank, so a bad description raises everywhere alike.
  experiments::Experiment e = experiments::parseConfigText(description, "ResultsLogger description");
  const int world = comm_->size();
  e.set_study(study);
  e.set_variant(variant);
  e.set_workers(world);
  e.set_mode(experiments::Experiment::SYNC);
  e.clear_transport();
  e.clear_link();
  e.clear_variants();
  e.mutable_compressor()->clear_params();
  if (aggregator_ != nullptr) {
    const AggregatorOptions& o = aggregator_->options();
    e.mutable_compressor()->set_name(o.compressor);
    for (const auto& [k, v] : o.params) (*e.mutable_compressor()->mutable_params())[k] = v;
    e.set_error_feedback(o.codec.error_feedback);
    // Written for EF21 only, so that a rule-EF run's config reads as one written before the fields existed.
    e.clear_error_feedback_rule();
    e.clear_ef21_momentum();
    e.clear_compression_start_step();
    if (o.compression_start_step > 0) e.set_compression_start_step(static_cast<int64_t>(o.compression_start_step));
    if (o.codec.error_feedback && o.codec.error_feedback_rule == ErrorFeedbackRule::kEf21) {
      e.set_error_feedback_rule(experiments::Experiment::EF21);
      if (o.codec.ef21_momentum != 1.0) e.set_ef21_momentum(o.codec.ef21_momentum);
    }
    // All three, as a resolved native config writes them: masking and Nesterov change the updates whenever the factor
    // is on, and a config that left them out would read as the defaults.
    e.mutable_momentum_correction()->set_factor(o.codec.momentum_correction);
    e.mutable_momentum_correction()->set_masking(o.codec.momentum_masking);
    e.mutable_momentum_correction()->set_nesterov(o.codec.momentum_nesterov);
    TERSE_CHECK(!repeat_seed_ || *repeat_seed_ == o.seed, InvalidArgument,
                "terse.torch: ResultsLogger: seed=" << *repeat_seed_ << " names the repeat, but the state's seed is "
                                                    << o.seed << ": build the CompressionState with seed="
                                                    << *repeat_seed_ << " too (it seeds the compressor's randomness)");
    e.set_seed(o.seed);
    // What the script ran, over what its description says: a description of a local SGD config trained by a script
    // without LocalSGD is a synchronous run.
    e.clear_local_sgd();
    if (local_sgd_) *e.mutable_local_sgd() = *local_sgd_;
  } else {
    // What terse knows of a baseline is its label; the description keeps whatever else the script says.
    e.mutable_compressor()->set_name(baseline_.compressor);
    e.set_error_feedback(false);
    e.clear_error_feedback_rule();
    e.clear_ef21_momentum();
    e.clear_compression_start_step();
    e.clear_momentum_correction();
  }
  if (repeat_seed_) {
    // The seed, and the study's list of seeds holding it: terse compare reads a seed-N folder as a repeat only when its
    // config lists seeds (a variant may itself be named seed-3).
    e.set_seed(*repeat_seed_);
    if (std::find(e.seeds().begin(), e.seeds().end(), *repeat_seed_) == e.seeds().end()) e.add_seeds(*repeat_seed_);
  }
  if (comm_->rank() != 0) return;

  writer_ = std::make_unique<results::ResultWriter>(root, study, folder);
  writer_->writeConfig(experiments::toText(e));
  results::Provenance prov;
  prov.git_commit = std::string(results::buildCommit());  // as `terse run` records it: the build's commit
  prov.host = results::hostName();
  prov.cpu = results::cpuDescription();
  prov.start_time = results::isoTimeUtc();
  prov.terse_version = TERSE_VERSION;
  prov.transport = "torch.distributed:" + comm_->torchBackend() + " (torch " + torch_version + ")";
  prov.world_size = world;
  prov.mode = "sync";
  if (aggregator_ != nullptr) {
    prov.plugins.push_back({aggregator_->plugin().info(),
                            aggregator_->caps(),
                            aggregator_->options().params,
                            aggregator_->resolvedParams(),
                            {}});
    // Granularity changes what the compressor sees (each parameter, or DDP's flat bucket), so it changes the results;
    // the experiment schema has no field for it, since a native run always compresses per tensor.
    prov.hook.emplace_back("granularity",
                           aggregator_->options().granularity == Granularity::kBucket ? "bucket" : "tensor");
    // As a native run records its warm-up's `none` (runner_detail.h).
    if (aggregator_->densePlugin() != nullptr)
      prov.plugins.push_back(runner::detail::denseRecord(*aggregator_->densePlugin(), *aggregator_->denseInstance()));
  }
  // A module workload's model and data are its files' code, which the config names only by path: their hashes say
  // whether two runs trained the same thing (an edited module, or a sibling it imports, would otherwise look like the
  // same workload). terse.torch.ResultsLogger hashes them, since only Python knows which files the run imported; it
  // resolves no relative path from the working directory, where it would hash another file or none.
  for (const auto& entry : code_.hook) prov.hook.push_back(entry);
  prov.module_files = code_.module_files;
  prov.partition = code_.data_partition;
  writer_->writeProvenance(prov);
}

std::string descriptionModule(const std::string& description) {
  const experiments::Experiment e = experiments::parseConfigText(description, "ResultsLogger description");
  return e.workload().has_pytorch() ? e.workload().pytorch().module() : std::string();
}

std::optional<std::filesystem::path> HookResults::dir() const {
  if (!writer_) return std::nullopt;
  return writer_->dir();
}

void HookResults::checkOpen(std::string_view call) const {
  TERSE_CHECK(!finished_, InvalidArgument,
              "terse.torch: ResultsLogger." << call << ": the run in " << folder_.string()
                                            << " is finished (finish() was called); build a new ResultsLogger for "
                                               "another run");
}

void HookResults::record(const EvalNumbers& eval, std::optional<int64_t> step) {
  checkOpen("record");
  TERSE_CHECK(std::isfinite(eval.test_accuracy) && eval.test_accuracy >= 0 && eval.test_accuracy <= 1, InvalidArgument,
              "terse.torch: record: test_accuracy must be a fraction in [0, 1], got " << eval.test_accuracy);
  TERSE_CHECK(aggregator_ != nullptr || step.has_value(), InvalidArgument,
              "terse.torch: record: a run without a terse hook must say its step (record(..., step=N))");
  TERSE_CHECK(!step || *step >= 0, InvalidArgument, "terse.torch: record: step must be >= 0, got " << *step);
  const int64_t steps_done = step ? *step : static_cast<int64_t>(aggregator_->step());
  const double steps = static_cast<double>(std::max<int64_t>(1, steps_done));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double world = comm_->size();
  // Per rank: wire bytes sent, payload bytes, encode, decode, communication, exposed seconds.
  std::array<double, 6> means{};
  if (aggregator_ != nullptr) {
    const ByteCounts t = aggregator_->totals();
    std::array<double, 6> sums{
        static_cast<double>(t.wire.sent_bytes), static_cast<double>(t.payload), aggregator_->encodeSeconds(),
        aggregator_->decodeSeconds(),           aggregator_->commSeconds(),     aggregator_->exposedSeconds()};
    // Summed over ranks with one all_reduce: the means terse runs report.
    py::gil_scoped_acquire gil;
    py::object torch = py::module_::import("torch");
    py::object dist = py::module_::import("torch.distributed");
    py::list values;
    for (double v : sums) values.append(v);
    py::object tensor = torch.attr("tensor")(values, py::arg("dtype") = torch.attr("float64"));
    // NCCL carries device tensors only: a CUDA state sums its counters on its device (one small copy each way).
    if (aggregator_->onDevice()) tensor = tensor.attr("to")(torch.attr("device")("cuda", aggregator_->device()));
    dist.attr("all_reduce")(tensor, py::arg("group") = comm_->groupObject());
    const py::list summed = tensor.attr("tolist")();
    last_sums_ = tensor;
    for (std::size_t i = 0; i < sums.size(); ++i) means[i] = summed[i].cast<double>() / world;
  } else {
    // Every rank hands the same bytes to the allreduce: nothing to average.
    const auto payload = static_cast<double>(baseline_.payload_bytes_per_step);
    means[0] = static_cast<double>(comm::ringAllreduceBytes(baseline_.payload_bytes_per_step, comm_->size())) *
               static_cast<double>(steps_done);
    means[1] = payload * static_cast<double>(steps_done);
  }
  ++records_;
  if (!writer_) return;
  results::MetricsRecord m;
  m.step = steps_done;
  m.epoch = static_cast<int64_t>(std::floor(eval.epoch));
  m.epoch_progress = eval.epoch;
  m.test_accuracy = eval.test_accuracy;
  m.test_loss = eval.test_loss;
  m.test_examples = eval.test_examples;
  m.train_loss = eval.train_loss;
  m.lr = eval.lr;
  m.wire_bytes_per_worker = static_cast<uint64_t>(std::llround(means[0]));
  m.payload_bytes_per_worker = static_cast<uint64_t>(std::llround(means[1]));
  m.wall_s = wall;
  m.compress_s_per_step = means[2] / steps;
  m.decompress_s_per_step = means[3] / steps;
  m.comm_s_per_step = means[4] / steps;
  m.exposed_comm_s_per_step = means[5] / steps;
  // Wall time per step since the logger was built: the script's evaluations are in it, as in wall_s.
  m.step_s_per_step = wall / steps;
  m.compute_s_per_step = std::max(0.0, m.step_s_per_step - m.exposed_comm_s_per_step);
  writer_->append(m);
}

void HookResults::finish(const std::optional<std::string>& error) {
  if (finished_) {
    TERSE_CHECK(!error || failed_, InvalidArgument,
                "terse.torch: ResultsLogger.finish: the run in "
                    << folder_.string()
                    << " was already marked completed, so it cannot be marked failed now: " << *error);
    return;
  }
  finished_ = true;
  failed_ = error.has_value();
  if (!writer_ || writer_->state() != results::kStateRunning) return;
  if (error) {
    writer_->markFailed(*error);
  } else {
    writer_->markCompleted();
  }
}

}  // namespace terse::python
