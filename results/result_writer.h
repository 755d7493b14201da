// The results folder of one run (DESIGN.md section 7): <root>/<study>/<variant>/ holding
//
//   config.textproto   the resolved config the run used (the runner passes the text)
//   provenance.json    what ran: the git commit the code was built from (results/build_commit.h: taken at build
//                      time, so a binary run elsewhere or after a checkout still names its own), plugins (path,
//                      SHA-256, version, ABI, caps, parameters), host, CPU, GEMM kernel, transport, link emulation,
//                      world size, start time; a PyTorch hook's settings
//   metrics.jsonl      one JSON object per evaluation point, one per line, appended and flushed per record
//   status.json       {"state": "running" | "completed" | "failed", ...}; written at start and at the end; while
//                      "running" it names the writing process ("pid", "host"), so that `terse compare` can tell a
//                      run whose process is gone (killed by SIGKILL) from one still running
//
// A killed run keeps every record already written (each is flushed to the OS as it is appended) and its status says
// "running" -- unless it died of a fatal signal: then the handler of core/common/crash.h has rewritten the status as
// "failed", naming the signal and the plugin call; or it was stopped by SIGTERM, SIGHUP or SIGINT in a process that
// records its stop (core/common/stop_signals.h, `terse run`): then failStopped() below has. SIGKILL, and a signal
// neither takes (SIGQUIT, SIGUSR1), still leave "running". A record line is far shorter than the stdio buffer, which
// each flush empties, so it reaches the file in one write(2) and a kill leaves whole lines; readers should still skip a
// last line without its newline (a partial line, e.g. after a full disk) rather than fail on it. A failed run's status
// says "failed" with the error message. Files that are rewritten (config, provenance, status) go through a temporary
// file and a rename, so a reader never sees half of one. No fsync: surviving a process crash is the goal, not a power
// cut, and an fsync per record would make a fast run I/O bound.
#pragma once

#include <sys/types.h>
#include <cstdint>
#include <cstdio>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/common/crash.h"
#include "core/plugin/compressor.h"
#include "core/plugin/plugin_info.h"
#include "core/train/step_trace.h"

