// The results folder of a PyTorch run through terse.torch.ddp_hook: the same folder a terse run writes
// (results/result_writer.h), so `terse compare` puts the two side by side.
//
//   config.textproto  the training script's description of its recipe (an Experiment in text format: workload, data,
//                     optimizer, epochs, seed, ...), with what the hook knows filled in over it -- study, variant,
//                     workers = the group's size, mode SYNC, the compressor and its parameters, error feedback and
//                     momentum correction -- so compare reads the compressor and recipe as it does for native runs.
//                     The transport is left unset: none of the schema's transports is torch.distributed.
//   provenance.json   commit, host, time, terse version, transport "torch.distributed:<backend> (torch <version>)",
//                     world size, mode, and the plugin as core's loader loaded it (path, origin, ABI, version, caps
//                     for f32, parameters).
//   metrics.jsonl     one record per record() call -- the training script's evaluation points -- with the hook's step
//                     count, wall time since the hook was built, the cumulative wire and payload bytes (the means over
//                     ranks, as terse runs report them) and per-step times.
//
// record() is collective (every rank calls it at the same point): the per-rank counters are averaged with one
// torch.distributed all_reduce of a few doubles, which is bookkeeping and so not counted as gradient traffic. Rank 0
// writes; the other ranks only contribute their counters.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

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

class HookResults {
 public:
  // Writes config and provenance (rank 0) and starts the clock. `description` is text-format Experiment fields; a parse
  // error is a ConfigError naming the line. Throws InvalidArgument for an unwritable folder.
  HookResults(DdpAggregator& aggregator, const std::filesystem::path& root, const std::string& study,
              const std::string& variant, const std::string& description, const std::string& torch_version);

  // Collective; see above. test_accuracy outside [0, 1] is an InvalidArgument (compare would skip the record).
  void record(const EvalNumbers& eval);
  // Marks the run completed (or failed with `error`); idempotent. Rank 0 only writes.
  void finish(const std::optional<std::string>& error);
  std::optional<std::filesystem::path> dir() const;

 private:
  DdpAggregator& aggregator_;
  std::unique_ptr<results::ResultWriter> writer_;  // rank 0 only
  std::chrono::steady_clock::time_point start_;
  int64_t records_ = 0;
};

}  // namespace terse::python
