// The runner: one resolved Experiment (experiments/config) in, one results folder (results/result_writer.h) out.
//
// Sync mode on the inproc transport: the data set is loaded once and shared read-only; N workloads are built with the
// same init seed (and checked to start bit-identical), N inproc endpoints with the config's link emulation, one
// HostCommunicator and one CompressionPipeline per parameter tensor per rank, and one thread per rank runs a
// SyncTrainer. Each rank runs the SyncRankDriver (rank_driver.h), the multi-process code: at every evaluation point
// (every eval.every_steps steps, each epoch end when eval.per_epoch, and always after the last step) every rank sends
// its counters and parameter checksum to rank 0 over a control channel; rank 0 checks that the replicas are still
// identical, evaluates on the held-out set and appends the metrics record. Ranks other than 0 never wait for rank 0
// here: they block in the next step's collectives until it joins, which is what makes the published numbers belong to
// the same step. A World (world.h) makes the ranks -- threads, or actors of a simulation -- and owns their failure.
//
// Transport TCP (distributed.cc): this process is one rank of a multi-process job (`terse launch -n N -- terse run
// CONFIG`, srun, mpirun); workers must equal the job's world size. The same per-rank setup and driver run over a tcp
// transport, the control channel is a tcp transport of its own, and only rank 0 writes results.
//
// Modes ASYNC, SSP and HOGWILD (async_runner.cc, distributed_async.cc): parameter-server shards and workers as threads
// of this process, or as processes of a TCP job of servers + workers ranks (rank 0 = shard 0 writes the results).
//
// An error on any rank aborts the communicators (nothing hangs), marks the run failed in status.json with the
// message, keeps the records already written, and is rethrown as RunFailed.
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm/inproc_transport.h"
#include "experiments/config/config.h"
#include "experiments/workloads/dataset.h"
#include "results/result_writer.h"

namespace terse::sim {
struct ComputeOptions;
}

namespace terse {
class PluginLoader;
}
namespace terse::comm {
struct Job;
}

namespace terse::runner {

enum class ProgressMode {
  kAuto,      // kTerminal when stderr is a terminal, else kLines
  kTerminal,  // one line updated in place with \r
  kLines,     // a plain line per evaluation point
  kOff,
};

struct RunnerOptions {
  PluginLoader* loader = nullptr;  // required: resolves the compressor by name
  // --out: results root instead of each experiment's output_dir.
  std::optional<std::filesystem::path> output_root;
  ProgressMode progress = ProgressMode::kAuto;
  std::ostream* progress_out = nullptr;  // default std::cerr
  std::string terse_version;             // written into provenance
};

struct RunSummary {
  std::string study;
  std::string variant;
  std::filesystem::path dir;  // the results folder
  int64_t steps = 0;
  int64_t records = 0;
  double final_accuracy = 0;
  double best_accuracy = 0;
  double final_test_loss = 0;
  uint64_t wire_bytes_per_worker = 0;
  uint64_t payload_bytes_per_worker = 0;
  double wall_s = 0;
  bool simulated = false;  // wall_s is simulated seconds (clock SIMULATED)
};

// A run that started and failed; the message says which variant and why, and where its partial results are.
class RunFailed : public std::runtime_error {
 public:
  RunFailed(const std::string& message, std::filesystem::path dir)
      : std::runtime_error(message), dir_(std::move(dir)) {}
  const std::filesystem::path& dir() const noexcept { return dir_; }

