// Internal to experiments/config: the experiment schema's fields as one table per section (config_fields.cc), each
// entry naming its field once with its default, the values it accepts and the reference's words for it. One table
// fills the defaults (applyDefaults), validates the values (validateExperiment) and writes the field reference of
// experiments/configs/README.md (`terse config reference`); rules that span fields are named functions listed beside
// the tables, each with its message. tests/config/config_table_test.cc holds the table to the proto: every scalar
// field of every message has an entry, every entry names a real field of the right type, and the proto comment's
// "Default X" is the table's.
//
// To add a field: an entry in its section's table (a new message: a new section); to add a check across fields: a
// function and a row in kRules. Nothing else needs to change: the reference test says when the README is stale.
#pragma once

#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "experiments/config/config_checks.h"

namespace terse::experiments::table {

// When a section or an entry applies: a test of the (merged) experiment, and the reference's words for it.
struct When {
  std::string_view doc{};                     // "workload glove"; empty: always
  bool (*test)(const Experiment&) = nullptr;  // null: always
  bool holds(const Experiment& e) const { return test == nullptr || test(e); }
};

// What an unset field becomes.
struct Default {
  enum class Kind {
    kNone,      // stays unset: required, or a field whose absence is itself the setting; `text` says which
    kValue,     // filled with `text` (the value as a config writes it: 1e11, SYNC, true, 60s) when `when` holds
    kUnfilled,  // stays unset, and whoever reads it reads `text` (the reader's zero or the runtime's choice): a
                // default written in would change every resolved config written before the field existed
    kComputed,  // filled with compute(experiment) when `when` holds; `text` is the reference's words
  };
  Kind kind = Kind::kNone;
  std::string_view text{};
  When when{};
  std::string (*compute)(const Experiment&) = nullptr;
};
constexpr Default none(std::string_view why) {
  return {Default::Kind::kNone, why};
}
constexpr Default value(std::string_view text, When when = {}) {
  return {Default::Kind::kValue, text, when};
}
constexpr Default unfilled(std::string_view text) {
  return {Default::Kind::kUnfilled, text};
}
constexpr Default computed(std::string_view doc, std::string (*compute)(const Experiment&), When when = {}) {
  return {Default::Kind::kComputed, doc, when, compute};
}

// The values a field accepts. Every message starts with the field's path and names the value and what is allowed.
struct Rule {
  enum class Kind {
    kFree,        // anything the type holds (`doc` says what it means), or checked by a rule across fields
    kRange,       // a number within [lo, hi] (open ends, `finite`)
    kEnum,        // any named value but the zero one (*_UNSPECIFIED)
    kOneOf,       // one of `choices` (numbers or strings)
    kDuration,    // a duration (comm::parseDuration) of at most max_s seconds, and > 0 when `positive`
    kBandwidth,   // "unlimited" or a rate (comm::parseBandwidth) in [limits::kMinBandwidthBps, kMaxBandwidthBps]
    kNonEmpty,    // a non-empty string; `says` is the message
    kFolderName,  // a results folder's name: [A-Za-z0-9._-], not "." or ".."
    kCustom,      // check(c, path, value) on a string; `doc` says what it accepts
  };
  static constexpr double kNoBound = std::numeric_limits<double>::infinity();
  Kind kind = Kind::kFree;
  double lo = -kNoBound, hi = kNoBound;
  bool lo_open = false, hi_open = false;
  // Doubles only: NaN and infinities fail too. A range with both ends implies it; an upper bound alone lets NaN
  // through to the check that owns the field's lower end (simulation.topology's: core/sim/platform.h validate()).
  bool finite = false;
  std::string_view lo_text{}, hi_text{};  // how messages write the bounds ("2^24"); empty: the number
  std::span<const std::string_view> choices{};
  double max_s = 0;
  bool positive = false;
  std::string_view says{};  // kNonEmpty: the message after the path
  void (*check)(Checks&, const std::string& path, const std::string& value) = nullptr;
  std::string_view doc{};
};
constexpr Rule free(std::string_view doc = {}) {
  return {.kind = Rule::Kind::kFree, .doc = doc};
}
constexpr Rule between(double lo, double hi, std::string_view lo_text = {}, std::string_view hi_text = {}) {
  return {.kind = Rule::Kind::kRange, .lo = lo, .hi = hi, .lo_text = lo_text, .hi_text = hi_text};
}
// [lo, hi) and (lo, hi]: half-open ranges of doubles.
constexpr Rule upTo(double lo, double hi, std::string_view hi_text = {}) {
  Rule r = between(lo, hi, {}, hi_text);
  r.hi_open = true;
  return r;
}
constexpr Rule above(double lo, double hi = Rule::kNoBound) {
  Rule r = between(lo, hi);
  r.lo_open = true;
  return r;
}
constexpr Rule atLeast(double lo) {
  return between(lo, Rule::kNoBound);
}
constexpr Rule atMost(double hi) {
  return between(-Rule::kNoBound, hi);
}
constexpr Rule finite(Rule r) {
  r.finite = true;
  return r;
}
constexpr Rule enumValue() {
  return {.kind = Rule::Kind::kEnum};
}
constexpr Rule oneOf(std::span<const std::string_view> choices) {
  return {.kind = Rule::Kind::kOneOf, .choices = choices};
}
constexpr Rule duration(double max_s, bool positive) {
  return {.kind = Rule::Kind::kDuration, .max_s = max_s, .positive = positive};
}
constexpr Rule bandwidth() {
  return {.kind = Rule::Kind::kBandwidth};
}
constexpr Rule nonEmpty(std::string_view says = " must be set") {
  return {.kind = Rule::Kind::kNonEmpty, .says = says};
}
constexpr Rule folderName() {
  return {.kind = Rule::Kind::kFolderName};
}
constexpr Rule custom(void (*check)(Checks&, const std::string&, const std::string&), std::string_view doc) {
  return {.kind = Rule::Kind::kCustom, .check = check, .doc = doc};
}

// One field of a section: its name in the section's message, default, accepted values and meaning.
struct Field {
  std::string_view name{};
  Default def{};
  Rule rule{};
  std::string_view doc{};   // the reference's words: what the field means
  std::string_view note{};  // appended to the rule's message: why the bound is what it is
  bool if_set = false;      // checked only when set (a field with no default whose unset value means "absent")
  When check_when{};        // checked only when this holds (the default may apply more widely)
};

// The fields of one message of the schema. `path` is where it sits in Experiment ("" for Experiment itself,
// "simulation.topology"), a trailing "[]" for each element of a repeated message ("link.overrides[]"). Sections are
// filled in table order, so a default computed from another section's field comes after that section.
struct Section {
  std::string_view path{};
  When when{};  // defaults and checks apply only when this holds
  std::span<const Field> fields{};
  std::string_view doc{};
};

// What a plugin spec names: a scheduler, a compressor, or a compressor a parameter server runs (each push and pull
// decoded on its own: one round, SUM or ALLGATHER, host code; core/train/param_server_detail.h).
// kLocalSgdCompressor: the compressor of local SGD's averagings, whose aggregate must be the mean of the deltas;
// kPostLocalSgdCompressor: the same after gradient steps (local_sgd.start_step > 0), whose state would carry from one
// phase into the other; kEf21Compressor: the compressor under EF21, whose aggregate must be the sum of what was sent.
enum class PluginRole {
  kCompressor,
  kScheduler,
  kParameterServerCompressor,
  kLocalSgdCompressor,
  kPostLocalSgdCompressor,
  kEf21Compressor
};

// What a rule across fields may consult besides the experiment.
struct RuleContext {
  const ConfigOptions& options;
  // Loads and instantiates a compressor or scheduler plugin with its params and checks its caps against its role
  // (validate.cc, memoized per study).
  void (*plugin)(Checks&, const std::string& what, const PluginSpec& spec, PluginRole role, void* state);
  void* plugin_state;
};

// A check that spans fields: a named function, the fields it reads (the first names the line its message points at)
// and what it refuses, for the reference.
struct CrossRule {
  std::string_view name;
  std::string_view fields;
  std::string_view doc;
  void (*check)(Checks&, const Experiment&, const RuleContext&);
};

// The tables (config_fields.cc).
std::span<const Section> sections();
std::span<const CrossRule> rules();
// Fields that are not scalars of a section's table: maps (a plugin's params, checked by the plugin) and the study's
// structure (variants), listed so that the table test can tell them from a forgotten field.
std::span<const std::string_view> notInTables();

// The engine (config_table.cc). The tables are resolved against Experiment's descriptor once; a name that is not a
// field, a default that does not parse as the field's type, or a rule the field's type cannot take throws
// InternalError naming the entry (checkTables gives the same list without throwing, for tests).
std::vector<std::string> checkTables(std::span<const Section> sections);
// Fills every unset field that has a default, in table order.
void fillDefaults(Experiment& e);
// Every entry's rule on `e`, sections in table order; then every rule across fields.
void checkFields(Checks& c, const Experiment& e);
// The entries of the section at `path` alone (checks across fields that need its fields valid first).
void checkSection(Checks& c, const Experiment& e, std::string_view path);
// The field reference in Markdown (experiments/configs/README.md, between kReferenceBegin and kReferenceEnd).
std::string reference();
inline constexpr std::string_view kReferenceBegin =
    "<!-- BEGIN generated by `terse config reference` (experiments/config/config_fields.cc); do not edit -->\n";
inline constexpr std::string_view kReferenceEnd = "<!-- END generated -->\n";
// `file`'s text with what lies between the markers replaced by reference(). Throws InvalidArgument naming `source`
// when the markers are missing or out of order.
std::string withReference(std::string_view file, const std::string& source);

}  // namespace terse::experiments::table
