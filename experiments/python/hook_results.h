// The results folder of a PyTorch run (terse.torch.ResultsLogger): the same folder a terse run writes
// (results/result_writer.h), so `terse compare` puts the two side by side. Two kinds of run:
//   through terse's hook   the aggregator's counters: bytes, codec and communication times, steps;
//   a baseline             a run terse did not aggregate (DDP's default allreduce, one of DDP's own hooks): the caller
//                          says what one worker hands to the allreduce per step and counts the steps; wire bytes follow
//                          the ring model of torch_communicator.h. Its times are wall time per step, not split.
//
//   config.textproto  the training script's description of its recipe (an Experiment in text format: workload, data,
//                     optimizer, epochs, seed, ...), with what the hook knows filled in over it -- study, variant,
//                     workers = the group's size, mode SYNC, the compressor and its parameters, error feedback and
//                     momentum correction (factor, masking, Nesterov), and local_sgd from terse.torch.LocalSGD's
//                     schedule (cleared without one) -- so compare reads the compressor and recipe
//                     as it does for native runs. The transport is left unset: none of the schema's transports is
//                     torch.distributed. Study and variant must be folder names, as a config's are.
//   provenance.json   commit, host, time, terse version, transport "torch.distributed:<backend> (torch <version>)",
//                     world size, mode, the plugin as core's loader loaded it (path, origin, ABI, version, caps for
//                     f32, parameters), and "hook": {"granularity": ...}, which changes the results and has no field
//                     in the schema (`terse compare --provenance` shows it beside the transport), with what the
//                     Python side records of the code and data (ScriptProvenance: a module's hashes,
//                     "module_files", torchvision's version, "data_partition").
//   metrics.jsonl     one record per record() call -- the training script's evaluation points -- with the hook's step
//                     count (a LocalSGD's, which the logger passes: the aggregator's counts its averagings too), wall
//                     time since the logger was built, the cumulative wire and payload bytes (the means over ranks, as
//                     terse runs report them) and per-step times. Exposed communication is what backward waited for the
//                     hook (the aggregator's exposed seconds: all of it without overlap, the tail after DDP's last
//                     bucket with it); compute is the step's wall time less that.
//
// record() is collective (every rank calls it at the same point): the per-rank counters are averaged with one
// torch.distributed all_reduce of a few doubles, which is bookkeeping and so not counted as gradient traffic. Rank 0
// writes; the other ranks only contribute their counters.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "experiments/config/experiment.pb.h"
#include "experiments/python/ddp_aggregator.h"
#include "results/result_writer.h"

namespace terse::python {

struct EvalNumbers {
  double test_accuracy = 0;  // in [0, 1]
  double test_loss = 0;
  int64_t test_examples = 0;
  double train_loss = 0;
  double epoch = 0;  // epochs done, fractional (1.5 = half way through the second)
  double lr = 0;
};

// A run terse did not aggregate: the compressor named in its config ("none" for DDP's allreduce) and the bytes one
// worker hands to the allreduce per step.
struct BaselineRun {
  std::string compressor = "none";
  uint64_t payload_bytes_per_step = 0;
};

// What the Python side knows of the run's code and data (terse.torch.ResultsLogger gathers it after model() and data()
// ran): provenance.json's "hook" entries beyond the hook's own settings -- module_sha256 and module_files_sha256, or
// why the module was not hashed; torchvision's version --, the module's files ("module_files"), and the non-IID split
// the script trained on ("data_partition": terse.Recipe.data_partition, as a native run records it).
struct ScriptProvenance {
  std::vector<std::pair<std::string, std::string>> hook;
  std::vector<std::pair<std::string, std::string>> module_files;
  std::vector<std::pair<std::string, std::string>> data_partition;
};

// The workload.pytorch.module a description names ("" for none), as written: parses it as HookResults does (a
// ConfigError naming the line otherwise).
std::string descriptionModule(const std::string& description);

class HookResults {
 public:
  // Writes config and provenance (rank 0) and starts the clock. `description` is text-format Experiment fields; a parse
  // error is a ConfigError naming the line. Throws InvalidArgument for an unwritable folder.
  // `repeat_seed`: the run is one of a study's repeats over seeds, written to <variant>/seed-N/ as `terse run --seeds`
  // writes them (terse compare sets them as intervals); with an aggregator it must be the aggregator's seed.
  // `local_sgd`: the run averages models through the aggregator (terse.torch.LocalSGD) and its steps are the
  // caller's, not the aggregator's; config.textproto says so in its local_sgd block, which is cleared without it.
  HookResults(DdpAggregator& aggregator, const std::filesystem::path& root, const std::string& study,
              const std::string& variant, const std::string& description, const std::string& torch_version,
              std::optional<uint64_t> repeat_seed = std::nullopt, ScriptProvenance code = {},
              std::optional<experiments::LocalSgd> local_sgd = std::nullopt);
  // A baseline over `group` (a torch.distributed ProcessGroup, or None for the default one).
  HookResults(pybind11::object group, const BaselineRun& baseline, const std::filesystem::path& root,
              const std::string& study, const std::string& variant, const std::string& description,
              const std::string& torch_version, std::optional<uint64_t> repeat_seed = std::nullopt,
              ScriptProvenance code = {});

  // Collective; see above. test_accuracy outside [0, 1] is an InvalidArgument (compare would skip the record).
  // `step`: the steps done; required for a baseline, the hook's count when absent. After finish() an
  // InvalidArgument (checkOpen).
  void record(const EvalNumbers& eval, std::optional<int64_t> step);
  // Throws InvalidArgument naming the folder once finish() was called: a record after it would land in metrics.jsonl
  // behind a status.json that says the run ended with fewer records.
  void checkOpen(std::string_view call) const;
  // Marks the run completed (or failed with `error`). Rank 0 only writes. The first call settles the outcome; a later
  // one changes nothing (a `finally:` may call it again), except that an error after the run was marked completed is
  // an InvalidArgument rather than dropped unseen.
  void finish(const std::optional<std::string>& error);
  bool finished() const noexcept { return finished_; }
  std::optional<std::filesystem::path> dir() const;

 private:
  // Parses the description, fills in what is known of the run, and (rank 0) writes config and provenance.
  void start(const std::filesystem::path& root, const std::string& study, const std::string& variant,
             const std::string& description, const std::string& torch_version);

  DdpAggregator* aggregator_ = nullptr;          // null for a baseline
  std::unique_ptr<TorchCommunicator> own_comm_;  // a baseline's view of its group
  TorchCommunicator* comm_ = nullptr;
  BaselineRun baseline_;
  std::optional<uint64_t> repeat_seed_;
  ScriptProvenance code_;
  std::optional<experiments::LocalSgd> local_sgd_;  // terse.torch.LocalSGD's schedule
  std::unique_ptr<results::ResultWriter> writer_;   // rank 0 only
  std::chrono::steady_clock::time_point start_;
  int64_t records_ = 0;
  std::filesystem::path folder_;  // <root>/<study>/<variant>, on every rank (rank 0's writer makes it)
  bool finished_ = false;
  bool failed_ = false;  // the first finish() said why the run failed
  // The last record's all_reduce tensor, kept until the next record: torch_communicator.h's in_call_ says why.
  pybind11::object last_sums_;
};

}  // namespace terse::python
