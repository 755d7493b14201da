// Loading a study (config.h): the text format parsed with file:line errors, variants merged onto the base, defaults
// filled in, command-line overrides re-checked, the resolved config written back. Validation is validate.cc, the
// runtime options runtime_options.cc.
#include "experiments/config/config.h"

#include "experiments/config/field_override.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "experiments/config/config_table.h"
#include "experiments/config/grid.h"
#include "experiments/config/ignore_errors.h"

namespace terse::experiments {
namespace {

namespace pb = google::protobuf;

// Collects the parser's reports (line and column count from 0 there).
class CollectingErrors : public pb::io::ErrorCollector {
 public:
  struct Report {
    int line;
    int column;
    std::string message;
  };

#if GOOGLE_PROTOBUF_VERSION >= 4022000
  void RecordError(int line, pb::io::ColumnNumber column, absl::string_view message) override {
    reports.push_back({line, column, std::string(message)});
  }
#else
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    reports.push_back({line, column, message});
  }
#endif

  std::vector<Report> reports;
};

// The text parser's messages do not always say which field they are about ("Expected double, got: \"fast\""), and
// some point at the token after the culprit (an unknown field name or enum value is reported once consumed). This
// re-reads the tokens before the error to name the field path being parsed ("optimizer.lr") and, where the message
// quotes the culprit, moves the position back onto it.
// "; did you mean 'lr'?" after the parser's message about an unknown field or enum value (field_override.h), or the
// names it could have been; empty for other messages. `scopes`: the fields the culprit sits in, from Experiment.
std::string suggestionFor(const std::string& message, const std::vector<std::string>& scopes,
                          const std::string& culprit, bool unknown_field) {
  if (culprit.empty()) return "";
  if (unknown_field) {
    // 'Message type "terse.experiments.Data" has no field named "x".': the message type is named in full.
    constexpr std::string_view kLead = "Message type \"";
    const auto pos = message.find(kLead);
    if (pos == std::string::npos) return "";
    const auto start = pos + kLead.size();
    const pb::Descriptor* type = pb::DescriptorPool::generated_pool()->FindMessageTypeByName(
        message.substr(start, message.find('"', start) - start));
    if (type == nullptr) return "";
    std::string prefix;
    for (const auto& s : scopes) prefix += s + ".";
    return unknownFieldSuggestion(type, prefix, culprit);
  }
  // 'Unknown enumeration value of "SSPP" for field "mode".': the field is found from Experiment down the scopes.
  constexpr std::string_view kField = "for field \"";
  const auto pos = message.find(kField);
  if (message.find("Unknown enumeration value") == std::string::npos || pos == std::string::npos) return "";
  const auto start = pos + kField.size();
  const pb::Descriptor* type = Experiment::descriptor();
  for (const auto& s : scopes) {
    const pb::FieldDescriptor* f = type->FindFieldByName(s);
    if (f == nullptr || f->message_type() == nullptr) return "";
    type = f->message_type();
  }
  const pb::FieldDescriptor* f = type->FindFieldByName(message.substr(start, message.find('"', start) - start));
  if (f == nullptr || f->enum_type() == nullptr) return "";
  return enumValueSuggestion(f->enum_type(), culprit);
}

std::string describeParseError(std::string_view text, const std::string& source, CollectingErrors::Report report) {
  pb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  IgnoreErrors ignore;  // the parser has reported these tokens better
  pb::io::Tokenizer tokens(&input, &ignore);
  tokens.set_comment_style(pb::io::Tokenizer::SH_COMMENT_STYLE);
  std::string quoted_culprit;
  constexpr const char* kUnknownField = "has no field named \"";
  constexpr const char* kDuplicateField = "Non-repeated field \"";
  bool unknown_field = false, duplicate_field = false;
  for (const char* lead : {kUnknownField, "Unknown enumeration value of \"", kDuplicateField}) {
    if (auto pos = report.message.find(lead); pos != std::string::npos) {
      pos += std::strlen(lead);
      quoted_culprit = report.message.substr(pos, report.message.find('"', pos) - pos);
      unknown_field = lead == kUnknownField;
      duplicate_field = lead == kDuplicateField;
    }
  }
  std::vector<std::string> scopes;
  std::string field, previous;
  int culprit_line = -1, culprit_column = -1;
  while (tokens.Next()) {
    const auto& t = tokens.current();
    if (std::make_pair(t.line, t.column) >= std::make_pair(report.line, report.column)) break;
    if (t.type == pb::io::Tokenizer::TYPE_IDENTIFIER && t.text == quoted_culprit) {
      culprit_line = t.line;
      culprit_column = t.column;
    }
    if ((t.text == ":" || t.text == "{" || t.text == "<") && !previous.empty()) field = previous;
    if (t.text == "{" || t.text == "<") {
      scopes.push_back(field);
      field.clear();
    } else if ((t.text == "}" || t.text == ">") && !scopes.empty()) {
      scopes.pop_back();
      field.clear();
    }
    previous = t.type == pb::io::Tokenizer::TYPE_IDENTIFIER ? t.text : "";
  }
  if (culprit_line >= 0) {
    report.line = culprit_line;
    report.column = culprit_column;
  }
  // An unknown name is not a field of the message being parsed: the path is that message's. `field` would be the
  // field before it ("optimizer.lr" for a misspelt field after lr), since a name only becomes `field` at its ':'.
  std::string path;
  // A field given twice is reported at its second name, before its ':': the path ends in that name, not `field`.
  for (const auto& s : scopes) path += s + ".";
  if (duplicate_field)
    path += quoted_culprit;
  else if (!unknown_field)
    path += field;
  if (!path.empty() && path.back() == '.') path.pop_back();

  std::ostringstream os;
  os << source;
  if (report.line >= 0) os << ':' << report.line + 1 << ':' << report.column + 1;
  if (report.message.find("Message is too deep") != std::string::npos) {
    // Protobuf's words name its own setting, and the path would be the nesting itself, kNesting names long: say what
    // the limit is and what a valid config needs.
    os << ": messages nest deeper than " << limits::kNesting
       << " levels here; a valid config nests at most 4 (variants { overrides { simulation { topology {)";
    return os.str();
  }
  // "... has no field named "lrr"; did you mean 'lr'?": the parser's sentence loses its full stop to the suggestion.
  const std::string suggestion = suggestionFor(report.message, scopes, quoted_culprit, unknown_field);
  std::string message = report.message;
  if (!suggestion.empty() && message.ends_with('.')) message.pop_back();
  os << ": " << (path.empty() ? "" : path + ": ") << message << suggestion;
  return os.str();
}

std::string tooLarge(const std::string& source, std::size_t size) {
  return source + ": " + (size > limits::kConfigBytes ? "more than " : "") + std::to_string(size) +
         " bytes, larger than the limit of " + std::to_string(limits::kConfigBytes) + " bytes (" +
         std::to_string(limits::kConfigBytes >> 20) + " MiB) for a config";
}

[[noreturn]] void throwConfigError(const char* file, int line, const std::string& source,
                                   std::vector<std::string> errors) {
  std::ostringstream os;
  os << detail::where(file, line) << "config " << source << " is invalid (" << errors.size()
     << (errors.size() == 1 ? " error" : " errors") << "):";
  for (const auto& e : errors) os << "\n  " << e;
  throw ConfigError(os.str(), source, std::move(errors));
}

// Location of `path` ("variants[2].overrides.link.overrides[0].src") in the parsed file, or line -1.
pb::TextFormat::ParseLocation locate(const pb::TextFormat::ParseInfoTree* tree, const std::string& path) {
  const pb::Descriptor* type = Experiment::descriptor();
  std::size_t pos = 0;
  while (tree != nullptr && type != nullptr && pos <= path.size()) {
    std::size_t end = path.find('.', pos);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(pos, end - pos);
    int index = -1;
    if (auto open = part.find('['); open != std::string::npos) {
      index = std::atoi(part.c_str() + open + 1);
      part.resize(open);
    }
    const pb::FieldDescriptor* field = type->FindFieldByName(part);
    if (field == nullptr) break;
    // The parser records repeated fields by index and singular ones with -1; a path naming a whole list points at its
    // first entry.
    index = field->is_repeated() ? std::max(index, 0) : -1;
    if (end == path.size()) return tree->GetLocation(field, index);
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) break;
    tree = tree->GetTreeForNested(field, index);
    type = field->message_type();
    pos = end + 1;
  }
  return {};
}

