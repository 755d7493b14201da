// `--set PATH=VALUE` (field_override.h): the path walked through Experiment's descriptors, the value parsed by
// protobuf's text parser into a patch that holds that one field, the patch merged into each resolved variant.
#include "experiments/config/field_override.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <set>
#include <utility>

#include "core/common/spelling.h"
#include "experiments/config/config.h"
#include "experiments/config/config_checks.h"

namespace terse::experiments {
namespace {

namespace pb = google::protobuf;

class CollectMessages : public pb::io::ErrorCollector {
 public:
#if GOOGLE_PROTOBUF_VERSION >= 4022000
  void RecordError(int, pb::io::ColumnNumber, absl::string_view message) override {
    messages.emplace_back(message);
  }
#else
  void AddError(int, pb::io::ColumnNumber, const std::string& message) override {
    messages.push_back(message);
  }
#endif
  std::vector<std::string> messages;
};

// A string literal of the text format for a bare VALUE: quotes, backslashes and bytes outside printable ASCII escaped.
std::string textLiteral(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c >= 0x7f) {
      char octal[5];
      std::snprintf(octal, sizeof octal, "\\%03o", c);
      out += octal;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

bool isQuoted(std::string_view v) {
  return !v.empty() && (v.front() == '"' || v.front() == '\'');
}

// The paths below `type` (prefixed by `prefix`) of fields called `name`, for "did you mean 'optimizer.lr'?" when a
// user leaves out the message a field lives in. Each message type is entered once: Variant.overrides is an Experiment.
void findByName(const pb::Descriptor* type, const std::string& prefix, std::string_view name,
                std::set<const pb::Descriptor*>& seen, std::vector<std::string>& found) {
  if (!seen.insert(type).second) return;
  for (int i = 0; i < type->field_count(); ++i) {
    const pb::FieldDescriptor* f = type->field(i);
    if (f->name() == "variants") continue;
    if (f->name() == name) found.push_back(prefix + f->name());
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map())
      findByName(f->message_type(), prefix + f->name() + ".", name, seen, found);
  }
}

// "; did you mean 'lr'?" (a field of `type` a typo or two away), "; did you mean 'optimizer.lr'?" (a field of that name
// deeper down), else the fields `type` has.
std::string suggestion(const pb::Descriptor* type, const std::string& prefix, std::string_view name) {
  std::vector<std::string> names;
  for (int i = 0; i < type->field_count(); ++i)
    if (type->field(i)->full_name() != "terse.experiments.Experiment.grid_point")  // the loader's alone
      names.push_back(type->field(i)->name());
  if (const auto best = closestName(name, names)) return "; did you mean " + experiments::quoted(*best) + "?";
  std::set<const pb::Descriptor*> seen;
  std::vector<std::string> deeper;
  findByName(type, prefix, name, seen, deeper);
  if (!deeper.empty() && deeper.size() <= 3) {
    for (auto& d : deeper) d = experiments::quoted(d);
    return "; did you mean " + joined(deeper) + "?";
  }
  return "; its fields: " + joined(names);
}

// How a message names what a field takes: "int32", "one of SYNC, ASYNC, SSP, HOGWILD", "a list in brackets of uint64".
std::string typeText(const pb::FieldDescriptor* f, bool one_value) {
  if (!one_value && f->is_map()) return "a list in brackets of {key: ... value: ...} entries";
  std::string t;
  if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) {
    std::vector<std::string> names;
    for (int i = 0; i < f->enum_type()->value_count(); ++i) {
      const std::string& n = f->enum_type()->value(i)->name();
      if (!n.ends_with("_UNSPECIFIED")) names.push_back(n);
    }
    t = (one_value ? "one of " : "") + joined(names);
  } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
    t = f->message_type()->name() + " messages, e.g. [{field: value}]";
  } else {
    t = f->type_name();
  }
  return one_value ? t : "a list in brackets of " + t;
}

[[noreturn]] void refuse(const std::string& option, const std::string& where, const std::string& problem) {
  const std::string error = where + ": " + problem;
  throw ConfigError(option + ": " + error, option, {error});
}

}  // namespace

std::string unknownFieldSuggestion(const google::protobuf::Descriptor* type, const std::string& prefix,
                                   std::string_view name) {
  return suggestion(type, prefix, name);
}

std::string enumValueSuggestion(const google::protobuf::EnumDescriptor* type, std::string_view name) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) {
    const std::string& n = type->value(i)->name();
    if (!n.ends_with("_UNSPECIFIED")) names.push_back(n);
  }
  if (const auto best = closestName(name, names)) return "; did you mean " + *best + "?";
  return "; it takes " + joined(names);
}

