// A study's grid (experiment.proto Experiment.grid): fields as study axes. A researcher's figure is rarely one
// compressor at one setting: it is time to target against link speed, or bytes against the number of workers, per
// compressor. Without axes that is one invocation per point and a script to gather them; with them one study runs
// every variant at every point of the axes' product, each point set exactly as `terse run --set PATH=VALUE` would set
// it (field_override.h: the same parsing, the same checks and messages), and `terse compare` gives each point its own
// table against that point's baseline (results/compare/compute.h).
//
// Names. The run of variant V at a point is the variant "V.<label>-<value>..." (axes in order): its folder, its
// `variant` in config.textproto, what `--variant` selects (V alone selects all its points). A value becomes a name by
// keeping [A-Za-z0-9.-] and turning every other run of characters into one '_' ("[64, 32]" -> "64_32"); two values
// of an axis that give one name are refused, since their runs would share a folder.
//
// Order. Variants in file order, each at every point; the last axis varies fastest, as nested loops over the axes in
// file order would.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/config/experiment.pb.h"
#include "experiments/config/field_override.h"

namespace terse::experiments {

// One axis, parsed: an override per value.
struct ResolvedAxis {
  std::string path;
  std::string label;                     // as variant names spell it
  std::vector<std::string> values;       // as the axis lists them
  std::vector<std::string> names;        // each value as variant names spell it
  std::vector<FieldOverride> overrides;  // one per value
};

// `terse run --grid PATH=V1,V2,...`: an axis from the command line. Commas inside brackets or quotes belong to the
// value (`--grid workload.hidden_sizes=[64,32],[128]`). Throws ConfigError (source "--grid") for text without '=',
// without a path or with an empty value.
GridAxis parseGridOption(std::string_view text);

// The file's axes with `extra` (--grid's, in order) put in: an axis of a path the file has replaces the file's in its
// place, a new path is appended. `where` receives, per axis of the result, how messages name it: "--grid TEXT" for
// one from the command line, empty for the file's own.
void mergeGridOptions(Experiment& file, const std::vector<GridAxis>& extra, const std::vector<std::string>& texts,
                      std::vector<std::string>& where);

// Parses and checks `file`'s axes. `where(axis, value)` names an axis (value -1) or one of its values in messages,
// with the file's line where it has one. Every problem is appended to `errors` as "WHERE: what"; the axes returned are
// complete only when none was.
using GridWhere = std::function<std::string(int axis, int value)>;
std::vector<ResolvedAxis> resolveGridAxes(const Experiment& file, const GridWhere& where,
                                          std::vector<std::string>& errors);
// The same, throwing ConfigError with every problem (for callers that checked the file already: resolveVariants).
std::vector<ResolvedAxis> resolveGridAxes(const Experiment& file);

// Points of the grid: the product of the axes' value counts; 1 without axes.
std::size_t gridPoints(const std::vector<ResolvedAxis>& axes);
// The value index per axis of point `point` (< gridPoints(axes)).
std::vector<std::size_t> gridCoordinates(const std::vector<ResolvedAxis>& axes, std::size_t point);
// "workers=8, link.bandwidth=1Gbps": a point in messages and table titles.
std::string gridPointLabel(const std::vector<ResolvedAxis>& axes, std::size_t point);
// Puts `experiment` (variant `variant`, merged from the file) at `point`: sets each axis's field, grid_point, and
// variant "<variant>.<label>-<name>...". Without axes, nothing.
void placeAtGridPoint(Experiment& experiment, const std::string& variant, const std::vector<ResolvedAxis>& axes,
                      std::size_t point);

// Whether `e` sets the field `o` sets (for a map entry, that key of the map).
bool setsField(const Experiment& e, const FieldOverride& o);

// Whether one field path lies inside the other or they are one ("link" and "link.bandwidth"; "compressor.params" and
// "compressor.params.ratio"): two settings of them would overwrite each other.
bool pathsOverlap(std::string_view a, std::string_view b);

}  // namespace terse::experiments