std::string pathOf(const std::string& message) {
  return message.substr(0, message.find_first_of(" :"));
}

std::string at(const std::string& source, const pb::TextFormat::ParseLocation& loc) {
  if (loc.line < 0) return source + ": ";
  return source + ":" + std::to_string(loc.line + 1) + ":" + std::to_string(loc.column + 1) + ": ";
}

// A PluginSpec's params belong to its plugin, so a variant's PluginSpec replaces the base's whole; lists replace lists
// (experiment.proto, "Variant merging"). Clearing these in `base` first leaves MergeFrom to do the rest.
void clearReplaced(pb::Message& base, const pb::Message& over) {
  const pb::Reflection* from = over.GetReflection();
  const pb::Reflection* to = base.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  from->ListFields(over, &fields);
  for (const auto* f : fields) {
    if (f->is_repeated() ||
        (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && f->message_type() == PluginSpec::descriptor())) {
      to->ClearField(&base, f);
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      clearReplaced(*to->MutableMessage(&base, f), from->GetMessage(over, f));
    }
  }
}

// Lists and strings of `message` (the file, or the part of it at `path`) against limits.h, before anything is copied:
// a list over its limit is reported once and not looked into, so the work is linear in the file and what comes after
// (resolving, validating) is bounded.
void checkSizes(const pb::Message& message, const std::string& path,
                const std::function<void(const std::string&)>& report) {
  const pb::Reflection* r = message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(message, &fields);
  auto checkString = [&](const std::string& value, const std::string& where) {
    if (value.size() > limits::kStringBytes) {
      report(where + " is " + std::to_string(value.size()) + " bytes long, at most " +
             std::to_string(limits::kStringBytes) + " (" + quoted(value.substr(0, 24) + "...") + ")");
    }
  };
  for (const auto* f : fields) {
    const std::string p = path.empty() ? f->name() : path + "." + f->name();
    if (f->is_repeated()) {
      const int n = r->FieldSize(message, f);
      if (const int limit = listLimit(*f); limit >= 0 && n > limit) {
        report(p + " lists " + std::to_string(n) + " entries, at most " + std::to_string(limit));
        continue;
      }
      for (int i = 0; i < n; ++i) {
        const std::string pi = p + "[" + std::to_string(i) + "]";
        if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
          checkSizes(r->GetRepeatedMessage(message, f, i), pi, report);
        } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
          std::string scratch;
          checkString(r->GetRepeatedStringReference(message, f, i, &scratch), pi);
        }
      }
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      checkSizes(r->GetMessage(message, f), p, report);
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
      std::string scratch;
      checkString(r->GetStringReference(message, f, &scratch), p);
    }
  }
}

}  // namespace

