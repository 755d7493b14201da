// The step trace (DESIGN.md section 7, "Step traces"): what one rank did in each training step, in the terms a replay
// on a larger simulated cluster needs (issue "what-if for any model", `terse whatif`). The Chrome timeline of trace.h
// is for eyes; this file is for machines: typed fields, no names to parse, a version.
//
// One file per rank, steps.rank<R>.jsonl, written by the results writer beside metrics.jsonl (native runs over every
// transport, and the PyTorch hook). JSON Lines: the first line is the header (format, version, the run's world,
// compressor, scheduler and algorithms, its tensors), then one line per step. Every time is in seconds: a step's
// `start_s` from the run's origin, every event's `start_s` from its step's start, so a replay can shift steps freely.
// Under the simulated clock the times are simulated (the compute model's charges); in real time they are wall time.
//
// What a step holds, and what a replay takes from it:
//   - compute: the worker thread's segments in order: forward of each layer, then backward of each layer with the
//     tensors whose gradients it finished (`ready`): a group can start only once its tensors are ready;
//   - groups: the scheduler's groups in issue order, each with its chunks and its phases in order: compress,
//     one or more collectives (op, algorithm as run, this rank's bytes), decompress; a multi-round codec (PowerSGD)
//     has one compress / collective pair per round;
//   - updates: the optimizer's update of each tensor once its last chunk is in;
//   - negotiations: the scheduler negotiation's rounds (sync_trainer.h, "Negotiation": one 8-byte allgather of every
//     rank's ready count before groups are handed out). Every rank runs the same rounds; how many depends on the
//     ranks' paces, so a replay takes the recorded count. They are control traffic, but on the critical path: a
//     group is issued only after the round that agreed on its tensors (at 64 ranks and 50 us links a round costs
//     six latencies, about 2 ms per step of the quickstart's MLP).
// Waits (a forward's gate, the step's drain) are not events: they are what a replay computes.
//
// Readers treat the file as untrusted: a wrong format or version, a truncated line, a missing or mistyped field, an
// unknown tensor or an event out of order is an InvalidArgument naming the file, the line and the field.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace terse::train {

inline constexpr std::string_view kStepTraceFormat = "terse-step-trace";
// Bumped whenever a field changes meaning or a required one is added; readers refuse every other version.
// 2: steps carry their negotiation rounds.
inline constexpr int kStepTraceVersion = 2;

struct TraceTensor {
  uint64_t id = 0;  // the trainer's tensor id (params()[id])
  std::string name;
  uint64_t elements = 0;
  int layer = 0;  // the layer whose backward produces its gradient (forward order, 0 first)
};

struct TraceHeader {
  std::string format{kStepTraceFormat};
  int version = kStepTraceVersion;
  int rank = 0;
  int world = 1;
  std::string mode = "sync";        // "sync" (the only mode a replay takes today) or "async"
  std::string source = "terse";     // "terse" (terse run / launch) or "pytorch" (the DDP hook)
  std::string workload;             // the workload or model's name
  std::string compressor;           // the variant's compressor spec as configured (e.g. "topk:ratio=0.01")
  std::string scheduler;            // the scheduler plugin's name ("fifo", "fusion", "priority", ...)
  std::string allreduce_algorithm;  // as configured ("auto", "ring", ...); each collective records what ran
  std::string allgather_algorithm;  // as configured
  std::string clock;                // "simulated" or "real_time"
  std::string compute_model;        // under the simulated clock: "calibrated", "measured", "flops"; else ""
  int64_t batch_size = 0;           // examples per rank per step
  int layers = 0;                   // the workload's layer count
  // > 0: steps before it are a dense warm-up, compressor `none` (sync_trainer.h); written only then, so a trace of a
  // run without one reads as before the field.
  int64_t compression_start_step = 0;
  // > 0: the compressor's work per call changes until this step, its last phase's first (terse/phases_v1.h: dgc's
  // warm-up ends there); written only then. `terse whatif` sets the steps before it aside, as a dense warm-up's.
  int64_t compressor_phases_end = 0;
  std::vector<TraceTensor> tensors;  // by id, 0..n-1
};

// One segment of the worker thread's computation.
struct TraceCompute {
  enum class Kind { kForward, kBackward };
  Kind kind = Kind::kForward;
  int layer = 0;
  double start_s = 0;
  double dur_s = 0;
  std::vector<uint64_t> ready;  // kBackward: tensors whose gradients are complete at its end
};

// One phase of a group on the communication thread (or a lane).
struct TracePhase {
  enum class Kind { kCompress, kCollective, kDecompress };
  Kind kind = Kind::kCompress;
  double start_s = 0;
  double dur_s = 0;
  // kCollective only:
  std::string op;         // "allreduce", "allgatherv", "allgather_sizes" (a size exchange's 8 bytes per rank)
  std::string algorithm;  // the algorithm that ran ("ring", "tree", ...; auto resolved), "nccl" under NCCL
  std::string dtype;      // allreduce: the summed type ("f32", "f16", "bf16"); else "u8"
  uint64_t bytes = 0;     // this rank's contribution: the allreduce's buffer, or its allgatherv block
  // allgatherv: every rank's block size (world entries, rank order), from which a replay at another world size draws
  // sizes; empty for allreduce.
  std::vector<uint64_t> rank_bytes;
};

