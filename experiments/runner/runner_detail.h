// Helpers of the runner (defined in runner.cc) that its multi-process path (distributed.cc) uses too, so both build a
// rank's trainer and compressor tensors the same way. Internal to experiments/runner.
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/comm/job.h"
#include "core/comm/tcp/transport.h"
#include "core/common/watchdog.h"
#include "core/plugin/compressor.h"
#include "core/plugin/loader.h"
#include "core/plugin/scheduler.h"
#include "core/sim/platform.h"
#include "core/sim/runtime.h"
#include "core/train/local_sgd_schedule.h"
#include "core/train/sync_trainer.h"
#include "core/train/trace.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner.h"
#include "experiments/workloads/workloads.h"
#include "results/result_writer.h"

namespace terse::runner::detail {

double since(std::chrono::steady_clock::time_point t);
train::SyncTrainerOptions trainerOptions(const experiments::Experiment& e);
// data.partition DIRICHLET: every worker's fixed shard of `model`'s training set (core/train/label_partition.h), the
// same on every rank for one config; null for IID. InvalidArgument for a workload without labels.
std::shared_ptr<const train::Partition> dataPartition(const experiments::Experiment& e, const train::Workload& model);
// The same from the labels, for `workers` shards (terse.Recipe draws them for the world it is asked about).
std::shared_ptr<const train::Partition> dataPartition(const experiments::Experiment& e, std::span<const int32_t> labels,
                                                      int num_classes, int workers);
// The seed that draws it: data.partition_seed, else the run's seed.
uint64_t partitionSeed(const experiments::Experiment& e);
// The partition's summary for provenance.json (results::Provenance::partition); nothing for null.
void notePartition(results::Provenance& prov, const experiments::Experiment& e, const train::Workload& model,
                   const train::Partition* partition);
// The same from the labels the partition split (terse.Recipe's, for a PyTorch run's provenance).
void notePartition(results::Provenance& prov, const experiments::Experiment& e, std::span<const int32_t> labels,
                   int num_classes, const train::Partition* partition);
// Local SGD averages the models at every evaluation point too (SyncTrainerOptions::local_sgd): evaluation points of
// the local phase off the schedule (`schedule`: the trainer's, SyncTrainer::localSgdSchedule) add averagings. The
// warning that counts them in a run of total_steps, or "" when there are none.
std::string localSgdEvaluationWarning(const experiments::Experiment& e, int64_t steps_per_epoch, int64_t total_steps,
                                      const train::LocalSgdSchedule& schedule);
// A dense warm-up as long as the run (compression_start_step >= total_steps: the compressor never runs, a quick try
// with fewer epochs or a subset) is a warning, as an unreached local_sgd.start_step is, and so is one before compressor
// none without error feedback (it changes nothing); "" otherwise.
std::string compressionStartWarning(const experiments::Experiment& e, int64_t total_steps);
// "" or why the compressor's phases (Compressor::phaseSteps, terse/phases_v1.h: dgc's warm-up stages) will not all run:
// they end at or before compression_start_step (the compressor counts steps from 0, the dense ones included), or its
// last phase starts at or past the run's end.
std::string compressorPhasesWarning(const experiments::Experiment& e, std::span<const uint64_t> phases,
                                    int64_t total_steps);
// The experiment's compute_jitter as worker `worker`'s draws (core/train/compute_jitter.h), keyed by the run's seed.
train::ComputeJitter computeJitter(const experiments::Experiment& e, int worker);
// The workload's construction options (init seed, hidden sizes, data subsets) from the experiment.
workloads::WorkloadOptions workloadOptions(const experiments::Experiment& e);
std::string shortWhat(const std::exception_ptr& e);
// Whether e is a comm::CommError: the root cause of a failed run is the first error that is not (a transport failing
// is usually the consequence of another rank's error).
bool isCommError(const std::exception_ptr& e);
// An evaluation point's record with the fields both paths fill alike (step, epoch, test results, rank 0's mean train
// loss since the previous record, lr); the caller adds bytes and times.
results::MetricsRecord evalRecord(int64_t done, int64_t per_epoch, const train::EvalResult& ev, double loss_since,
                                  int64_t steps_since, double lr);
// After an appended record: the summary's counts, last and best accuracy, bytes and time.
void noteRecord(RunSummary& summary, const results::MetricsRecord& m, const train::EvalResult& ev, int64_t records);
// The tcp transport's options for this rank of a TCP run (distributed.cc): bind address (config, TERSE_BIND_ADDR,
// loopback for a loopback master), TERSE_ADVERTISE_ADDR, timeout, socket buffers, the config's link emulation, the
// variant's store prefix and the host label.
comm::TcpOptions tcpOptions(const experiments::Experiment& e, const comm::JobEnv& joined, int rank, int world,
                            std::chrono::milliseconds timeout, const std::string& prefix);
// tcp.timeout of a TCP variant.
std::chrono::milliseconds tcpTimeout(const experiments::Experiment& e);
// What a TCP variant that failed on `rank` throws, after `writer` (rank 0's) marked the folder failed.
RunFailed tcpRunFailed(const experiments::Experiment& e, int rank, int world,
                       std::optional<results::ResultWriter>& writer, const std::string& what);
// The control channel's transport of a multi-process run (sync: rank_driver.h; async: the ranks' reports): `to`
// without link emulation, under the variant's "control/" store prefix.
std::unique_ptr<comm::Transport> connectControl(const comm::TcpOptions& to, comm::Job& job, const std::string& prefix);
// What both paths write to provenance.json before the plugins: commit, host, time, version, transport, mode, world
// size and the link emulation as configured (overrides included).
results::Provenance baseProvenance(const experiments::Experiment& e, std::string_view transport, int world,
                                   const std::string& start_time, const std::string& terse_version,
                                   bool emulation_enabled);
// Clock SIMULATED: the run's cluster (one host per rank of the in-process job: a parameter server's shards, then its
// workers), how computation becomes simulated time, and both noted in the provenance (clock "simulated").
sim::PlatformSpec simulatedPlatform(const experiments::Experiment& e);
// computeOptions: the config's model and scales; a CALIBRATED run's table is added by Runner::run (calibration.h).
// noteSimulation records `compute` (table included) and `notes` (the calibration's file and source).
sim::ComputeOptions computeOptions(const experiments::Experiment& e);
void noteSimulation(results::Provenance& prov, const experiments::Experiment& e, const sim::ComputeOptions& compute,
                    const std::vector<std::pair<std::string, std::string>>& notes);
// Runs `setup`, a step that allocates per worker or per layer from the config's counts, and turns a std::bad_alloc out
// of it into an InvalidArgument naming what was being allocated ("allocating 1024 model replicas of workload 'mlp'
// (...): out of memory"): a bare std::bad_alloc names nothing, and the config is what the reader can change. The
// config's bounds (experiments/config/limits.h) keep each count sane; their product can still outgrow a machine.
template <typename Setup, typename What>
void allocating(Setup&& setup, What&& what) {
  try {
    setup();
  } catch (const std::bad_alloc&) {
    TERSE_THROW(InvalidArgument, "allocating " << what() << ": out of memory");
  }
}
// "4 model replicas of workload 'mlp' (hidden sizes [256, 128]; 235146 parameters, 940584 bytes of f32 values each)":
// the size from a replica already built (in `built`), when there is one.
std::string replicasWhat(const experiments::Experiment& e, int count,
                         const std::vector<std::unique_ptr<train::Workload>>& built);

// The scheduler's provenance record. The trainers own the run's instances; one more, made and finalized here,
// reports the resolved parameters (init depends only on the parameters, so every instance resolves the same).
results::PluginRecord schedulerRecord(const SchedulerPlugin& plugin, const Params& params);

// Plugin calls run under the study's plugin_timeout (core/common/watchdog.h). A PluginWatch sets the deadline for its
// lifetime and arms the way out: when a call overruns, the abort actions registered with abortOnOverrun run first (the
// run's communicators: every pending and later collective fails, and over tcp the abort notices make the peers fail
// at once, naming this rank); a grace later (kOverrunGrace, for the notices to leave), the process writes every results
// folder it has open as failed with the overrun's message, says so on stderr and exits with status 1. It cannot do
// better: the hung thread can be neither stopped nor joined, and a trainer's destructor would join it.
inline constexpr std::chrono::milliseconds kOverrunGrace{1000};
class PluginWatch {
 public:
  explicit PluginWatch(const experiments::Experiment& e);
  ~PluginWatch();
  PluginWatch(const PluginWatch&) = delete;
  PluginWatch& operator=(const PluginWatch&) = delete;