int listLimit(const pb::FieldDescriptor& field) {
  static const std::unordered_map<const pb::FieldDescriptor*, int> limits_by_field = [] {
    auto f = [](const pb::Descriptor* type, const char* name) { return type->FindFieldByName(name); };
    return std::unordered_map<const pb::FieldDescriptor*, int>{
        {f(Experiment::descriptor(), "variants"), limits::kVariants},
        {f(Experiment::descriptor(), "worker_settings"), limits::kWorkers},
        {f(Experiment::descriptor(), "seeds"), limits::kSeeds},
        {f(Workload::descriptor(), "hidden_sizes"), limits::kHiddenLayers},
        {f(Workload::descriptor(), "conv_channels"), limits::kConvChannels},
        {f(Optimizer::descriptor(), "milestones"), limits::kMilestones},
        {f(LinkEmulation::descriptor(), "overrides"), limits::kLinkOverrides},
        {f(PluginSpec::descriptor(), "params"), limits::kPluginParams},
        {f(Experiment::descriptor(), "grid"), limits::kGridAxes},
        {f(GridAxis::descriptor(), "values"), limits::kGridValues},
        {f(GridPoint::descriptor(), "coordinates"), limits::kGridAxes},
    };
  }();
  const auto it = limits_by_field.find(&field);
  return it == limits_by_field.end() ? -1 : it->second;
}

Experiment parseConfigText(std::string_view text, const std::string& source, pb::TextFormat::ParseInfoTree* tree) {
  if (text.size() > limits::kConfigBytes) throwConfigError(__FILE__, __LINE__, source, {tooLarge(source, text.size())});
  CollectingErrors errors;
  pb::TextFormat::Parser parser;
  // Protobuf's parser recurses once per nesting level and sets no limit of its own: thousands of levels overflow the
  // stack. A valid config nests 4 deep.
  parser.SetRecursionLimit(limits::kNesting);
  parser.RecordErrorsTo(&errors);
  if (tree != nullptr) parser.WriteLocationsTo(tree);
  pb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  Experiment experiment;
  if (!parser.Parse(&input, &experiment)) {
    std::vector<std::string> messages;
    for (const auto& report : errors.reports) messages.push_back(describeParseError(text, source, report));
    if (messages.empty()) messages.push_back(source + ": not a valid Experiment in text format");
    throwConfigError(__FILE__, __LINE__, source, std::move(messages));
  }
  return experiment;
}

namespace {

// What a resolved pytorch experiment says of its module and its data, settled once validation passed, so that every
// config written from it (terse run's config.textproto, the driver's, terse.Recipe.text) names what the run used:
//   - the module as an absolute, canonical path (links resolved), when the config's folder is known: the same module
//     named relative or absolute, or from another working directory, is then one workload to `terse compare`, and the
//     text means the same wherever it is read (a hook script's ResultsLogger hashes the file it names);
//   - no data.dataset_dir, train_subset or test_subset where the run reads no Fashion-MNIST (a module's data(), or a
//     torchvision model on SYNTHETIC images): a config must not claim a data set the run did not read.
// Whether `variant` (a file's variant name, `file_name`, at a grid point named `variant`) is among `selected`, a run's
// --variant list (ConfigOptions::plugin_variants); an empty list selects every variant.
bool isSelectedName(const std::vector<std::string>& selected, const std::string& variant,
                    const std::string& file_name) {
  return selected.empty() || std::find(selected.begin(), selected.end(), variant) != selected.end() ||
         std::find(selected.begin(), selected.end(), file_name) != selected.end();
}

// Resolves the file's variants at every point of `axes` (resolveVariants).
std::vector<Experiment> resolveAtPoints(const Experiment& file, const std::vector<ResolvedAxis>& axes,
                                        const std::vector<FieldOverride>& overrides,
                                        const std::vector<std::string>& only) {
  std::vector<Experiment> out;
  Experiment base = file;
  base.clear_variants();
  base.clear_grid();
  const std::size_t points = gridPoints(axes);
  std::vector<std::pair<std::string, Experiment>> merged;  // the file's variants, each merged onto the base
  if (file.variants_size() == 0) {
    const std::string name = file.has_variant() ? file.variant() : std::string(kBaseVariantName);
    merged.emplace_back(name, base);
  } else {
    base.clear_variant();
    for (const auto& v : file.variants()) {
      Experiment e = base;
      mergeOverrides(e, v.overrides());
      e.set_variant(v.name());
      merged.emplace_back(v.name(), std::move(e));
    }
  }
  out.reserve(merged.size() * points);
  for (const auto& [name, variant] : merged) {
    for (std::size_t point = 0; point < points; ++point) {
      Experiment e = variant;
      placeAtGridPoint(e, name, axes, point);
      if (isSelectedName(only, e.has_variant() ? e.variant() : name, name))
        for (const auto& o : overrides) applyFieldOverride(e, o);
      applyDefaults(e);
      out.push_back(std::move(e));
    }
  }
  return out;
}

// Whether the run reads data.dataset_dir, train_subset and test_subset: every workload but pytorch's module and
// SYNTHETIC images (GloVe reads its corpus, yet its resolved configs have always kept them).
bool readsFashionMnist(const Experiment& e) {
  if (e.workload().name() != "pytorch") return true;
  const PyTorch& t = e.workload().pytorch();
  return !t.has_module() && t.data() != PyTorch::SYNTHETIC;
}

void settlePyTorchPaths(Experiment& e, const ConfigOptions& options) {
  if (e.workload().name() != "pytorch") return;
  const PyTorch& t = e.workload().pytorch();
  if (t.has_module() && !t.module().empty() && options.module_dir) {
    std::filesystem::path file(t.module());
    if (file.is_relative()) file = *options.module_dir / file;
    std::error_code ec;
    std::filesystem::path canonical = std::filesystem::weakly_canonical(std::filesystem::absolute(file), ec);
    // Validation found the file; one gone since keeps the absolute path, which the driver then refuses by name.
    if (ec) canonical = std::filesystem::absolute(file).lexically_normal();
    e.mutable_workload()->mutable_pytorch()->set_module(canonical.string());
  }
  if (!readsFashionMnist(e)) {
    e.mutable_data()->clear_dataset_dir();
    e.mutable_data()->clear_train_subset();
    e.mutable_data()->clear_test_subset();
  }
}

}  // namespace