struct TraceGroup {
  uint64_t seq = 0;                              // run-wide issue number, the same on every rank
  std::vector<std::pair<uint64_t, int>> chunks;  // (tensor id, chunk index) in fused order
  std::vector<uint64_t> chunk_elements;          // elements of each chunk, parallel to chunks
  double issue_s = 0;                            // when the scheduler handed it out
  std::vector<TracePhase> phases;                // in order
};

struct TraceUpdate {
  uint64_t tensor = 0;
  double start_s = 0;
  double dur_s = 0;
};

// One round of the scheduler negotiation on the communication thread.
struct TraceNegotiation {
  double start_s = 0;
  double dur_s = 0;
  std::string algorithm;  // the 8-byte allgather's algorithm as run ("bruck")
};

struct TraceStep {
  int64_t step = 0;    // global step index, 0-based
  double start_s = 0;  // from the run's origin
  double step_s = 0;   // the step's whole time on this rank as the metrics report it
  std::vector<TraceCompute> compute;
  std::vector<TraceGroup> groups;
  std::vector<TraceUpdate> updates;
  std::vector<TraceNegotiation> negotiations;  // in order
};

struct StepTrace {
  TraceHeader header;
  std::vector<TraceStep> steps;
};

// The header line and one step's line, as written (one JSON object, no newline).
std::string stepTraceHeaderLine(const TraceHeader& header);
std::string stepTraceStepLine(const TraceStep& step);

// Writes a whole trace to `path` (replacing it); throws InvalidArgument naming the path when it cannot.
void writeStepTrace(const std::filesystem::path& path, const StepTrace& trace);

// Reads and validates a whole trace (see the top of this file); throws InvalidArgument naming the file, the line and
// the field.
StepTrace readStepTrace(const std::filesystem::path& path);

// The file name of rank R's trace in a results folder: "steps.rank<R>.jsonl".
std::string stepTraceFileName(int rank);
// Its inverse: R for a name stepTraceFileName(R) gives (decimal digits, R < 10^9), else nothing.
std::optional<int> stepTraceFileRank(std::string_view name);

// Records one rank's trace while the sync trainer runs (SyncTrainerOptions::step_trace). Thread-safe: the worker
// thread records steps and compute, the communication thread and its lanes groups and updates, each for the step it
// belongs to -- a step's communication may finish after the next step began, and lanes finish groups out of issue
// order, so events are filed by step and groups sorted by seq when read. Time points are the runtime's (rt::now()):
// simulated under the simulated clock. Added beside the format's model (issue 40's recorder); the model is unchanged.
class StepTraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  using Span = std::pair<Clock::time_point, Clock::time_point>;

  // `header`: what the caller knows of the run (workload, compressor, scheduler, algorithms, clock, compute model,
  // source, mode); the trainer fills in the rest (describe). `origin`: time zero of every step's start_s.
  StepTraceRecorder(TraceHeader header, Clock::time_point origin);

  // The trainer's part of the header: rank, world, examples per rank per step, layers and tensors.
  void describe(int rank, int world, int64_t batch_size, int layers, std::vector<TraceTensor> tensors);
  int rank() const;

  // Worker thread. A step is begun before any of its events is recorded (its tensors are handed over after).
  void beginStep(int64_t step, Clock::time_point start);
  void compute(int64_t step, TraceCompute::Kind kind, int layer, Span span, std::vector<uint64_t> ready = {});
  // Moves the end of the step's last compute segment to `end` (the pass's tail after its last report).
  void extendLastCompute(int64_t step, Clock::time_point end);
  void endStep(int64_t step, double step_s);

  // Communication thread or a lane: one group, its phases' start_s / dur_s taken from `phase_spans` (parallel to
  // group.phases) and its issue_s from `issued`.
  void group(int64_t step, TraceGroup group, Clock::time_point issued, const std::vector<Span>& phase_spans);
  void update(int64_t step, uint64_t tensor, Span span);
  // Communication thread: one negotiation round, filed under the step whose tensors the thread last received.
  void negotiation(int64_t step, Span span, std::string algorithm);

  // The trace so far: the steps begun, in order, each with its groups in seq order.
  StepTrace snapshot() const;

 private:
  TraceStep& stepLocked(int64_t step);
  double since(int64_t step, Clock::time_point t) const;  // mutex_ held

  mutable std::mutex mutex_;  // never held across a call into the runtime
  TraceHeader header_;
  Clock::time_point origin_;
  std::map<int64_t, TraceStep> steps_;
  std::map<int64_t, Clock::time_point> starts_;
};

}  // namespace terse::train