 private:
  watchdog::Registration exit_;
};
[[nodiscard]] watchdog::Registration abortOnOverrun(std::function<void(const std::string& reason)> abort);

// The step trace's header as the variant describes it (core/train/step_trace.h): workload, compressor spec
// ("topk:ratio=0.01"), scheduler, the algorithms as configured ("nccl" on NCCL), clock and compute model. The trainer
// adds rank, world, batch size, layers and tensors.
train::TraceHeader stepTraceHeader(const experiments::Experiment& e, bool simulated);
// Step traces (step_trace: true): one recorder per rank, each written into the variant's folder `dir` through the
// results writer when this goes -- whatever happened to the run, so a failed run's trace shows where it stopped.
// Declared before the trainers, so that they are joined before their recorders are read.
class StepTraceFiles {
 public:
  StepTraceFiles(const experiments::Experiment& e, std::filesystem::path dir, bool simulated);
  ~StepTraceFiles();
  StepTraceFiles(const StepTraceFiles&) = delete;
  StepTraceFiles& operator=(const StepTraceFiles&) = delete;
  // A recorder for the next trainer (SyncTrainerOptions::step_trace); nullptr when the experiment records none.
  // `origin`: the run's time zero, the steps' start_s. `compressor_phases`: the rank's compressor instance's
  // (Compressor::phaseSteps), whose last the header records as compressor_phases_end.
  train::StepTraceRecorder* add(std::chrono::steady_clock::time_point origin,
                                std::span<const uint64_t> compressor_phases = {});