bool isSelected(const std::vector<std::string>& selected, const Experiment& e) {
  return isSelectedName(selected, e.variant(), e.has_grid_point() ? e.grid_point().variant() : e.variant());
}

Study loadStudy(const std::filesystem::path& path, const ConfigOptions& options) {
  std::ifstream in(path, std::ios::binary);
  TERSE_CHECK(in, InvalidArgument, "cannot read experiment config " << path.string());
  // Read up to one byte past the limit, so that a huge file (or a never-ending one: a FIFO, /dev/zero) is refused
  // without reading it all.
  std::string text;
  std::vector<char> chunk(std::size_t{1} << 16);
  while (text.size() <= limits::kConfigBytes && in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()))) {
    text.append(chunk.data(), chunk.size());
  }
  if (text.size() <= limits::kConfigBytes) text.append(chunk.data(), static_cast<std::size_t>(in.gcount()));
  TERSE_CHECK(!in.bad(), InvalidArgument, "error reading experiment config " << path.string());
  if (text.size() > limits::kConfigBytes)
    throwConfigError(__FILE__, __LINE__, path.string(), {tooLarge(path.string(), text.size())});
  return loadStudyText(text, path.string(), options);
}

Study loadStudyText(std::string_view text, const std::string& source, const ConfigOptions& options) {
  pb::TextFormat::ParseInfoTree tree;
  Study study;
  study.source = source;
  study.file = parseConfigText(text, source, &tree);
  // --grid's axes join the file's before any check, so they get the file's checks.
  std::vector<std::string> axis_option;  // per axis: "--grid TEXT" for the command line's, empty for the file's
  std::set<std::string> file_axes;       // the paths the file's own grid varies
  for (const auto& a : study.file.grid()) file_axes.insert(a.path());
  {
    std::vector<GridAxis> extra;
    std::vector<std::string> texts, errors;
    for (const auto& text_ : options.grid) {
      try {
        extra.push_back(parseGridOption(text_));
        texts.push_back(text_);
      } catch (const ConfigError& e) {
        errors.insert(errors.end(), e.errors().begin(), e.errors().end());
      }
    }
    if (!errors.empty()) throwConfigError(__FILE__, __LINE__, "--grid", std::move(errors));
    mergeGridOptions(study.file, extra, texts, axis_option);
  }
  const Experiment& file = study.file;

  // Structure first: resolving needs unique variant names and overrides that stay inside one experiment, and lists
  // and strings within their limits, so that resolving (each variant a copy of the base) and the checks are bounded.
  // Every pass is linear in the file. At most kMaxReportedErrors are kept: a file of 10,000 bad variants must not make
  // a million lines.
  std::vector<std::string> errors;
  bool truncated = false;
  auto keep = [&](std::string line) {
    if (errors.size() < kMaxReportedErrors) {
      errors.push_back(std::move(line));
    } else {
      truncated = true;
    }
  };
  auto fail = [&] {
    if (truncated)
      errors.push_back(source + ": stopped after the first " + std::to_string(kMaxReportedErrors) + " errors");
    throwConfigError(__FILE__, __LINE__, source, std::move(errors));
  };
  auto report = [&](const std::string& message) {
    if (errors.size() >= kMaxReportedErrors) {
      truncated = true;
      return;
    }
    keep(at(source, locate(&tree, pathOf(message))) + message);
  };
  checkSizes(file, "", report);
  for (const auto& o : options.overrides)
    checkSizes(o.patch, "", [&](const std::string& m) { keep(o.where + ": " + m); });
  if (!errors.empty()) fail();
  if (file.has_variant() && file.variants_size() > 0) {
    report("variant: names the base of a study without variants; here each variant has its own name");
  }
  std::unordered_map<std::string_view, int> first_named;  // name -> its first variant's index
  first_named.reserve(static_cast<std::size_t>(file.variants_size()));
  std::uint64_t variant_bytes = 0;
  for (int i = 0; i < file.variants_size(); ++i) {
    const Variant& v = file.variants(i);
    // Its bytes in the file's encoding: tag, length, message (what the file's ByteSizeLong counts for it).
    const std::size_t size = v.ByteSizeLong();
    variant_bytes += pb::io::CodedOutputStream::VarintSize32(Experiment::kVariantsFieldNumber << 3) +
                     pb::io::CodedOutputStream::VarintSize64(size) + size;
    const std::string p = "variants[" + std::to_string(i) + "]";
    if (!isFolderName(v.name())) {
      report(p + ".name must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got " + quoted(v.name()));
    }
    if (const auto [it, inserted] = first_named.emplace(v.name(), i); !inserted) {
      report(p + ".name " + quoted(v.name()) + " repeats variants[" + std::to_string(it->second) + "].name");
    }
    if (v.overrides().has_study()) report(p + ".overrides.study: a variant cannot change the study");
    if (v.overrides().grid_size() > 0)
      report(p + ".overrides.grid: the grid is the study's, every variant runs at its every point");
    if (v.overrides().has_grid_point()) report(p + ".overrides.grid_point: the loader sets it, at each grid point");
    if (v.overrides().has_variant()) report(p + ".overrides.variant: the variant's name is variants[].name");
    if (v.overrides().variants_size() > 0) report(p + ".overrides.variants: variants do not nest");
  }
  // The grid's axes, each value parsed as --set parses one; messages name the file's line or the --grid option.
  auto axisWhere = [&](int axis, int value) {
    if (const std::string& option = axis_option[static_cast<std::size_t>(axis)]; !option.empty()) return option;
    const std::string p =
        "grid[" + std::to_string(axis) + "]" + (value < 0 ? "" : ".values[" + std::to_string(value) + "]");
    // The parser places a list given in brackets (values: ["1Gbps", "10Gbps"]) at its first entry only.
    auto loc = locate(&tree, p);
    if (loc.line < 0) loc = locate(&tree, "grid[" + std::to_string(axis) + "].values");
    return at(source, loc) + p;
  };
  if (file.has_grid_point() && file.grid_size() > 0)
    report(
        "grid_point: the loader sets it in each run of a grid (a results folder's config.textproto); a study with "
        "a grid does not give it");
  std::vector<std::string> axis_errors;
  const std::vector<ResolvedAxis> axes = resolveGridAxes(file, axisWhere, axis_errors);
  for (auto& e : axis_errors) keep(std::move(e));
  for (const auto& o : options.overrides)
    for (std::size_t a = 0; a < axes.size(); ++a)
      if (pathsOverlap(o.path, axes[a].path))
        keep(o.where + ": " + axes[a].path + " is an axis of the study's grid (" + axisWhere(static_cast<int>(a), -1) +
             "); give its values with --grid " + axes[a].path + "=V1,V2,...");
  // A variant's own value of a file axis's field would never be used: the axis sets it at every point, after the
  // variant, so the file contradicts itself. An axis --grid adds wins over it, as --set does (a sweep of one variant's
  // ratio: --variant topk --grid compressor.params.ratio=...).
  for (int i = 0; i < file.variants_size(); ++i) {
    for (std::size_t a = 0; a < axes.size(); ++a) {
      if (!file_axes.contains(axes[a].path)) continue;
      if (!setsField(file.variants(i).overrides(), axes[a].overrides.front())) continue;
      const std::string v = "variants[" + std::to_string(i) + "]";
      auto loc = locate(&tree, v + ".overrides." + axes[a].path);
      if (loc.line < 0) loc = locate(&tree, v);
      keep(at(source, loc) + v + " (" + quoted(file.variants(i).name()) + ")." + axes[a].path + ": an axis of the " +
           "study's grid (" + axisWhere(static_cast<int>(a), -1) + ") sets it at every point, so the variant's value " +
           "would never be used; leave the field to the axis");
    }
  }
  // A results folder's config.textproto run again says which point it is: another value of a coordinate's field is no
  // longer that point, and would be filed under it by terse compare.
  if (file.has_grid_point() && file.grid_size() == 0) {
    for (const auto& o : options.overrides) {
      for (const auto& c : file.grid_point().coordinates()) {
        if (!pathsOverlap(o.path, c.path())) continue;
        keep(o.where + ": this config is the run of variant " + quoted(file.grid_point().variant()) + " at " +
             c.path() + "=" + c.value() + " (its grid_point, as a results folder's config.textproto says), so " +
             c.path() + " is that point's; run the study's own file with --grid " + c.path() + "=..., or remove " +
             "grid_point to make this a run of its own");
      }
    }
  }
  const std::uint64_t points = gridPoints(axes);
  // Each variant is a copy of the base: bound the copies' total before making them.
  const std::uint64_t file_bytes = file.ByteSizeLong();
  std::uint64_t base_bytes = file_bytes > variant_bytes ? file_bytes - variant_bytes : 0;
  for (const auto& o : options.overrides) base_bytes += o.patch.ByteSizeLong();  // each copy carries them too
  const auto variants = static_cast<std::uint64_t>(file.variants_size());
  // Points are at most 100^8 (kGridValues, kGridAxes), which fits; times 10,000 variants it need not, so the product
  // is only formed once the points alone are within the limit.
  const std::uint64_t kMaxRuns = limits::kVariants;
  const std::uint64_t runs = points > kMaxRuns ? points : std::max<std::uint64_t>(variants, 1) * points;
  if (axes.empty() && variants > 0 && base_bytes * variants > limits::kResolvedBytes) {
    report("variants: " + std::to_string(variants) + " variants, each a copy of a base of " +
           std::to_string(base_bytes) + " bytes, resolve to " + std::to_string(base_bytes * variants) +
           " bytes, more than the limit of " + std::to_string(limits::kResolvedBytes) +
           "; shorten the base's lists or split the study");
  } else if (!axes.empty() && runs > kMaxRuns) {
    keep(axisWhere(0, -1) + ": " + std::to_string(std::max<std::uint64_t>(variants, 1)) + " variant(s) at " +
         std::to_string(points) + " grid points make " +
         (points > kMaxRuns ? "more than " + std::to_string(kMaxRuns) : std::to_string(runs)) +
         " runs, more than the limit of " + std::to_string(limits::kVariants) + "; split the study");
  } else if (!axes.empty() && base_bytes * runs > limits::kResolvedBytes) {
    keep(axisWhere(0, -1) + ": " + std::to_string(runs) + " runs (variants x grid points), each a copy of a base of " +
         std::to_string(base_bytes) + " bytes, resolve to " + std::to_string(base_bytes * runs) +
         " bytes, more than the limit of " + std::to_string(limits::kResolvedBytes) +
         "; shorten the base's lists or split the study");
  }
  if (!errors.empty()) fail();

  study.experiments = resolveAtPoints(file, axes, options.overrides, options.plugin_variants);
  if (!axes.empty()) {
    // A point's name adds ".<label>-<value>" per axis to the variant's: it must stay one folder's name, and unique.
    std::unordered_map<std::string_view, std::size_t> named;
    for (std::size_t k = 0; k < study.experiments.size(); ++k) {
      const std::string& name = study.experiments[k].variant();
      if (name.size() > 255) {
        keep(axisWhere(0, -1) + ": the run of variant " + quoted(study.experiments[k].grid_point().variant()) + " at " +
             gridPointLabel(axes, k % points) + " would be named " + std::to_string(name.size()) +
             " bytes long, above a folder name's 255; shorten the labels (grid[].label) or the values");
        break;
      }
      if (const auto [it, fresh] = named.emplace(name, k); !fresh) {
        keep(axisWhere(0, -1) + ": two runs would be named " + quoted(name) + ": variant " +
             quoted(study.experiments[it->second].grid_point().variant()) + " at " +
             gridPointLabel(axes, it->second % points) + " and variant " +
             quoted(study.experiments[k].grid_point().variant()) + " at " + gridPointLabel(axes, k % points) +
             "; rename a variant or give the axes other labels");
        break;
      }
    }
    if (!errors.empty()) fail();
  }
  // An error is said once however many runs have it: a base field's is the same in every variant, and a variant's at
  // every point of the grid. Each line keeps the points it came up at, named when not all.
  std::vector<std::string> lines;
  std::unordered_map<std::string, std::set<std::size_t>> line_points;
  // An overridden field's messages (a --set's, a grid value's), each with the runs it came up in: said once when every
  // run the override went to has it.
  struct OverrideMessage {
    const FieldOverride* by;
    std::string message;
    std::vector<std::string> variants;
  };
  std::vector<OverrideMessage> by_override;
  std::unordered_map<const FieldOverride*, std::size_t> applied;  // runs each override went to
  PluginCheckMemo plugin_checks;
  // A variant the run did not select has its plugins' names checked for being set, nothing loaded.
  ConfigOptions names_only = options;
  names_only.loader = nullptr;
  for (std::size_t k = 0; k < study.experiments.size(); ++k) {
    if (lines.size() + by_override.size() + errors.size() >= kMaxReportedErrors) {
      truncated = true;  // the runs after k are not checked: there may be more
      break;
    }
    const Experiment& e = study.experiments[k];
    const std::size_t v = k / points, point = k % points;
    const bool loads = isSelected(options.plugin_variants, e);
    // The overrides this run got: its point's values, then --set's where it was selected.
    std::vector<const FieldOverride*> got;
    if (!axes.empty()) {
      const auto c = gridCoordinates(axes, point);
      for (std::size_t a = 0; a < axes.size(); ++a) got.push_back(&axes[a].overrides[c[a]]);
    }
    if (loads)
      for (const auto& o : options.overrides) got.push_back(&o);
    // The command line's alone (after the point's values), for a rule's text that names one: a grid value's point is
    // said anyway.
    const auto sets = std::span<const FieldOverride* const>(got).subspan(axes.size());
    for (const FieldOverride* o : got) ++applied[o];
    // One run's errors in the file's order (those without a place last): the checks run table by table, rule by rule,
    // and the reader goes down the file.
    std::vector<std::pair<pb::TextFormat::ParseLocation, std::string>> found;
    for (const auto& message : validateExperiment(e, loads ? options : names_only, loads ? &plugin_checks : nullptr)) {
      const std::string path = pathOf(message);
      if (const FieldOverride* o = overrideOf(got, path)) {
        auto it = std::find_if(by_override.begin(), by_override.end(),
                               [&](const OverrideMessage& x) { return x.by == o && x.message == message; });
        if (it == by_override.end()) it = by_override.insert(by_override.end(), {o, message, {}});
        it->variants.push_back(quoted(e.variant()));
        continue;
      }
      pb::TextFormat::ParseLocation loc;
      std::string line;
      const std::string note = overrideNamedIn(sets, message);
      if (file.variants_size() > 0) {
        const std::string variant = "variants[" + std::to_string(v) + "]";
        const std::string prefix = variant + " (\"" + file.variants(static_cast<int>(v)).name() + "\").";
        if (loc = locate(&tree, variant + ".overrides." + path); loc.line >= 0) {
          line = at(source, loc) + prefix + message;
        } else if (loc = locate(&tree, path); loc.line >= 0) {
          line = at(source, loc) + message;
        } else {
          line = at(source, loc) + prefix + message;
        }
      } else {
        loc = locate(&tree, path);
        line = at(source, loc) + message;
      }
      found.emplace_back(loc, std::move(line) + note);
    }
    std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
      auto key = [](const pb::TextFormat::ParseLocation& l) {
        return std::pair{l.line < 0 ? std::numeric_limits<int>::max() : l.line, l.column};
      };
      return key(a.first) < key(b.first);
    });
    for (auto& [loc, line] : found) {
      auto [it, fresh] = line_points.try_emplace(line);
      if (fresh) lines.push_back(line);
      it->second.insert(point);
    }
  }
  for (const auto& line : lines) {
    const auto& at_points = line_points[line];
    if (at_points.size() == points) {
      keep(line);
      continue;
    }
    std::string where;
    std::size_t shown = 0;
    for (const std::size_t p : at_points) {
      if (shown++ == 4) {
        where += "; and " + std::to_string(at_points.size() - 4) + " more";
        break;
      }
      where += (where.empty() ? "" : "; ") + gridPointLabel(axes, p);
    }
    keep(line + " (at grid point" + (at_points.size() == 1 ? " " : "s ") + where + ")");
  }
  for (const auto& [by, message, names] : by_override) {
    if (names.size() == applied[by]) {
      keep(by->where + ": " + message);
    } else {
      keep(by->where + (names.size() == 1 ? ": variant " : ": variants ") + joined(names) + ": " + message);
    }
  }
  if (!errors.empty()) fail();
  // An override of a data field that no variant it went to reads (settlePyTorchPaths leaves the field out of their
  // resolved configs) would change nothing, silently.
  std::vector<std::pair<const FieldOverride*, std::string>> set_fields;  // each override, with how messages name it
  for (const auto& o : options.overrides) set_fields.emplace_back(&o, o.where);
  for (std::size_t a = 0; a < axes.size(); ++a)
    set_fields.emplace_back(&axes[a].overrides.front(), axisWhere(static_cast<int>(a), -1));
  for (const auto& [o, where] : set_fields) {
    if (o->path != "data.dataset_dir" && o->path != "data.train_subset" && o->path != "data.test_subset") continue;
    const bool read = std::any_of(study.experiments.begin(), study.experiments.end(), [&](const Experiment& e) {
      return isSelected(options.plugin_variants, e) && readsFashionMnist(e);
    });
    if (!read)
      keep(where +
           ": no variant it applies to reads Fashion-MNIST: a pytorch module's data(rank, world) gives its "
           "examples (cut them there), and data SYNTHETIC draws its own (workload.pytorch.synthetic_examples)");
  }
  if (!errors.empty()) fail();
  for (Experiment& e : study.experiments) settlePyTorchPaths(e, options);
  return study;
}

