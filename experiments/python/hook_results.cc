#include "experiments/python/hook_results.h"

#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cmath>

#include "core/common/error.h"
#include "experiments/config/config.h"

namespace py = pybind11;

namespace terse::python {
namespace {

// The commit of the tree this extension was built in (the running executable is python3, so results::gitCommit()
// would look at the wrong place first), else of the working directory.
std::string extensionCommit() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&extensionCommit), &info) != 0 && info.dli_fname != nullptr) {
    if (auto head = results::gitCommitOf(std::filesystem::path(info.dli_fname).parent_path())) return *head;
  }
  return results::gitCommit();
}

}  // namespace

HookResults::HookResults(DdpAggregator& aggregator, const std::filesystem::path& root, const std::string& study,
                         const std::string& variant, const std::string& description, const std::string& torch_version)
    : aggregator_(aggregator), start_(std::chrono::steady_clock::now()) {
  // Parsed on every rank, so a bad description raises everywhere alike.
  experiments::Experiment e = experiments::parseConfigText(description, "ddp_hook description");
  const AggregatorOptions& o = aggregator.options();
  const int world = aggregator.communicator().size();
  e.set_study(study);
  e.set_variant(variant);
  e.set_workers(world);
  e.set_mode(experiments::Experiment::SYNC);
  e.clear_transport();
  e.clear_link();
  e.clear_variants();
  e.mutable_compressor()->set_name(o.compressor);
  e.mutable_compressor()->clear_params();
  for (const auto& [k, v] : o.params) (*e.mutable_compressor()->mutable_params())[k] = v;
  e.set_error_feedback(o.codec.error_feedback);
  e.mutable_momentum_correction()->set_factor(o.codec.momentum_correction);
  e.set_seed(o.seed);
  if (aggregator.communicator().rank() != 0) return;

  writer_ = std::make_unique<results::ResultWriter>(root, study, variant);
  writer_->writeConfig(experiments::toText(e));
  results::Provenance prov;
  prov.git_commit = extensionCommit();
  prov.host = results::hostName();
  prov.cpu = results::cpuDescription();
  prov.start_time = results::isoTimeUtc();
  prov.terse_version = TERSE_VERSION;
  prov.transport = "torch.distributed:" + aggregator.communicator().torchBackend() + " (torch " + torch_version + ")";
  prov.world_size = world;
  prov.mode = "sync";
  prov.plugins.push_back({aggregator.plugin().info(), aggregator.caps(), o.params, aggregator.resolvedParams()});
  writer_->writeProvenance(prov);
}

std::optional<std::filesystem::path> HookResults::dir() const {
  if (!writer_) return std::nullopt;
  return writer_->dir();
}

void HookResults::record(const EvalNumbers& eval) {
  TERSE_CHECK(std::isfinite(eval.test_accuracy) && eval.test_accuracy >= 0 && eval.test_accuracy <= 1, InvalidArgument,
              "terse.torch: record: test_accuracy must be a fraction in [0, 1], got " << eval.test_accuracy);
  const ByteCounts t = aggregator_.totals();
  const double steps = static_cast<double>(std::max<uint64_t>(1, aggregator_.step()));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // Summed over ranks with one all_reduce, divided below: the means terse runs report.
  std::array<double, 6> sums{static_cast<double>(t.wire.sent_bytes),
                             static_cast<double>(t.payload),
                             aggregator_.encodeSeconds(),
                             aggregator_.decodeSeconds(),
                             aggregator_.commSeconds(),
                             aggregator_.hookSeconds()};
  {
    py::object torch = py::module_::import("torch");
    py::object dist = py::module_::import("torch.distributed");
    py::list values;
    for (double v : sums) values.append(v);
    py::object tensor = torch.attr("tensor")(values, py::arg("dtype") = torch.attr("float64"));
    py::object group = aggregator_.communicator().groupObject();
    dist.attr("all_reduce")(tensor, py::arg("group") = group);
    const py::list summed = tensor.attr("tolist")();
    for (std::size_t i = 0; i < sums.size(); ++i) sums[i] = summed[i].cast<double>();
  }
  ++records_;
  if (!writer_) return;
  const double world = aggregator_.communicator().size();
  results::MetricsRecord m;
  m.step = static_cast<int64_t>(aggregator_.step());
  m.epoch = static_cast<int64_t>(std::floor(eval.epoch));
  m.epoch_progress = eval.epoch;
  m.test_accuracy = eval.test_accuracy;
  m.test_loss = eval.test_loss;
  m.test_examples = eval.test_examples;
  m.train_loss = eval.train_loss;
  m.lr = eval.lr;
  m.wire_bytes_per_worker = static_cast<uint64_t>(std::llround(sums[0] / world));
  m.payload_bytes_per_worker = static_cast<uint64_t>(std::llround(sums[1] / world));
  m.wall_s = wall;
  m.compress_s_per_step = sums[2] / world / steps;
  m.decompress_s_per_step = sums[3] / world / steps;
  m.comm_s_per_step = sums[4] / world / steps;
  // The hook runs synchronously inside backward: all of its communication is exposed, and what the step spends outside
  // the hook (forward, backward, optimizer, the script's own work) is its compute.
  m.exposed_comm_s_per_step = m.comm_s_per_step;
  // Wall time per step since the hook was built: the script's evaluations are in it, as in wall_s.
  m.step_s_per_step = wall / steps;
  m.compute_s_per_step = std::max(0.0, m.step_s_per_step - sums[5] / world / steps);
  writer_->append(m);
}

void HookResults::finish(const std::optional<std::string>& error) {
  if (!writer_ || writer_->state() != results::kStateRunning) return;
  if (error) {
    writer_->markFailed(*error);
  } else {
    writer_->markCompleted();
  }
}

}  // namespace terse::python
