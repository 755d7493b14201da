// Command-line overrides of single fields of a study (`terse run --set PATH=VALUE`, docs/running-studies.md
// "Changing a field from the command line"): a researcher cuts a study short or turns one knob without editing the
// file, and the run's folder still says what ran, since the override is in its resolved config.textproto.
//
// PATH is a dotted field path into experiment.proto's Experiment (`epochs`, `optimizer.lr`,
// `workload.pytorch.max_steps_per_epoch`), or a map field's path and a key (`compressor.params.ratio`). VALUE is in the
// text format's syntax for that field, as the file would spell it: numbers, true/false, enum names, a bracketed list
// (`[1, 2]`, which replaces the list: `[]` empties it), and strings quoted or bare (a bare string is taken as is). The
// value goes through protobuf's text parser and reflection, never pasted into the file's text, so a VALUE cannot
// smuggle in a second field.
//
// An override is applied to every resolved variant after the variant's own settings and before defaults and
// validation (config.h ConfigOptions::overrides, resolveVariants), so it wins over both the base and the variant and
// gets the same checks and messages as a value in the file; those messages then name the override instead of a line
// of the file.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/config/experiment.pb.h"

namespace terse::experiments {

struct FieldOverride {
  std::string where;  // how messages name it: "--set optimizer.lr=0.1"
  std::string path;   // "optimizer.lr"; "compressor.params.ratio" for one entry of a map
  // Experiment down to the field set (the map itself for a map entry), outermost first.
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  bool map_entry = false;  // sets the one key of `path`'s last part and keeps the map's other entries
  Experiment patch;        // the field at `path` set to the value, nothing else
};

// What to append to a message about `name`, which is no field of `type` (a message whose fields are spelt from
// `prefix`: "optimizer."): "; did you mean 'lr'?" (a field of `type` a typo away), "; did you mean 'optimizer.lr'?" (a
// field of that name deeper down), else "; its fields: ...". The config file's parse errors use it too (config.cc).
std::string unknownFieldSuggestion(const google::protobuf::Descriptor* type, const std::string& prefix,
                                   std::string_view name);
// The same for `name`, which is no value of the enum `type`: "; did you mean SSP?", else "; it takes SYNC, ASYNC, ...".
std::string enumValueSuggestion(const google::protobuf::EnumDescriptor* type, std::string_view name);

// Parses one "PATH=VALUE"; `option` names the flag in messages ("--set"). Throws ConfigError (source `option`), whose
// one error says what is wrong and how it would be right: a missing '=', an unknown field (with the closest name, or
// the field's full path when it lives deeper: `lr` -> `optimizer.lr`), a path going on past a number or into a list, a
// message named without one of its fields, `variant` or `variants` (they come from the file), or a VALUE the text
// parser refuses for the field's type (naming the type, and for an enum the names it takes).
FieldOverride parseFieldOverride(std::string_view text, const std::string& option = "--set");
// Each of `texts` as parseFieldOverride does, every error of them in one ConfigError; also refuses one PATH given twice
// (which of the two would win is no rule a reader could guess).
std::vector<FieldOverride> parseFieldOverrides(const std::vector<std::string>& texts,
                                               const std::string& option = "--set");

// Sets the override's field in `experiment`: a scalar or enum replaces the value, a list (a map given whole) is
// cleared and replaced, a map entry replaces that key's value alone.
void applyFieldOverride(Experiment& experiment, const FieldOverride& override_);

// The override that a validation message about `path` ("optimizer.lr", "compressor.params") is about: the last of
// `overrides` whose path is `path`, lies inside it or contains it, or null.
const FieldOverride* overrideOf(const std::vector<FieldOverride>& overrides, std::string_view path);
const FieldOverride* overrideOf(const std::vector<const FieldOverride*>& overrides, std::string_view path);

// A rule across fields reports at one of them and names the others in its text ("... with local_sgd.period 4: ..."),
// so its message keeps the file's line of the first even when the value that tripped it came from the command line.
// This says so: " (local_sgd.period is --set local_sgd.period=4)" for the last of `overrides` whose path the message
// names as a whole path (not inside a longer one), or "".
std::string overrideNamedIn(std::span<const FieldOverride* const> overrides, std::string_view message);

}  // namespace terse::experiments