 private:
  std::filesystem::path dir_;
};

// A run whose driver refused the variant's workload before training: workload pytorch's checks of the user's module,
// the model's name, data()'s return, the model on data()'s first batch and the device
// (experiments/python/terse/train.py, ConfigError), a config error that only the run could find; or the user's module
// itself failed before training (importing it, its model() or data(), its forward on the first batch). A later
// variant with the same workload, data and workers would fail alike, and `terse run` skips it (sameWorkloadAsRefused).
// On transport INPROC one driver speaks for every rank; under TCP the ranks' drivers agree before training which rank
// failed and how (train.py, _agree_before_training), so every rank's `terse run` throws this alike and skips alike.
class WorkloadRefused : public RunFailed {
 public:
  using RunFailed::RunFailed;
};

// Whether `later` trains what a variant refused with WorkloadRefused trained: its workload, data and workers, all that
// the driver's checks read.
bool sameWorkloadAsRefused(const experiments::Experiment& later, const experiments::Experiment& refused);

// The ConfigOptions the runner can serve: its workloads, sync mode, the inproc transport, and the loader.
experiments::ConfigOptions runnerConfigOptions(PluginLoader* loader);

class Runner {
 public:
  explicit Runner(RunnerOptions options);
  // Runs one resolved, validated experiment. Throws RunFailed once the results folder exists, InvalidArgument before
  // (e.g. the folder cannot be created).
  RunSummary run(const experiments::Experiment& experiment);
  // False once this process ran a TCP variant as a rank other than 0: such a rank trains but writes and measures
  // nothing (its summaries are empty); rank 0 reports for the job.
  bool primary() const noexcept { return primary_; }
  // A variant the study does not run (`terse run` skips it after another variant's WorkloadRefused): on the primary
  // rank its folder is written, replacing an earlier run's records, with status failed and `why`. Left as it was, an
  // earlier run's completed folder would pass in `terse compare` for this study's result.
  void skip(const experiments::Experiment& experiment, std::string_view why);

 private:
  std::shared_ptr<const workloads::DataSplit> dataFor(const experiments::Experiment& experiment);
  // Transport TCP: this process is one rank of a job (distributed.cc).
  RunSummary runTcp(const experiments::Experiment& experiment);
  // The start of a TCP variant on this process, sync or async (distributed.cc): joins the job (once per process) and
  // numbers the variant's store keys, returning their prefix; rank 0 opens the results folder under `root`, the others
  // write nothing.
  std::string startTcpVariant(const experiments::Experiment& experiment, int rank, std::chrono::milliseconds timeout,
                              const std::filesystem::path& root, std::optional<results::ResultWriter>& writer,
                              RunSummary& summary);
  // Mode SYNC on transport INPROC: the ranks as threads of this process, in real time (network null) or as actors of
  // a simulation whose network times the frames (clock SIMULATED). Writes metrics, provenance and traces; the caller
  // owns the status.
  void runInprocSync(const experiments::Experiment& experiment, results::ResultWriter& writer, RunSummary& summary,
                     std::shared_ptr<comm::FrameNetwork> network);
  // Modes ASYNC, SSP, HOGWILD on transport INPROC: parameter server shards and workers as threads (async_runner.cc),
  // in real time (network null) or as actors of a simulation (ASYNC and SSP); as runInprocSync.
  void runInprocAsync(const experiments::Experiment& experiment, results::ResultWriter& writer, RunSummary& summary,
                      std::shared_ptr<comm::FrameNetwork> network);
  // Modes ASYNC, SSP over transport TCP: this process is one shard or worker (distributed_async.cc).
  RunSummary runTcpAsync(const experiments::Experiment& experiment);
  // Workload pytorch: the Python package's driver trains the variant (pytorch_runner.cc).
  RunSummary runPyTorch(const experiments::Experiment& experiment);

  RunnerOptions options_;
  // Data sets by (dir, train subset, test subset): variants of one study load Fashion-MNIST once.
  std::map<std::string, std::shared_ptr<const workloads::DataSplit>> data_cache_;
  // The job this process joined for its first TCP variant (rank, store, token), kept for the study's later variants.
  std::shared_ptr<comm::Job> job_;
  int tcp_runs_ = 0;  // TCP variants started: numbers each variant's store keys (every rank runs the same sequence)
  bool primary_ = true;
  // The simulated run's compute model (its calibrated table) and what provenance says of the table (Runner::run).
  std::shared_ptr<const sim::ComputeOptions> sim_compute_;
  std::vector<std::pair<std::string, std::string>> sim_notes_;
};

}  // namespace terse::runner