void mergeOverrides(Experiment& base, const Experiment& overrides) {
  clearReplaced(base, overrides);
  base.MergeFrom(overrides);
}

void applyDefaults(Experiment& e) {
  table::fillDefaults(e);
}

std::string configReference() {
  return table::reference();
}

std::string withConfigReference(std::string_view text, const std::string& source) {
  return table::withReference(text, source);
}

std::vector<Experiment> resolveVariants(const Experiment& file, const std::vector<FieldOverride>& overrides,
                                        const std::vector<std::string>& only) {
  return resolveAtPoints(file, resolveGridAxes(file), overrides, only);
}

std::string toText(const Experiment& experiment) {
  std::string out;
  pb::TextFormat::Printer printer;
  TERSE_CHECK(printer.PrintToString(experiment, &out), InternalError, "cannot print experiment as text");
  return out;
}

void writeResolvedConfig(const Experiment& experiment, const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TERSE_CHECK(out, InvalidArgument, "cannot write resolved config " << path.string());
  out << "# Resolved config of study '" << experiment.study() << "', variant '" << experiment.variant()
      << "': the variant merged onto the base, every default filled in.\n"
      << toText(experiment);
  out.flush();
  TERSE_CHECK(out, InvalidArgument, "error writing resolved config " << path.string());
}

