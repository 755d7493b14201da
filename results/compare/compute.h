// What `terse compare`'s table says (DESIGN.md section 7): one study's variants, read back by reader.h, turned into
// rows of numbers with the study's baseline and ratios, in the table's row order. format.h prints them.
//
// Definitions (the table's columns):
//   final / best accuracy   the last evaluation point's test accuracy / the highest one
//   wire bytes              the last point's cumulative wire bytes per worker (frame headers included); per step =
//                           that / the last point's step. All the job put on the network over its workers: a sync
//                           run's every rank's sends; a parameter server's both directions, push (what the workers
//                           sent: pushes, clocks, pull requests, pings) + pull (what the shards sent back: pulls,
//                           acknowledgements), shown apart as push / pull, so that ratios and bytes to target compare
//                           across modes
//   payload bytes           the last point's cumulative compressor output per worker that is sent (a SUM payload's
//                           header stays on the rank); a parameter server's adds the pull replies' bodies
//   control bytes / rounds  the last point's cumulative bytes and rounds of the scheduler negotiation per worker:
//                           control frames, headers included, not part of the wire bytes
//   ratio                   baseline wire bytes per step / this variant's (per step, so a run that stopped early
//                           compares fairly); the baseline's is 1
//   bytes / time to target  the first time the accuracy reaches the target, interpolated linearly between the last
//                           point below it and the first point at or above it (in both bytes and wall time); when the
//                           very first point already reaches it, that point's values (nothing was measured before it);
//                           "not reached" when no point does
//   step time split         the last point's per-step means: compute, codec (compress + decompress), communication and
//                           exposed communication (the part of communication not hidden behind compute), and the whole
//                           step
//   staleness               async runs only (result_writer.h's reserved staleness_* fields): mean and max as
//                           recorded, median and 90th percentile from the histogram when present
//
// Repeats (experiment.proto's `seeds`): the runs of one variant at several seeds make one row. Every number in it is
// the mean over those seeds (ratio: of the mean per-step bytes; bytes and time to target: over the seeds, and only when
// every seed reaches the target, else "not reached" with a note saying how many did). Final and best accuracy, wire
// bytes and bytes and time to target also carry the 95% Student t-interval of the mean and, against the baseline, a
// t-test's p-value (stats.h): paired on the per-seed differences when the row has the metric at exactly the seeds
// the baseline has it (2 or more), else Welch's. A difference with p >= 0.05 is within the seed-to-seed noise and the
// tables mark it.
//
// A study with a grid (experiment.proto `grid`) makes one table per point, in the natural order of the points' values
// (1Gbps before 10Gbps), each with its own baseline and ratios: bytes against dense at 8 workers are not bytes
// against dense at 32. Its rows carry the variants' names in the file; the table names the point.
//
// The baseline of a study is the variant whose compressor is "none" (provenance.json's loaded plugin, else
// config.textproto's compressor.name); among several, one without error feedback or momentum correction, then a
// completed one, then the first by name. --baseline NAME picks one by variant name instead.
//
// Row order: variants that reached the target first, fewest bytes to target first; then the rest by final accuracy,
// highest first; variants without any record last; ties by name. Bytes to target is the question the table exists to
// answer (what does accuracy X cost on the wire), and final accuracy ranks the ones that never got there.
#pragma once

#include "results/compare/room.h"  // the room's guard

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "results/compare/reader.h"
#include "results/compare/stats.h"

