// Plots for `terse compare --out` (DESIGN.md section 7): accuracy against wire bytes (log x) and against wall time,
// one line per variant, drawn by gnuplot as PNG and SVG. The data files and the .gp script are written first and
// kept beside the plots, so a user can tweak the script and rerun `gnuplot <study>.gp` in that folder; gnuplot is
// optional at run time (a missing one is reported, never a failure of the tables).
#pragma once

#include "results/compare/room.h"  // the room's guard

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "results/compare/compute.h"
#include "results/compare/reader.h"

namespace terse::results {

struct PlotOutcome {
  std::vector<std::filesystem::path> written;  // data files, scripts, and the plots gnuplot produced
  bool plotted = false;                        // gnuplot ran and succeeded for every study
  std::string message;                         // why not, for the user; empty when plotted
};

// The first executable file `name` in the colon-separated `search_path` (the PATH convention: an empty entry is
// the current directory); nullopt when there is none.
std::optional<std::filesystem::path> findExecutable(std::string_view name, std::string_view search_path);

// A file name made of `s`: anything but [A-Za-z0-9._-] becomes '_' (study names come from folder names).
std::string safeFileStem(std::string_view s);

// The evaluation points one variant's line draws: `points` without the near-duplicates that two eval cadences make
// where they almost meet (every_steps 235 and an epoch of 469 steps evaluate at 469 and 470): a point closer than a
// quarter of the median spacing to its predecessor replaces it when it ends an epoch, else is dropped. The runner
// evaluates once per step at most, so these are two evaluations, not a record written twice.
std::vector<EvalPoint> plotPoints(const std::vector<EvalPoint>& points);

// The accuracy axis for a study's lines: from the data, not fixed. The top is the best accuracy; the bottom is the
// lowest point, but not below 0.25 under the weakest line's best (a run's first evaluations and a diverged run's
// collapse would squash the range where the lines differ; they leave the plot downwards). Padded by 5%, inside
// [0, 1], at least 0.05 high.
struct AccuracyRange {
  double lo = 0, hi = 1;
};
AccuracyRange accuracyRange(const std::vector<std::vector<EvalPoint>>& lines);

// The line of a row over its seeds' runs (each through plotPoints): per evaluation point the mean wire bytes, wall
// time and accuracy, and the accuracy's 95% t-interval (stats.h) as the band; lo = hi = accuracy for one seed. Points
// are paired by index while every seed has one at the same step (seeds of one config evaluate at the same steps).
struct BandPoint {
  EvalPoint mean;
  double lo = 0, hi = 0;
};
std::vector<BandPoint> meanLine(const std::vector<const RunData*>& seeds);

// Writes <out>/<study>.dat and <out>/<study>.gp for every study of `c` (variants in table order, using `runs`' eval
// points), then runs gnuplot (looked up in `search_path`, normally $PATH) in `out` to make
// <study>_acc_vs_bytes.{png,svg} and <study>_acc_vs_time.{png,svg}: one line per row, the mean over its seeds with
// the 95% interval as a shaded band. Throws InvalidArgument when `out` cannot be
// written; a missing or failing gnuplot is reported in the outcome.
PlotOutcome writePlots(const Comparison& c, const std::vector<RunData>& runs, const std::filesystem::path& out,
                       std::string_view search_path);

}  // namespace terse::results