std::vector<Experiment> expandRepeats(const std::vector<Experiment>& experiments) {
  std::vector<Experiment> out;
  for (const auto& e : experiments) {
    if (e.seeds_size() == 0) {
      out.push_back(e);
      continue;
    }
    for (const uint64_t seed : e.seeds()) {
      out.push_back(e);
      out.back().set_seed(seed);
    }
  }
  return out;
}

std::vector<std::string> sameRunWarnings(const std::vector<Experiment>& runs) {
  // Each run's config as it trains: its name cleared, and what it ignores cleared too.
  std::vector<std::string> keys;
  keys.reserve(runs.size());
  for (const Experiment& e : runs) {
    Experiment c = e;
    c.clear_variant();
    c.clear_grid_point();  // the point's coordinates name it; its fields are set already
    if (c.data().partition() != Data::DIRICHLET) {
      c.mutable_data()->clear_dirichlet_alpha();
      c.mutable_data()->clear_partition_seed();
    }
    keys.push_back(toText(c));
  }
  // Groups in the order of their first run (a grid can make thousands of runs: one pass, not a pass per pair).
  std::unordered_map<std::string, std::size_t> group_of;
  std::vector<std::vector<std::string>> groups;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto [at, fresh] = group_of.try_emplace(keys[i], groups.size());
    if (fresh) groups.emplace_back();
    groups[at->second].push_back(resultsSubfolder(runs[i]));
  }
  std::vector<std::string> out;
  for (const std::vector<std::string>& names : groups) {
    if (names.size() < 2) continue;
    std::string list;
    for (std::size_t k = 0; k < names.size(); ++k) list += (k ? ", '" : "'") + names[k] + "'";
    out.push_back(std::to_string(names.size()) + " runs train the same thing under different names: " + list +
                  " (their configs differ only in their names, or in fields they ignore: data.dirichlet_alpha and "
                  "partition_seed without partition DIRICHLET); each still runs, so drop the duplicates from the "
                  "study or the grid to save the time");
  }
  return out;
}