namespace terse::results {

struct CompareOptions {
  double target = 0.85;
  std::optional<std::string> baseline;  // a variant name; default: the dense one (see above)
};

// Where the accuracy first reaches a target (see "bytes / time to target" above).
struct TargetCrossing {
  double wire_bytes = 0;
  double wall_s = 0;
};
std::optional<TargetCrossing> crossTarget(const std::vector<EvalPoint>& points, double target);

struct StalenessSummary {
  double mean = 0;
  double max = 0;
  std::optional<double> p50, p90;  // from the histogram
  // A percentile that lands among the pushes past the histogram's last bucket (staleness_hist_overflow): it is at
  // least the record's bucket count (staleness_buckets), and its p50 / p90 above is that bound.
  bool p50_beyond = false, p90_beyond = false;
};

// One metric of a row over its seeds (see "Repeats" above).
struct SeedStats {
  std::vector<double> samples;  // one per seed that has the value
  // The seed of each sample (RunData::repeat_seed), which pairs it with the baseline's; none for a run that is not
  // one of a repeat's.
  std::vector<std::optional<uint64_t>> seeds;
  std::optional<double> ci95;           // half-width of the 95% t-interval of the mean (2 or more samples)
  std::optional<double> p_vs_baseline;  // two-sided p against the baseline's samples (2 or more on each side)
  std::optional<NoiseTest> test;        // the test that gave p_vs_baseline: paired when the seeds match, else Welch
  bool withinNoise() const;             // p_vs_baseline >= kNoiseAlpha
};

// Sets row.p_vs_baseline and row.test against the baseline's samples of the same metric (see "Repeats" above).
void testAgainstBaseline(SeedStats& row, const SeedStats& baseline);

struct CompareRow {
  std::string variant;
  int seeds = 1;  // runs averaged into this row
  std::string state;
  std::string error;
  int64_t gone_pid = 0;                         // RunData::gone_pid: "running", but its process is gone
  int64_t live_pid = 0;                         // RunData::live_pid: "running", and its process is
  std::filesystem::path dir;                    // the run's folder; a repeat's variant folder
  std::vector<std::filesystem::path> run_dirs;  // every seed's run folder (the run's own for one seed)
  std::string compressor;
  bool error_feedback = false;
  std::string error_feedback_rule;     // RunData::error_feedback_rule; "EF" for DGC's momentum correction alone
  int64_t compression_start_step = 0;  // RunData::compression_start_step
  bool baseline = false;
  bool simulated = false;  // its times are simulated seconds (clock SIMULATED)
  int64_t records = 0;
  int64_t steps = 0;
  std::optional<double> final_accuracy, best_accuracy;
  std::optional<double> wire_bytes, wire_bytes_per_step, payload_bytes, ratio;
  // A parameter-server run's wire bytes per worker apart: push + pull = wire_bytes. None for a sync run.
  std::optional<double> push_bytes, pull_bytes;
  // Compressed pulls: how far the workers' copies were from the parameters (pull_residual_rel, result_writer.h).
  std::optional<double> pull_residual;
  // The scheduler negotiation's control frames and rounds per worker (not in wire_bytes); none for runs recorded
  // before they were.
  std::optional<double> control_bytes, negotiation_rounds;
  std::optional<TargetCrossing> to_target;
  std::optional<double> compute_s, codec_s, comm_s, exposed_comm_s, step_s;  // per step
  std::optional<StalenessSummary> staleness;                                 // of the first seed's run
  // Over the seeds: final and best accuracy, wire bytes per worker, bytes and seconds to target.
  SeedStats final_stats, best_stats, wire_stats, bytes_to_target_stats, s_to_target_stats;
  int reached_target = 0;  // seeds whose run reached the target
};

struct StudyTable {
  std::string study;
  // A grid point's table (experiment.proto grid_point): the point as (axis path, value) pairs; its rows are the
  // study's variants at that point, its baseline the baseline's run there. Empty for a study without a grid.
  std::vector<std::pair<std::string, std::string>> grid;
  std::string baseline;         // variant name; empty when the study has none
  std::string baseline_source;  // "auto" (compressor none), "--baseline", or "none"
  std::vector<CompareRow> rows;
  std::vector<std::string> notes;  // shown under the table (baseline choice, failed runs' errors)
};

struct Comparison {
  double target = 0;
  std::vector<StudyTable> studies;  // by study name
};

// Builds the tables. Problems that are not one folder's (a --baseline name no study has) go to `warnings`.
Comparison compare(const std::vector<RunData>& runs, const CompareOptions& options, std::vector<std::string>& warnings);

// A run's row name (what --baseline names): its variant's, or at a grid point the file's variant name (its table names
// the point), with the label of its results folder where runs of one name came from several (reader.h). bareName
// leaves the label out.
std::string rowName(const RunData& run);
std::string bareName(const RunData& run);

// "link.bandwidth=1Gbps, workers=8": a grid point's table in titles; empty for a study without a grid.
std::string gridTitle(const StudyTable& table);

// The row order described at the top, exposed for tests.
extern const char* const kRowOrder;

// Runs that come from different workloads or data: one warning per differing section ("workload", "data"), naming
// the runs and the fields that differ. Runs without a readable config are not compared (loadRun warned already).
std::vector<std::string> configMismatchWarnings(const std::vector<RunData>& runs);

// Runs of one study that loaded a plugin of one kind and name from files with different SHA-256 (the file was
// rebuilt or edited between runs, so their rows did not run the same code): one warning per study and plugin,
// naming each hash and its runs. Runs recorded before plugin hashes existed are left out.
std::vector<std::string> pluginHashWarnings(const std::vector<RunData>& runs);

// Runs of one study whose computation was measured (real time, or simulated time with measured compute; not the FLOP
// model) on different CPUs (provenance "cpu"): their time columns compare machines, not only variants. One warning
// per study, naming each CPU and its runs. Runs recorded before the field existed are left out.
std::vector<std::string> cpuWarnings(const std::vector<RunData>& runs);

// Runs of one study whose host models' matrix products came from different GEMM kernels (provenance "gemm":
// terse's fixed order, or OpenBLAS with its per-CPU core: experiments/workloads/gemm.h): the kernel decides the order
// of the sums, so their accuracies differ in the last digits for that reason alone. One warning per study, naming
// each kernel and its runs. Runs recorded before the field existed (or without a model of terse's) are left out.
std::vector<std::string> gemmWarnings(const std::vector<RunData>& runs);

// Simulated runs of one study charged from calibration tables that give one kernel different times (each commit and
// machine measures its own table, and a rerun of some variants after a rebuild measures again): their simulated
// times then differ by the measurement too, a few percent, as much as a scheduler's effect. One warning per study,
// naming the first kernel that differs, its two times and runs, and how many kernels differ.
std::vector<std::string> calibrationWarnings(const std::vector<RunData>& runs);

}  // namespace terse::results
