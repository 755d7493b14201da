// `terse compare`'s library: read result folders (result_writer.h's format) back, and turn one study's variants into
// a comparison table (DESIGN.md section 7) in markdown, CSV or JSON, plus the provenance table.
//
// Reading is forgiving, because the folders it reads may come from a killed, failed or still-running run or from an
// older build: every problem (a missing file, a line that is not JSON, a torn last line, a record with a missing or
// out-of-range field, steps going backwards) becomes a warning "FILE:LINE: what" and the bad part is skipped; nothing
// in a results folder can make compare fail or crash. A variant whose status says failed stays in the table, marked,
// with whatever records it wrote.
//
// Definitions (the table's columns):
//   final / best accuracy   the last evaluation point's test accuracy / the highest one
//   wire bytes              the last point's cumulative wire bytes per worker (frame headers included); per step =
//                           that / the last point's step
//   payload bytes           the last point's cumulative compressor output per worker
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
// The baseline of a study is the variant whose compressor is "none" (provenance.json's loaded plugin, else
// config.textproto's compressor.name); among several, one without error feedback or momentum correction, then a
// completed one, then the first by name. --baseline NAME picks one by variant name instead.
//
// Row order: variants that reached the target first, fewest bytes to target first; then the rest by final accuracy,
// highest first; variants without any record last; ties by name. Bytes to target is the question the table exists to
// answer (what does accuracy X cost on the wire), and final accuracy ranks the ones that never got there.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "results/json.h"

namespace terse::results {

// The lowercase hex SHA-256 (OpenSSL) of `data`: the config hash `--provenance` prints, the same digest `sha256sum
// config.textproto` gives, so a published table can be checked against a results folder with standard tools.
std::string sha256Hex(std::string_view data);

// One evaluation point as read from metrics.jsonl. Optional fields absent from the record are NaN.
struct EvalPoint {
  int line = 0;  // in metrics.jsonl, for messages
  int64_t step = 0;
  double epoch_progress = 0;
  double accuracy = 0;
  double test_loss = 0;
  double wire_bytes = 0;
  double payload_bytes = 0;
  double wall_s = 0;
  double compute_s = 0, compress_s = 0, decompress_s = 0, comm_s = 0, exposed_comm_s = 0, step_s = 0;
  double staleness_mean = 0, staleness_max = 0;
  std::map<int64_t, double> staleness_hist;  // tau -> pushes applied with it (cumulative)
  double staleness_hist_overflow = 0;
};

// One results folder read back.
struct RunData {
  std::filesystem::path dir;
  std::string study;    // the parent folder's name
  std::string variant;  // the folder's name
  std::string state;    // status.json: completed, failed, running; "unknown" when it cannot be read
  std::string error;    // a failed run's message
  bool has_config = false;
  // The config's workload and data sections as "workload.name=mlp" lines (configMismatchWarnings compares them).
  std::vector<std::string> workload_fields;
  std::vector<std::string> data_fields;
  std::string config_sha256;  // of config.textproto's bytes; empty without one
  std::optional<Json> provenance;
  std::string compressor;  // the loaded compressor's name; empty when neither provenance nor config says
  bool error_feedback = false;
  double momentum_correction = 0;
  bool async_mode = false;        // the config's mode is ASYNC, SSP or HOGWILD
  std::vector<EvalPoint> points;  // in step order; bad records skipped
};

// Reads one results folder. Never throws for anything inside it; problems go to `warnings`.
RunData loadRun(const std::filesystem::path& dir, std::vector<std::string>& warnings);

// Finds results folders under each path: a variant folder (it holds any of the four result files), a study folder
// (its subfolders are variant folders) or a results root (two levels down). Folders are read in name order; one
// reached twice is read once. A path that does not exist or holds no results is a warning.
std::vector<RunData> loadRuns(const std::vector<std::filesystem::path>& paths, std::vector<std::string>& warnings);

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
};

struct CompareRow {
  std::string variant;
  std::string state;
  std::string error;
  std::filesystem::path dir;
  std::string compressor;
  bool error_feedback = false;
  bool baseline = false;
  int64_t records = 0;
  int64_t steps = 0;
  std::optional<double> final_accuracy, best_accuracy;
  std::optional<double> wire_bytes, wire_bytes_per_step, payload_bytes, ratio;
  std::optional<TargetCrossing> to_target;
  std::optional<double> compute_s, codec_s, comm_s, exposed_comm_s, step_s;  // per step
  std::optional<StalenessSummary> staleness;
};

struct StudyTable {
  std::string study;
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

// The row order described at the top, exposed for tests.
extern const char* const kRowOrder;

std::string toMarkdown(const Comparison& c);
std::string toCsv(const Comparison& c);
// `warnings` are embedded so a JSON consumer sees what was skipped.
std::string toJson(const Comparison& c, const std::vector<std::string>& warnings);

// Runs that come from different workloads or data: one warning per differing section ("workload", "data"), naming
// the runs and the fields that differ. Runs without a readable config are not compared (loadRun warned already).
std::vector<std::string> configMismatchWarnings(const std::vector<RunData>& runs);

// --provenance: per run, the config hash, git commit, plugins (name, version, ABI, path, caps, params), transport,
// mode, world size, link emulation, host and start time.
std::string provenanceTableMarkdown(const std::vector<RunData>& runs);
std::string provenanceTableCsv(const std::vector<RunData>& runs);
std::string provenanceTableJson(const std::vector<RunData>& runs, const std::vector<std::string>& warnings);

}  // namespace terse::results