std::string repeatSubfolder(const std::string& variant, uint64_t seed) {
  return variant + "/seed-" + std::to_string(seed);
}

std::string resultsSubfolder(const Experiment& e) {
  return e.seeds_size() == 0 ? e.variant() : repeatSubfolder(e.variant(), e.seed());
}

std::vector<Experiment> selectVariants(const Study& study, const std::vector<std::string>& names) {
  if (names.empty()) return study.experiments;
  std::vector<Experiment> out;
  std::set<std::string> taken;  // a point named on its own and through its variant runs once
  for (const auto& name : names) {
    bool any = false;
    for (const auto& e : study.experiments) {
      if (e.variant() != name && !(e.has_grid_point() && e.grid_point().variant() == name)) continue;
      any = true;
      if (taken.insert(e.variant()).second) out.push_back(e);
    }
    if (!any) {
      std::vector<std::string> known;
      for (const auto& e : study.experiments) {
        const std::string& n = e.has_grid_point() ? e.grid_point().variant() : e.variant();
        if (known.empty() || known.back() != n) known.push_back(n);
      }
      TERSE_THROW(
          InvalidArgument,
          "--variant " << quoted(name) << ": no such variant in " << study.source << " (variants: " << joined(known)
                       << (study.experiments.front().has_grid_point()
                               ? "; or one point of the grid, e.g. " + quoted(study.experiments.front().variant())
                               : std::string())
                       << ")");
    }
  }
  return out;
}

namespace {

// A command-line override changes every variant of a study after the file's own checks ran: `set` applies it to one
// variant and `check` re-runs the checks it can break; every failure names the option and the variant, and all of
// them come in one ConfigError, as a file's errors do.
template <typename Set, typename Check>
void recheckAfterOverride(std::vector<Experiment>& experiments, const std::string& source, Set set, Check check) {
  std::vector<std::string> errors;
  for (auto& e : experiments) {
    set(e);
    Checks c;
    check(c, e);
    for (const auto& m : c.take()) errors.push_back(source + ": variant " + quoted(e.variant()) + ": " + m);
  }
  if (!errors.empty()) throwConfigError(__FILE__, __LINE__, source, std::move(errors));
}

}  // namespace

void overrideSeeds(std::vector<Experiment>& experiments, std::span<const uint64_t> seeds, const std::string& source) {
  TERSE_CHECK(!seeds.empty(), InvalidArgument, source << " needs at least one seed");
  recheckAfterOverride(
      experiments, source,
      [&](Experiment& e) {
        e.mutable_seeds()->Assign(seeds.begin(), seeds.end());
        e.set_seed(seeds.front());
      },
      checkSeeds);
}

}  // namespace terse::experiments