FieldOverride parseFieldOverride(std::string_view text, const std::string& option) {
  FieldOverride o;
  o.where = option + " " + std::string(text);
  const std::size_t eq = text.find('=');
  if (eq == std::string_view::npos)
    refuse(option, o.where,
           "expected PATH=VALUE (a field of the experiment and its value), e.g. " + option + " epochs=1");
  o.path = std::string(text.substr(0, eq));
  const std::string value(text.substr(eq + 1));
  if (o.path.empty()) refuse(option, o.where, "no field path before '=', e.g. " + option + " optimizer.lr=0.1");

  // Walk the path: messages down to the field set; a map's field takes the rest of the path as its key.
  const pb::Descriptor* type = Experiment::descriptor();
  std::string walked;  // "optimizer", for "Experiment.optimizer has no field 'lrr'"
  std::string map_key;
  std::size_t pos = 0;
  for (;;) {
    std::size_t end = o.path.find('.', pos);
    if (end == std::string::npos) end = o.path.size();
    const std::string part = o.path.substr(pos, end - pos);
    const std::string owner = walked.empty() ? "Experiment" : "Experiment." + walked;
    if (part.empty())
      refuse(option, o.where, experiments::quoted(o.path) + " has an empty field name; fields are joined by one '.'");
    const pb::FieldDescriptor* f = type->FindFieldByName(part);
    if (f == nullptr) {
      const std::string bare = part.substr(0, part.find('['));
      if (const pb::FieldDescriptor* list = type->FindFieldByName(bare); list != nullptr && list->is_repeated()) {
        refuse(option, o.where,
               (walked.empty() ? "" : walked + ".") + bare + " is a list: " + option + " replaces it whole, e.g. " +
                   (walked.empty() ? "" : walked + ".") + bare + "=[...]");
      }
      refuse(option, o.where,
             owner + " has no field " + experiments::quoted(part) +
                 suggestion(type, walked.empty() ? "" : walked + ".", part));
    }
    o.fields.push_back(f);
    walked += (walked.empty() ? "" : ".") + part;
    if (f->containing_type() == Experiment::descriptor() && (part == "variants" || part == "variant")) {
      refuse(option, o.where,
             part + " comes from the file (variants[].name); select variants with --variant NAME instead");
    }
    if (f->containing_type() == Experiment::descriptor() && (part == "grid" || part == "grid_point")) {
      refuse(option, o.where,
             part + " is the study's structure, not a field of one run; add an axis with --grid PATH=V1,V2,...");
    }
    if (end == o.path.size()) break;
    if (f->is_map()) {
      map_key = o.path.substr(end + 1);  // keys may hold dots: the rest is the key
      o.map_entry = true;
      break;
    }
    if (f->is_repeated()) {
      refuse(option, o.where,
             walked + " is a list: " + option + " replaces it whole (" + walked + "=[...]), not a field inside it");
    }
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      refuse(option, o.where,
             walked + " is of type " + f->type_name() + ", not a message: it has no field " +
                 experiments::quoted(o.path.substr(end + 1)));
    }
    type = f->message_type();
    pos = end + 1;
  }
  const pb::FieldDescriptor* leaf = o.fields.back();
  if (!o.map_entry && !leaf->is_repeated() && leaf->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
    std::vector<std::string> names;
    for (int i = 0; i < leaf->message_type()->field_count(); ++i)
      names.push_back(o.path + "." + leaf->message_type()->field(i)->name());
    refuse(option, o.where,
           o.path + " is a message (" + leaf->message_type()->name() + "): set one of its fields: " + joined(names));
  }

  // The value, as the file would hold it, parsed into an empty message of the field's owner: "lr: 0.1",
  // "params { key: "ratio" value: "0.01" }". Only the field itself may come out set.
  pb::Message* owner = &o.patch;
  for (std::size_t i = 0; i + 1 < o.fields.size(); ++i)
    owner = owner->GetReflection()->MutableMessage(owner, o.fields[i]);
  std::string field_text;
  const pb::FieldDescriptor* typed = leaf;  // the field whose type VALUE is in
  if (o.map_entry) {
    const pb::FieldDescriptor* key = leaf->message_type()->map_key();
    typed = leaf->message_type()->map_value();
    if (key->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) {
      refuse(option, o.where,
             leaf->name() + " is a map keyed by " + key->type_name() + ", give it whole: " + walked +
                 "=[{key: ... value: ...}]");
    }
    const bool bare = typed->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && !isQuoted(value);
    field_text =
        leaf->name() + " { key: " + textLiteral(map_key) + " value: " + (bare ? textLiteral(value) : value) + " }";
  } else {
    const bool bare =
        !leaf->is_repeated() && leaf->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && !isQuoted(value);
    field_text = leaf->name() + ": " + (bare ? textLiteral(value) : value);
  }
  std::unique_ptr<pb::Message> parsed(owner->New());
  CollectMessages errors;
  pb::TextFormat::Parser parser;
  parser.SetRecursionLimit(limits::kNesting);
  parser.RecordErrorsTo(&errors);
  pb::io::ArrayInputStream input(field_text.data(), static_cast<int>(field_text.size()));
  const std::string expected =
      o.path + " takes " + typeText(typed, o.map_entry || !leaf->is_repeated()) + ", got " + experiments::quoted(value);
  if (!parser.Parse(&input, parsed.get())) {
    refuse(option, o.where, expected + (errors.messages.empty() ? "" : " (" + errors.messages.front() + ")"));
  }
  std::vector<const pb::FieldDescriptor*> set;
  parsed->GetReflection()->ListFields(*parsed, &set);
  const bool one_entry = !o.map_entry || parsed->GetReflection()->FieldSize(*parsed, leaf) == 1;
  if (set.size() > 1 || (!set.empty() && set.front() != leaf) || !one_entry)
    refuse(option, o.where, expected + ": VALUE sets more than the one field");
  owner->MergeFrom(*parsed);
  return o;
}

