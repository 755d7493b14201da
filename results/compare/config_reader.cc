// config.textproto back into a RunData (reader_detail.h), parsed with the experiment schema itself (protobuf
// TextFormat), and its SHA-256 (results/sha256.h): the only file of the compare library that needs the schema.
#include <algorithm>
#include <cmath>
#include <limits>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "experiments/config/config.h"
#include "experiments/config/experiment.pb.h"
#include "experiments/config/limits.h"
#include "results/compare/reader.h"
#include "results/compare/reader_detail.h"
#include "results/sha256.h"

namespace terse::results {

namespace fs = std::filesystem;

namespace {

// Collects the parser's first error with its line, so a broken config.textproto is reported as FILE:LINE: what.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (error.empty()) error = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  std::string error;
};

// "workload.hidden_sizes=256" lines for every field set in `msg`, in field-number order (repeated fields one line per
// element), as protobuf's text format spells the values: the canonical form two configs are compared in.
void flattenMessage(const google::protobuf::Message& msg, const std::string& prefix, std::vector<std::string>& out) {
  const auto* reflection = msg.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(msg, &fields);
  for (const auto* f : fields) {
    const std::string path = prefix + "." + f->name();
    if (f->is_map()) {
      // A map's entries come back in no fixed order (protobuf's hash order, another at every parse): one line per
      // entry, "path.key=value", sorted, so that two configs with the same entries agree.
      std::vector<std::string> entries;
      for (int i = 0; i < reflection->FieldSize(msg, f); ++i) {
        const auto& entry = reflection->GetRepeatedMessage(msg, f, i);
        std::string key, value;
        google::protobuf::TextFormat::PrintFieldValueToString(entry, f->message_type()->map_key(), -1, &key);
        google::protobuf::TextFormat::PrintFieldValueToString(entry, f->message_type()->map_value(), -1, &value);
        if (key.size() >= 2 && key.front() == '"' && key.back() == '"') key = key.substr(1, key.size() - 2);
        entries.push_back(path + "." + key + "=" + value);
      }
      std::sort(entries.begin(), entries.end());
      out.insert(out.end(), entries.begin(), entries.end());
      continue;
    }
    const int n = f->is_repeated() ? reflection->FieldSize(msg, f) : 1;
    for (int i = 0; i < n; ++i) {
      const int index = f->is_repeated() ? i : -1;
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        const auto& sub = f->is_repeated() ? reflection->GetRepeatedMessage(msg, f, i) : reflection->GetMessage(msg, f);
        flattenMessage(sub, path, out);
      } else {
        std::string value;
        google::protobuf::TextFormat::PrintFieldValueToString(msg, f, index, &value);
        out.push_back(path + "=" + value);
      }
    }
  }
}

}  // namespace

namespace detail {

void readConfig(const fs::path& path, RunData& run, std::vector<std::string>& warnings) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    warnings.push_back(path.string() + ": missing; compressor and workload unknown");
    return;
  }
  auto text = readFile(path, warnings);
  if (!text) return;
  run.config_sha256 = sha256Hex(*text);
  // Parsed with the experiment schema itself, so compare reads exactly what the runner wrote. A config written by a
  // newer terse (unknown fields) or damaged on disk is reported with its line and not used.
  experiments::Experiment config;
  google::protobuf::TextFormat::Parser parser;
  // A results folder may come from anyone: without a limit protobuf's parser recurses once per nesting level, and a
  // few thousand levels overflow the stack (experiments/config/limits.h).
  parser.SetRecursionLimit(experiments::limits::kNesting);
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (text->size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !parser.ParseFromString(*text, &config)) {
    warnings.push_back(path.string() + ":" + (errors.error.empty() ? std::string("1: unreadable") : errors.error) +
                       "; config not used");
    return;
  }
  run.has_config = true;
  run.workload_fields.clear();
  run.data_fields.clear();
  if (config.has_workload()) flattenMessage(config.workload(), "workload", run.workload_fields);
  if (config.has_data()) flattenMessage(config.data(), "data", run.data_fields);
  // Resolved as the loader resolves (a config written by an older build lacks the fields added since, which hold
  // their defaults), less the seed: what a variant's repeats must share.
  experiments::Experiment settings = config;
  try {
    experiments::applyDefaults(settings);
  } catch (const std::exception& e) {
    // A hand-made config whose computed default is no value of its field (a bandwidth with a newline): compared as
    // written, and said.
    settings = config;
    warnings.push_back(path.string() + ": its defaults could not be filled (" + e.what() + "); compared as written");
  }
  settings.clear_seed();
  settings.clear_seeds();
  // Fields that say how or where a run ran, not what it computed: seeds of one variant may differ in them.
  for (const char* field : {"trace", "step_trace", "plugin_timeout", "output_dir"})
    settings.GetReflection()->ClearField(&settings, settings.GetDescriptor()->FindFieldByName(field));
  settings.mutable_tcp()->clear_bind_address();
  settings.mutable_tcp()->clear_timeout();
  settings.mutable_parameter_server()->clear_worker_timeout();
  settings.mutable_workload()->mutable_pytorch()->clear_loader_workers();
  run.setting_fields.clear();
  flattenMessage(settings, "", run.setting_fields);
  for (auto& line : run.setting_fields) line.erase(0, 1);  // the leading '.' of the top level's paths
  run.config_lists_seeds = config.seeds_size() > 0;
  run.grid_variant.clear();
  run.grid.clear();
  if (config.has_grid_point() && !config.grid_point().variant().empty()) {
    run.grid_variant = config.grid_point().variant();
    for (const auto& c : config.grid_point().coordinates()) run.grid.emplace_back(c.path(), c.value());
  }
  if (config.compressor().has_name()) run.compressor = config.compressor().name();
  if (config.has_error_feedback()) run.error_feedback = config.error_feedback();
  run.error_feedback_rule = run.error_feedback ? experiments::errorFeedbackRuleLabel(config) : "";
  run.compression_start_step = config.compression_start_step();
  // provenance.json, read after, says the same of a finished run; a run in progress has none yet.
  run.simulated = config.clock() == experiments::Experiment::SIMULATED;
  run.async_mode = config.mode() == experiments::Experiment::ASYNC || config.mode() == experiments::Experiment::SSP ||
                   config.mode() == experiments::Experiment::HOGWILD;
  if (config.momentum_correction().has_factor() && std::isfinite(config.momentum_correction().factor())) {
    run.momentum_correction = config.momentum_correction().factor();
  }
}

}  // namespace detail

}  // namespace terse::results