namespace terse::results {

inline constexpr std::string_view kConfigFile = "config.textproto";
inline constexpr std::string_view kProvenanceFile = "provenance.json";
inline constexpr std::string_view kMetricsFile = "metrics.jsonl";
inline constexpr std::string_view kStatusFile = "status.json";

inline constexpr std::string_view kStateRunning = "running";
inline constexpr std::string_view kStateCompleted = "completed";
inline constexpr std::string_view kStateFailed = "failed";

// One loaded plugin as the run used it. provenance.json adds the SHA-256 of the file at info.path ("sha256", or
// "sha256_error" when it cannot be read). `params` are the ones the config gave; `resolved` every parameter the
// instance used, its defaults included, as the plugin reported them (terse/resolved_params_v1.h, optional in ABI v1:
// plugins built with <terse/sdk.hpp> report them), so a default that changes between plugin builds shows in the
// record, not only in the hash. provenance.json writes them as "resolved_params", or "resolved_params": null with
// "resolved_params_note" when the plugin did not report them.
struct PluginRecord {
  PluginInfo info;
  std::optional<CompressorCaps> caps;  // compressors: the caps for f32 with the run's parameters
  Params params;
  std::optional<Params> resolved;
  // What the run used it for where its kind does not say: "pull_compressor" (a parameter server's pulls); empty for the
  // run's compressor and scheduler.
  std::string role;
};

inline constexpr std::string_view kDefaultsNotReported = "defaults not reported";

struct Provenance {
  std::string git_commit;  // buildCommit() (results/build_commit.h): the commit the code was built from
  std::string host;        // hostName()
  std::string cpu;         // cpuDescription(): measured computation (real time, or simulated with measured compute)
                           // depends on it, so two tables from different CPUs differ in their time columns
  // The kernel of the host workloads' matrix products (experiments/workloads/gemm.h): "terse-fixed-order-v1", whose
  // sums come out the same on every x86-64 CPU, or "openblas <core> (<config>)", whose order is the core's; "cublas"
  // for models on a CUDA device. Empty (left out of the file) where terse computes no model (the PyTorch hook).
  std::string gemm;
  std::string start_time;  // isoTimeUtc()
  std::string terse_version;
  std::string transport;  // "inproc", ...
  int world_size = 1;
  std::string mode;  // "sync", ...
  // Link emulation as configured: bandwidth, latency, nic, nic_ingress, overrides (key, value as written).
  std::vector<std::pair<std::string, std::string>> link;
  std::vector<PluginRecord> plugins;
  // "real_time", or "simulated" (DESIGN.md section 9): then every time figure is simulated seconds, and `simulation`
  // says on what platform and with what computation model.
  std::string clock = "real_time";
  std::vector<std::pair<std::string, std::string>> simulation;
  // A PyTorch run through terse's DDP hook (experiments/python/hook_results.h): the hook's settings that change the
  // results and that the experiment schema has no field for ("granularity": "tensor" or "bucket"; "module_sha256", the
  // hash of a module workload's file, which the config names only by path, and "module_files_sha256" over every file
  // of its folder the run imported; "torchvision", its version). Written as "hook" only when set, so native runs'
  // files are as before.
  std::vector<std::pair<std::string, std::string>> hook;
  // A module workload's files (relative path in the module's folder, SHA-256): the module and every file of its
  // folder tree it imported. Written as "module_files" only when set.
  std::vector<std::pair<std::string, std::string>> module_files;
  // A non-IID split of the training set (data.partition DIRICHLET, core/train/label_partition.h): "kind", "alpha",
  // "mean_label_distance" and per worker ("worker<w>") its label histogram, counts separated by spaces. Written as
  // "data_partition" only when set.
  std::vector<std::pair<std::string, std::string>> partition;
};

// One evaluation point. Bytes are per worker: the mean over ranks of what each rank's transport sent (frame headers
// included) and of what each rank's compressor produced. Times are seconds; the *_s_per_step fields are means over the
// steps so far and over ranks.
struct MetricsRecord {
  int64_t epoch = 0;          // epochs completed
  double epoch_progress = 0;  // steps / steps per epoch: 1.5 = half way through the second epoch
  int64_t step = 0;           // optimizer steps done
  double test_accuracy = 0;
  double test_loss = 0;
  int64_t test_examples = 0;
  double train_loss = 0;  // rank 0's mean batch loss since the previous record
  double lr = 0;          // the last step's learning rate
  uint64_t wire_bytes_per_worker = 0;
  uint64_t payload_bytes_per_worker = 0;
  // Sync mode: the scheduler's negotiation (sync_trainer.h), control traffic apart from wire_bytes_per_worker: the
  // frames of its rounds, headers included, and the number of rounds, per worker (the mean over ranks). Its count
  // depends on how the ranks' paces interleave, so it is kept out of the wire bytes that one seed must reproduce.
  // Means over ranks, so fractional where the ranks are a round apart when counted.
  double control_bytes_per_worker = 0;
  double negotiation_rounds_per_worker = 0;
  double wall_s = 0;                 // since the run started (setup excluded)
  double compute_s_per_step = 0;     // forward and backward, less the forward's waits for updates
  double compress_s_per_step = 0;    // codec encode, error feedback included
  double decompress_s_per_step = 0;  // codec decode (and a CUSTOM reduce fold)
  // The communicator's collectives, overlapped with compute or not, the scheduler's negotiation rounds included
  // (sync_trainer.h): every collective of the steps so far counted once, as a step trace's collective phases and
  // negotiations sum (a round still in flight at the record aside). Not the allreduce alone: the rounds add theirs.
  double comm_s_per_step = 0;
  // Sync: what the worker waited for its communication -- the codec, the collectives and the optimizer's update
  // that computing could not hide (step_s_per_step ~ compute_s_per_step + exposed_comm_s_per_step). Not a part of
  // comm_s_per_step: with little compute to hide behind it exceeds it, up to comm + compress + decompress + the update.
  // Async and SSP: all of comm_s_per_step.
  double exposed_comm_s_per_step = 0;
  double step_s_per_step = 0;
  // Mode-specific numbers, written after the fields above as flat keys in this order (the async keys below).
  std::vector<std::pair<std::string, double>> extra;
};

// Reserved for the async (parameter-server) trainer; the sync runner never writes them. A metrics record of an async
// run may add, all cumulative since the run started (like the *_s_per_step means):
//   staleness_mean           mean tau = server_version - worker_version over every push the server applied
//   staleness_max            the largest tau applied
//   staleness_hist_<k>       pushes applied with tau == k, k = 0, 1, 2, ... (an absent bucket is 0)
//   staleness_hist_overflow  pushes with tau beyond the largest bucket the trainer keeps
//   staleness_buckets        how many buckets it keeps: tau of the overflow are at least this (records before the
//                            key existed kept 64)
// and, per server shard k and worker w (wire bytes, frame headers included, cumulative):
//   server<k>_bytes_in, server<k>_bytes_out   what shard k received and sent
//   worker<w>_bytes_out, worker<w>_bytes_in   what worker w sent (pushes, clocks, pull requests, pings) and received
//                                             (the shards' replies: pulls, acknowledgements)
//   push_bytes_per_worker                     the mean of worker<w>_bytes_out
//   pull_bytes_per_worker                     the mean of worker<w>_bytes_in
//   push_payload_bytes_per_worker             the pushes' compressor output (raw f32 without one), per worker
//   pull_payload_bytes_per_worker             the pull replies' bodies (parameters in pull_dtype, or a delta pull's
//                                             pull-compressor payloads with a u64 length each and a u64 checksum; a
//                                             u64 version per piece), per worker
//   pull_residual_rel                         with a pull compressor: how far the workers' copies are from the
//                                             parameters, relative to them (kPullResidualKey below)
// A parameter-server record's wire_bytes_per_worker is push_bytes_per_worker + pull_bytes_per_worker (all the job put
// on the network, over the workers, as a sync run's is its ranks' sends over the ranks) and its
// payload_bytes_per_worker push_payload_bytes_per_worker + pull_payload_bytes_per_worker. Records written before
// these keys existed counted the pushes alone (worker<w>_bytes_out); `terse compare` recounts them (reader.h).
//   workers_live                              workers not dropped (or failed) so far
//   worker<w>_left_step, worker<w>_left_s     once worker w stopped early: its steps done and the run's wall time
//   worker<w>_dropped_s                       once the servers dropped it after their worker_timeout
// `terse compare` (results/compare.h) reads them into its staleness column: mean and max, and the median and 90th
// percentile from the histogram. Flat keys rather than an array so a record stays one flat JSON object (a column per
// key for tools).
inline constexpr std::string_view kStalenessMeanKey = "staleness_mean";
inline constexpr std::string_view kStalenessMaxKey = "staleness_max";
inline constexpr std::string_view kStalenessHistPrefix = "staleness_hist_";
inline constexpr std::string_view kStalenessHistOverflowKey = "staleness_hist_overflow";
inline constexpr std::string_view kStalenessBucketsKey = "staleness_buckets";
// staleness_hist_<tau> is written for tau below this; larger tau are counted in staleness_hist_overflow. As large as
// the most workers a study runs (what-if's 1,024), since without bounded staleness a push's tau is about the number
// of workers: at 256 workers, 64 buckets left every percentile past them. Buckets are written only where pushes fell.
inline constexpr uint64_t kStalenessHistBuckets = 1024;
// What records without staleness_buckets kept.
inline constexpr uint64_t kLegacyStalenessHistBuckets = 64;
inline constexpr std::string_view kPushBytesKey = "push_bytes_per_worker";
inline constexpr std::string_view kPullBytesKey = "pull_bytes_per_worker";
inline constexpr std::string_view kPushPayloadBytesKey = "push_payload_bytes_per_worker";
inline constexpr std::string_view kPullPayloadBytesKey = "pull_payload_bytes_per_worker";
// Compressed pulls (parameter_server.pull_compressor): sqrt(sum ||params - copy||^2 / sum ||params||^2) over every
// delta pull so far and every shard, the copy being the worker's after the pull. How far from the shards' parameters,
// relative to them, the workers compute; 0 for exact pulls, absent without a pull compressor.
inline constexpr std::string_view kPullResidualKey = "pull_residual_rel";

std::string metricsRecordJson(const MetricsRecord& record);
std::string provenanceJson(const Provenance& provenance);

std::string hostName();
// Which process a pid names, as status.json records it while running ("boot_id", "pid_start"): the kernel's boot id
// and the process's start in clock ticks after boot (/proc/<pid>/stat, field 22). A pid is reused; the pair is not, so
// `terse compare` tells a run still running from one whose pid another process now holds. Empty / nullopt where /proc
// cannot say.
std::string bootId();
std::optional<unsigned long long> processStartTicks(pid_t pid);
// The processor the run's computation was measured on, from /proc/cpuinfo: "AMD EPYC (family 26 model 2, 2 logical
// CPUs, avx512f)": the model name alone does not tell CPU generations apart (a Zen 3 and a Zen 5 both say "AMD
// EPYC"), the family and model do; the widest vector extension is the one the codecs' fast paths dispatch on.
// "unknown" where the file cannot be read.
std::string cpuDescription();
// The same from a cpuinfo text (the parser, for tests); "unknown" when it names no processor.
std::string cpuDescriptionFrom(std::string_view cpuinfo);
// Now, as 2024-05-01T12:34:56Z.
std::string isoTimeUtc();

// Writes `text` to `path` through `path`.tmp and a rename. Throws InvalidArgument naming the file and errno's text.
void writeFileAtomic(const std::filesystem::path& path, std::string_view text);

// Rank R's step trace (core/train/step_trace.h) as steps.rank<R>.jsonl in `dir`, a variant's folder (created when
// missing: a rank of a multi-host job may be the first to write there), atomically like every file of the folder.
void writeStepTrace(const std::filesystem::path& dir, const train::StepTrace& trace);

// For a process that ends because it was stopped (core/common/stop_signals.h): marks every writer of the process still
// "running" failed with `error` and `signal` ("SIGTERM") beside it, its record count read again from its metrics.jsonl
// (a simulation's child appends to it), and holds every writer from then on: a call of any thread that would write (a
// record, a status, a new folder) waits for the process to end, so that nothing is written after the stop was
// recorded and no later variant starts. Status and records are written under one lock per process, so a status this
// writes is never interleaved with a writer's own. Returns the folders it marked.
std::vector<std::filesystem::path> failStopped(std::string_view error, std::string_view signal);

class ResultWriter {
 public:
  // Creates <root>/<study>/<variant>/, replaces an older run's metrics.jsonl there (records of two runs must never
  // mix), removes the other files an older run wrote there that this run may not write again (provenance.json,
  // steps.rank<R>.jsonl, trace.rank<R>.json; not calibration.json, which a config may replay) and writes status
  // "running". Throws InvalidArgument naming the folder when it cannot.
  ResultWriter(const std::filesystem::path& root, std::string_view study, std::string_view variant);
  // A writer destroyed while still "running" (an exception unwound past it) marks the run failed.
  ~ResultWriter();
  ResultWriter(const ResultWriter&) = delete;
  ResultWriter& operator=(const ResultWriter&) = delete;