std::vector<FieldOverride> parseFieldOverrides(const std::vector<std::string>& texts, const std::string& option) {
  std::vector<FieldOverride> out;
  std::vector<std::string> errors;
  for (const auto& text : texts) {
    try {
      FieldOverride o = parseFieldOverride(text, option);
      const auto same = std::find_if(out.begin(), out.end(), [&](const FieldOverride& x) { return x.path == o.path; });
      if (same != out.end()) {
        errors.push_back(o.where + ": " + o.path + " is already set by " + same->where + "; give each field once");
        continue;
      }
      out.push_back(std::move(o));
    } catch (const ConfigError& e) {
      errors.insert(errors.end(), e.errors().begin(), e.errors().end());
    }
  }
  // A map's entries after the map given whole, whatever the order on the command line: `compressor.params=[]` with
  // `compressor.params.ratio=0.5` leaves ratio alone in the map either way round.
  std::stable_partition(out.begin(), out.end(), [](const FieldOverride& o) { return !o.map_entry; });
  if (!errors.empty()) {
    std::string message = option + ": " + std::to_string(errors.size()) + (errors.size() == 1 ? " error" : " errors");
    for (const auto& e : errors) message += "\n  " + e;
    throw ConfigError(message, option, std::move(errors));
  }
  return out;
}

void applyFieldOverride(Experiment& experiment, const FieldOverride& o) {
  pb::Message* owner = &experiment;
  for (std::size_t i = 0; i + 1 < o.fields.size(); ++i)
    owner = owner->GetReflection()->MutableMessage(owner, o.fields[i]);
  // Cleared first, so that a list is replaced rather than appended to and a scalar's presence is the patch's. A map
  // entry leaves the other keys: MergeFrom replaces the value of a key both hold.
  if (!o.map_entry) owner->GetReflection()->ClearField(owner, o.fields.back());
  experiment.MergeFrom(o.patch);
}

const FieldOverride* overrideOf(const std::vector<const FieldOverride*>& overrides, std::string_view path) {
  auto inside = [](std::string_view inner, std::string_view outer) {
    return inner.size() > outer.size() && inner.starts_with(outer) &&
           (inner[outer.size()] == '.' || inner[outer.size()] == '[');
  };
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {
    if ((*it)->path == path || inside((*it)->path, path) || inside(path, (*it)->path)) return *it;
  }
  return nullptr;
}

std::string overrideNamedIn(std::span<const FieldOverride* const> overrides, std::string_view message) {
  // A path's own characters: a match with one of them on either side is part of a longer path.
  auto pathChar = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.'; };
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {
    const std::string& path = (*it)->path;
    for (std::size_t at = message.find(path); at != std::string_view::npos; at = message.find(path, at + 1)) {
      const std::size_t end = at + path.size();
      const bool starts = at == 0 || !pathChar(message[at - 1]);
      // A trailing '.' ends a sentence, not a path, when nothing of a path follows it.
      const bool ends = end == message.size() || !pathChar(message[end]) ||
                        (message[end] == '.' && (end + 1 == message.size() || !pathChar(message[end + 1])));
      if (starts && ends) return " (" + path + " is " + (*it)->where + ")";
    }
  }
  return "";
}

const FieldOverride* overrideOf(const std::vector<FieldOverride>& overrides, std::string_view path) {
  std::vector<const FieldOverride*> all;
  all.reserve(overrides.size());
  for (const auto& o : overrides) all.push_back(&o);
  return overrideOf(all, path);
}

}  // namespace terse::experiments