 private:
  std::optional<train::TraceHeader> header_;
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<train::StepTraceRecorder>> recorders_;
};

// Timelines (trace: true): one recorder per rank, each written to `dir`/trace.rank<R>.json when this goes --
// whatever happened to the run, so a failed run's trace shows where it stopped. Declared before the trainers, so that
// they are joined before their recorders are read.
class TraceFiles {
 public:
  TraceFiles(bool enabled, std::filesystem::path dir) : enabled_(enabled), dir_(std::move(dir)) {}
  ~TraceFiles();
  TraceFiles(const TraceFiles&) = delete;
  TraceFiles& operator=(const TraceFiles&) = delete;
  // Rank's recorder (SyncTrainerOptions::trace); nullptr when the experiment records none.
  train::TraceRecorder* add(int rank, std::chrono::steady_clock::time_point origin);

 private:
  bool enabled_;
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<train::TraceRecorder>> traces_;
};

// Rank r's sync trainer over `comm`: its own compressor instance, a scheduler instance of its own, the variant's
// codec options and seed, and codecs on the communicator's stream (NCCL: device buffers). Every World's ranks are
// built by this one function, so an in-process rank is the same trainer as a process's.
// `dense`: an instance of the dense warm-up's compressor (densePlugin), null without one.
std::unique_ptr<train::SyncTrainer> makeSyncTrainer(const experiments::Experiment& e, train::Workload& model,
                                                    comm::Communicator& comm, std::shared_ptr<Compressor> instance,
                                                    const SchedulerPlugin& scheduler, train::SyncTrainerOptions to,
                                                    std::shared_ptr<Compressor> dense);

// The dense warm-up's compressor (compression_start_step > 0; sync_trainer.h, "Dense warm-up"): the built-in `none`,
// loaded like any plugin, without parameters or decorators. Null without a warm-up.
std::shared_ptr<const CompressorPlugin> densePlugin(const experiments::Experiment& e, PluginLoader& loader);
// Its provenance record, role "dense_warmup"; `instance` one of its instances.
results::PluginRecord denseRecord(const CompressorPlugin& plugin, const Compressor& instance);

// An in-process sync job's links: the trainers' communicators over the config's link emulation (and the simulated
// network, io.network) and the control channels' transports (rank_driver.h), one fabric each.
struct InprocLinks {
  std::vector<std::unique_ptr<comm::HostCommunicator>> comms;
  std::vector<std::unique_ptr<comm::Transport>> control;
};
InprocLinks makeInprocLinks(const experiments::Experiment& e, const comm::InprocOptions& io);

}  // namespace terse::runner::detail