  const std::filesystem::path& dir() const noexcept { return dir_; }
  void writeConfig(std::string_view text);
  void writeProvenance(const Provenance& provenance);
  // Appends one line and flushes it to the OS.
  void append(const MetricsRecord& record);
  int64_t records() const noexcept { return records_; }
  // Counts the records in metrics.jsonl again: another process appended to it (a simulation's, which works on a copy
  // of this writer).
  void recount();

  void markCompleted();
  // In a process being stopped (core/common/stop_signals.h) the error starts with the stop, "terminated by SIGTERM: ",
  // and the status names the signal.
  void markFailed(std::string_view error);
  std::string_view state() const noexcept { return state_; }

 private:
  friend std::vector<std::filesystem::path> failStopped(std::string_view error, std::string_view signal);
  // The callers hold the process's writer lock (result_writer.cc).
  void writeStatus(std::string_view state, std::string_view error, std::string_view signal = {});
  void recountLocked();

  std::filesystem::path dir_;
  std::FILE* metrics_ = nullptr;
  int64_t records_ = 0;
  std::string state_;
  std::string started_;
  // While "running": the status the fatal-signal handler (core/common/crash.h) writes should the process die.
  std::unique_ptr<crash::StatusFile> crash_status_;
};

}  // namespace terse::results
