// Reading result folders (result_writer.h's format) back for `terse compare`.
//
// Reading is forgiving, because the folders it reads may come from a killed, failed or still-running run or from an
// older build: every problem (a missing file, a line that is not JSON, a torn last line, a record with a missing or
// out-of-range field, steps going backwards) becomes a warning "FILE:LINE: what" and the bad part is skipped; nothing
// in a results folder can make compare fail or crash. A variant whose status says failed stays in the table, marked,
// with whatever records it wrote.
#pragma once

#include "results/compare/room.h"  // the room's guard

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/json.h"
#include "results/sha256.h"  // sha256Hex: the config hash (config_sha256)

namespace terse::results {

// One evaluation point as read from metrics.jsonl. Optional fields absent from the record are NaN.
struct EvalPoint {
  int line = 0;  // in metrics.jsonl, for messages
  int64_t step = 0;
  double epoch_progress = 0;
  double accuracy = 0;
  double test_loss = 0;
  double wire_bytes = 0;
  double payload_bytes = 0;
  double control_bytes = 0;       // the scheduler negotiation's frames (result_writer.h), apart from wire_bytes
  double negotiation_rounds = 0;  // and its rounds
  // A parameter-server run (result_writer.h): its wire bytes per worker are these two, the workers' sends (pushes and
  // requests) and receipts (the shards' replies: pulls). NaN for a sync run.
  double push_bytes = 0, pull_bytes = 0;
  double wall_s = 0;
  double compute_s = 0, compress_s = 0, decompress_s = 0, comm_s = 0, exposed_comm_s = 0, step_s = 0;
  double staleness_mean = 0, staleness_max = 0;
  std::map<int64_t, double> staleness_hist;  // tau -> pushes applied with it (cumulative)
  double staleness_hist_overflow = 0;
  double staleness_buckets = 0;  // the tau the overflow starts at (staleness_buckets; 64 for older records)
  double pull_residual = 0;      // compressed pulls: pull_residual_rel (result_writer.h); NaN without
};

// One results folder read back.
struct RunData {
  std::filesystem::path dir;
  std::string study;         // the parent folder's name (the grandparent's for a repeat)
  std::string variant;       // the folder's name (the parent's for a repeat), labelled by its root where runs of one
                             // study and variant come from several results folders: "dense (res-tcp)"
  std::string bare_variant;  // the folder's name, unlabelled
  // A repeat (experiment.proto's `seeds`): the run is <study>/<variant>/seed-<seed>/, one of several seeds of one
  // variant, which compare averages into one row.
  std::optional<uint64_t> repeat_seed;
  std::string state;  // status.json: completed, failed, running; "unknown" when it cannot be read
  std::string error;  // a failed run's message
  // A "running" run whose process, on this host, is gone (status.json's "pid" and "host"): it was killed without a
  // word (SIGKILL, the out-of-memory killer). 0: still running, on another host, or not known.
  int64_t gone_pid = 0;
  // A "running" run whose process, on this host, is alive: still running (a pid in use again reads so too). 0: gone,
  // on another host, or not known.
  int64_t live_pid = 0;
  bool has_config = false;
  // The config's workload and data sections as "workload.name=mlp" lines (configMismatchWarnings compares them).
  std::vector<std::string> workload_fields;
  std::vector<std::string> data_fields;
  // Every field of the config as such lines but `seed` and `seeds`: what a variant's repeats must share for their mean
  // and interval to be seed noise (compute.h, "Repeats").
  std::vector<std::string> setting_fields;
  std::string config_sha256;  // of config.textproto's bytes; empty without one
  std::optional<Json> provenance;
  // A simulated run's calibration.json "seconds": the kernel times it charged (experiments/runner/calibration.h);
  // empty without one (the FLOP model, real time, a table that did not parse).
  std::map<std::string, double> calibration;
  std::string compressor;  // the loaded compressor's name; empty when neither provenance nor config says
  bool error_feedback = false;
  // With error feedback on: "EF", "EF21", or "EF21 eta=<ef21_momentum>" (EF21-SGDM), as `terse run --dry-run` labels
  // them; empty otherwise (experiment.proto error_feedback_rule).
  std::string error_feedback_rule;
  int64_t compression_start_step = 0;  // the config's dense warm-up (experiment.proto); 0 without one
  double momentum_correction = 0;
  bool async_mode = false;  // the config's mode is ASYNC, SSP or HOGWILD
  bool simulated = false;   // provenance clock "simulated": every time is simulated seconds (DESIGN.md 9)
  // A parameter-server run recorded before its records counted the pulls (result_writer.h): wire_bytes_per_worker was
  // the workers' sends alone. Its points' wire bytes are recounted from worker<w>_bytes_out and worker<w>_bytes_in.
  bool pulls_recounted = false;
  std::vector<EvalPoint> points;    // in step order; bad records skipped
  bool config_lists_seeds = false;  // config.textproto has a `seeds` list (what makes a seed-<N> folder a repeat)
  // A run at a point of its study's grid (config.textproto's grid_point, experiment.proto): the variant's name in the
  // study's file, and the point as (axis path, value) pairs in axis order. compare tables each point apart, its rows
  // named by grid_variant. Empty for a run of a study without a grid.
  std::string grid_variant;
  std::vector<std::pair<std::string, std::string>> grid;
};

// Reads one results folder. Never throws for anything inside it; problems go to `warnings`. A folder named
// seed-<N> whose config lists `seeds` (or that has no readable config) is a repeat: its variant and study are the
// parent and grandparent folders' names.
RunData loadRun(const std::filesystem::path& dir, std::vector<std::string>& warnings);

// Finds results folders under each path: a variant folder (it holds any of the four result files, or seed-<N>
// subfolders that do), a study folder (its subfolders are variant folders) or a results root (two levels down, three
// for repeats). Folders are read in name order; one
// reached twice is read once. A path that does not exist or holds no results is a warning.
std::vector<RunData> loadRuns(const std::vector<std::filesystem::path>& paths, std::vector<std::string>& warnings);

}  // namespace terse::results
