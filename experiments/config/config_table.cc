// The engine behind the config tables (config_table.h): the entries resolved once against Experiment's descriptor,
// then used by protobuf reflection to fill defaults, check values and write the field reference.
#include "experiments/config/config_table.h"
#include "experiments/config/ignore_errors.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/reflection.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/comm/link_emulation.h"

namespace terse::experiments {

namespace pb = google::protobuf;

void checkDuration(Checks& c, const std::string& path, const std::string& text, double max_s, bool positive) {
  try {
    const double s = comm::parseDuration(text, max_s);
    if (positive && !(s > 0)) c.fail(path) << " must be > 0, got '" << text << "'";
  } catch (const Error& e) {
    c.fail(path) << ": " << untagged(e);
  }
}

void checkBandwidth(Checks& c, const std::string& path, const std::string& text) {
  try {
    const double bps = comm::parseBandwidth(text);
    if (bps != 0 && !(bps >= limits::kMinBandwidthBps && bps <= limits::kMaxBandwidthBps))
      c.fail(path) << " '" << text << "' must be in [" << comm::formatBandwidth(limits::kMinBandwidthBps) << ", "
                   << comm::formatBandwidth(limits::kMaxBandwidthBps) << "] or \"unlimited\"";
  } catch (const Error& e) {
    c.fail(path) << ": " << untagged(e);
  }
}

namespace table {
namespace {

using Kind = Rule::Kind;
using CppType = pb::FieldDescriptor::CppType;

// One entry bound to its field. `prototype` holds the section's value defaults, parsed once: filling copies from it.
struct Bound {
  const Field* entry;
  const pb::FieldDescriptor* field;
};

struct BoundSection {
  const Section* section;
  std::vector<const pb::FieldDescriptor*> chain;  // Experiment -> the section's message; the last may be repeated
  bool repeated = false;
  std::string prefix;  // message paths: "optimizer." ("" for Experiment's own fields), "link.overrides" + "[i]."
  std::vector<Bound> fields;
  std::unique_ptr<pb::Message> prototype;
  const pb::Message* empty = nullptr;  // the message's default instance: an absent section reads as it
};

bool isNumber(const pb::FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case CppType::CPPTYPE_INT32:
    case CppType::CPPTYPE_INT64:
    case CppType::CPPTYPE_UINT32:
    case CppType::CPPTYPE_UINT64:
    case CppType::CPPTYPE_DOUBLE:
    case CppType::CPPTYPE_FLOAT:
      return true;
    default:
      return false;
  }
}
bool isFloat(const pb::FieldDescriptor* f) {
  return f->cpp_type() == CppType::CPPTYPE_DOUBLE || f->cpp_type() == CppType::CPPTYPE_FLOAT;
}

// A default or choice as the text format writes it: strings quoted, everything else as it is.
std::string textValue(const pb::FieldDescriptor* f, std::string_view text) {
  if (f->cpp_type() != CppType::CPPTYPE_STRING) return std::string(text);
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + '"';
}

// Sets one (non-repeated) field of `m` from text; false when the text is not a value of its type.
bool parseInto(pb::Message& m, const pb::FieldDescriptor* f, std::string_view text) {
  IgnoreErrors quiet;  // bind() reports a default that does not parse, in the table's words
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&quiet);
  return parser.ParseFieldValueFromString(textValue(f, text), f, &m);
}

// A field's value (element `index` of a repeated one) as a number: exact for every int64 and uint64 in long double.
long double number(const pb::Message& m, const pb::FieldDescriptor* f, int index) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case CppType::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case CppType::CPPTYPE_INT64:
      return static_cast<long double>(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case CppType::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case CppType::CPPTYPE_UINT64:
      return static_cast<long double>(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case CppType::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
    case CppType::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
    default:
      return 0;
  }
}

// A value as messages print it: integers in full, doubles as a stream writes them (as the checks always did).
std::string printed(const pb::FieldDescriptor* f, long double v) {
  std::ostringstream os;
  if (isFloat(f)) {
    os << static_cast<double>(v);
  } else if (f->cpp_type() == CppType::CPPTYPE_UINT64 || f->cpp_type() == CppType::CPPTYPE_UINT32) {
    os << static_cast<std::uint64_t>(v);
  } else {
    os << static_cast<std::int64_t>(v);
  }
  return os.str();
}

std::string bound(const pb::FieldDescriptor* f, double v, std::string_view text) {
  return text.empty() ? printed(f, v) : std::string(text);
}

std::string stringValue(const pb::Message& m, const pb::FieldDescriptor* f) {
  std::string scratch;
  return m.GetReflection()->GetStringReference(m, f, &scratch);
}

// "A, B or C": the enum's named values but the zero one.
std::string enumChoices(const pb::EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i)
    if (type->value(i)->number() != 0) names.push_back(type->value(i)->name());
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

std::string choiceList(const pb::FieldDescriptor* f, std::span<const std::string_view> choices) {
  std::string out;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ");
    out += f->cpp_type() == CppType::CPPTYPE_STRING ? "\"" + std::string(choices[i]) + "\"" : std::string(choices[i]);
  }
  return out;
}

// The rule in the reference's and the range messages' words: "in [1, 1024]", ">= 0", "at most 64".
std::string rangeText(const pb::FieldDescriptor* f, const Rule& r) {
  const bool has_lo = r.lo != -Rule::kNoBound, has_hi = r.hi != Rule::kNoBound;
  if (has_lo && has_hi) {
    return std::string("in ") + (r.lo_open ? "(" : "[") + bound(f, r.lo, r.lo_text) + ", " + bound(f, r.hi, r.hi_text) +
           (r.hi_open ? ")" : "]");
  }
  if (has_lo) return std::string(r.lo_open ? "> " : ">= ") + bound(f, r.lo, r.lo_text);
  return std::string(r.hi_open ? "below " : "at most ") + bound(f, r.hi, r.hi_text);
}

// Checks the field `entry` (element `index` of a list, -1 for a single value) of message `m`, whose path in messages is
// `prefix` + the field's name. The path is spelt out only for a message: a study of 10,000 variants of 1,024 layers
// checks ten million list entries, and building a path for each took seconds.
void checkValue(Checks& c, const std::string& prefix, const pb::Message& m, const pb::FieldDescriptor* f, int index,
                const Field& entry) {
  const Rule& r = entry.rule;
  auto path = [&, list = index >= 0] {
    std::string p = prefix + std::string(entry.name);
    return list ? p + "[" + std::to_string(index) + "]" : p;
  };
  auto fail = [&]() -> std::ostringstream& { return c.fail(path()); };
  index = std::max(index, 0);  // the element to read: 0 for a single value
  switch (r.kind) {
    case Kind::kFree:
      return;
    case Kind::kRange: {
      const long double v = number(m, f, index);
      const bool has_lo = r.lo != -Rule::kNoBound, has_hi = r.hi != Rule::kNoBound;
      bool ok = true;
      if (has_lo) ok = ok && (r.lo_open ? v > r.lo : v >= r.lo);  // NaN fails
      if (has_hi && has_lo) ok = ok && (r.hi_open ? v < r.hi : v <= r.hi);
      if (has_hi && !has_lo) ok = ok && !(r.hi_open ? v >= r.hi : v > r.hi);  // a ceiling alone: NaN passes
      const bool not_finite = isFloat(f) && !std::isfinite(static_cast<double>(v));
      if (r.finite && not_finite) ok = false;
      if (!ok) {
        fail() << " must be " << (r.finite && not_finite && !(has_lo && has_hi) ? "finite and " : "") << rangeText(f, r)
               << ", got " << printed(f, v) << entry.note;
      }
      return;
    }
    case Kind::kEnum: {
      const int v = f->is_repeated() ? m.GetReflection()->GetRepeatedEnumValue(m, f, index)
                                     : m.GetReflection()->GetEnumValue(m, f);
      // Zero is *_UNSPECIFIED; a number without a name (`clock: 7`, which the text format lets through for open enums)
      // is no value the code knows either.
      if (v == 0 || f->enum_type()->FindValueByNumber(v) == nullptr)
        fail() << " must be " << enumChoices(f->enum_type()) << entry.note;
      return;
    }
    case Kind::kOneOf: {
      std::string got;
      bool ok = false;
      if (f->cpp_type() == CppType::CPPTYPE_STRING) {
        got = stringValue(m, f);
        for (auto choice : r.choices) ok = ok || got == choice;
        got = experiments::quoted(got);
      } else {
        const long double v = number(m, f, index);
        for (auto choice : r.choices) ok = ok || std::stold(std::string(choice)) == v;
        got = printed(f, v);
      }
      if (!ok) fail() << " must be " << choiceList(f, r.choices) << ", got " << got << entry.note;
      return;
    }
    case Kind::kDuration:
      return checkDuration(c, path(), stringValue(m, f), r.max_s, r.positive);
    case Kind::kBandwidth:
      return checkBandwidth(c, path(), stringValue(m, f));
    case Kind::kNonEmpty:
      if (stringValue(m, f).empty()) fail() << r.says << entry.note;
      return;
    case Kind::kFolderName:
      if (const std::string v = stringValue(m, f); !isFolderName(v))
        fail() << " must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got " << experiments::quoted(v)
               << entry.note;
      return;
    case Kind::kCustom:
      return r.check(c, path(), stringValue(m, f));
  }
}

// Whether rule `r` can apply to field `f`; empty when it can, else why not.
std::string ruleMismatch(const pb::FieldDescriptor* f, const Rule& r) {
  const bool str = f->cpp_type() == CppType::CPPTYPE_STRING;
  switch (r.kind) {
    case Kind::kFree:
      return {};
    case Kind::kRange:
      return isNumber(f) ? "" : "a range needs a number";
    case Kind::kEnum:
      return f->cpp_type() == CppType::CPPTYPE_ENUM ? "" : "an enum rule needs an enum";
    case Kind::kOneOf:
      if (f->is_repeated()) return "a choice of a list";
      if (!str && !isNumber(f)) return "a choice needs a number or a string";
      if (r.choices.empty()) return "a choice of nothing";
      return {};
    case Kind::kDuration:
    case Kind::kBandwidth:
    case Kind::kNonEmpty:
    case Kind::kFolderName:
    case Kind::kCustom:
      if (!str || f->is_repeated()) return "the rule needs a (non-repeated) string";
      return r.kind == Kind::kCustom && r.check == nullptr ? "a custom rule without its function" : "";
  }
  return "an unknown rule";
}

std::vector<BoundSection> bind(std::span<const Section> sections, std::vector<std::string>& problems) {
  std::vector<BoundSection> out;
  for (const Section& s : sections) {
    BoundSection b;
    b.section = &s;
    const pb::Descriptor* type = Experiment::descriptor();
    std::string path(s.path);
    const std::string where = "section '" + std::string(s.path) + "'";
    bool ok = true;
    for (std::size_t pos = 0; !path.empty() && pos <= path.size();) {
      std::size_t end = path.find('.', pos);
      if (end == std::string::npos) end = path.size();
      std::string name = path.substr(pos, end - pos);
      const bool rep = name.size() > 2 && name.ends_with("[]");
      if (rep) name.resize(name.size() - 2);
      const pb::FieldDescriptor* f = type->FindFieldByName(name);
      if (f == nullptr || f->message_type() == nullptr || f->is_map() || f->is_repeated() != rep ||
          (rep && end != path.size())) {
        problems.push_back(where + ": '" + name + "' is not " + (rep ? "a repeated" : "a") + " message field of " +
                           type->full_name() + (rep && end != path.size() ? " (only the last step may repeat)" : ""));
        ok = false;
        break;
      }
      b.chain.push_back(f);
      b.repeated = rep;
      type = f->message_type();
      pos = end + 1;
    }
    if (!ok) continue;
    b.prefix = b.repeated ? path.substr(0, path.size() - 2) : (path.empty() ? "" : path + ".");
    b.empty = pb::MessageFactory::generated_factory()->GetPrototype(type);
    b.prototype.reset(b.empty->New());
    for (const Field& entry : s.fields) {
      const std::string at = where + " field '" + std::string(entry.name) + "'";
      const pb::FieldDescriptor* f = type->FindFieldByName(std::string(entry.name));
      if (f == nullptr) {
        problems.push_back(at + ": no such field in " + type->full_name());
        continue;
      }
      if (f->message_type() != nullptr) {
        problems.push_back(at + ": a message, not a scalar (give it a section of its own)");
        continue;
      }
      for (const Bound& other : b.fields)
        if (other.field == f) problems.push_back(at + ": listed twice");
      if (auto why = ruleMismatch(f, entry.rule); !why.empty()) problems.push_back(at + ": " + why);
      if (entry.rule.kind == Kind::kOneOf && f->cpp_type() != CppType::CPPTYPE_STRING) {
        for (auto choice : entry.rule.choices) {
          auto scratch = std::unique_ptr<pb::Message>(b.prototype->New());
          if (!parseInto(*scratch, f, choice))
            problems.push_back(at + ": choice '" + std::string(choice) + "' is not a " + f->cpp_type_name());
        }
      }
      const auto kind = entry.def.kind;
      if (kind == Default::Kind::kValue || kind == Default::Kind::kUnfilled) {
        if (f->is_repeated()) {
          problems.push_back(at + ": a list takes no default here");
        } else {
          // Unfilled defaults are parsed too (into a scratch message), so that what the reference says is a value.
          auto scratch = std::unique_ptr<pb::Message>(b.prototype->New());
          pb::Message& into = kind == Default::Kind::kValue ? *b.prototype : *scratch;
          if (!parseInto(into, f, entry.def.text)) {
            problems.push_back(at + ": default '" + std::string(entry.def.text) + "' is not a " +
                               (f->enum_type() ? f->enum_type()->full_name() : std::string(f->cpp_type_name())));
          } else if (entry.rule.kind != Kind::kFree && ruleMismatch(f, entry.rule).empty()) {
            // A default its own rule refuses is a table error, not the user's.
            Checks c;
            checkValue(c, "", into, f, -1, entry);
            for (const auto& m : c.take()) problems.push_back(at + ": its own rule refuses the default: " + m);
          }
        }
      }
      if (kind == Default::Kind::kComputed && entry.def.compute == nullptr)
        problems.push_back(at + ": a computed default without its function");
      b.fields.push_back({&entry, f});
    }
    out.push_back(std::move(b));
  }
  return out;
}

const std::vector<BoundSection>& tables() {
  static const std::vector<BoundSection> tables = [] {
    std::vector<std::string> problems;
    auto b = bind(sections(), problems);
    if (!problems.empty()) {
      std::string all;
      for (const auto& p : problems) all += "\n  " + p;
      TERSE_THROW(InternalError,
                  "experiments/config/config_fields.cc: the config tables do not fit the schema:" << all);
    }
    return b;
  }();
  return tables;
}

// The section's message in `e` (null when it is absent: nothing of it is set).
const pb::Message* find(const pb::Message& root, const BoundSection& s) {
  const pb::Message* m = &root;
  for (std::size_t i = 0; i + (s.repeated ? 1 : 0) < s.chain.size(); ++i) {
    if (!m->GetReflection()->HasField(*m, s.chain[i])) return nullptr;
    m = &m->GetReflection()->GetMessage(*m, s.chain[i]);
  }
  return m;
}

pb::Message* mutableAt(pb::Message& root, const BoundSection& s) {
  pb::Message* m = &root;
  for (std::size_t i = 0; i + (s.repeated ? 1 : 0) < s.chain.size(); ++i)
    m = m->GetReflection()->MutableMessage(m, s.chain[i]);
  return m;
}

// Calls fn(message, path prefix) for the section's message, or each element of a repeated one.
template <typename Message, typename Fn>
void forEach(Message* holder, const BoundSection& s, Fn fn) {
  if (holder == nullptr) return;
  if (!s.repeated) return fn(holder, s.prefix);
  const pb::FieldDescriptor* list = s.chain.back();
  const int n = holder->GetReflection()->FieldSize(*holder, list);
  for (int i = 0; i < n; ++i) {
    const std::string prefix = s.prefix + "[" + std::to_string(i) + "].";
    if constexpr (std::is_const_v<Message>) {
      fn(&holder->GetReflection()->GetRepeatedMessage(*holder, list, i), prefix);
    } else {
      fn(holder->GetReflection()->MutableRepeatedMessage(holder, list, i), prefix);
    }
  }
}

void copyField(const pb::Message& from, pb::Message& to, const pb::FieldDescriptor* f) {
  const pb::Reflection* r = from.GetReflection();
  pb::Reflection const* w = to.GetReflection();
  switch (f->cpp_type()) {
    case CppType::CPPTYPE_INT32:
      return w->SetInt32(&to, f, r->GetInt32(from, f));
    case CppType::CPPTYPE_INT64:
      return w->SetInt64(&to, f, r->GetInt64(from, f));
    case CppType::CPPTYPE_UINT32:
      return w->SetUInt32(&to, f, r->GetUInt32(from, f));
    case CppType::CPPTYPE_UINT64:
      return w->SetUInt64(&to, f, r->GetUInt64(from, f));
    case CppType::CPPTYPE_DOUBLE:
      return w->SetDouble(&to, f, r->GetDouble(from, f));
    case CppType::CPPTYPE_FLOAT:
      return w->SetFloat(&to, f, r->GetFloat(from, f));
    case CppType::CPPTYPE_BOOL:
      return w->SetBool(&to, f, r->GetBool(from, f));
    case CppType::CPPTYPE_ENUM:
      return w->SetEnumValue(&to, f, r->GetEnumValue(from, f));
    case CppType::CPPTYPE_STRING:
      return w->SetString(&to, f, r->GetString(from, f));
    default:
      return;
  }
}

void checkOne(Checks& c, const Experiment& e, const BoundSection& s) {
  if (!s.section->when.holds(e)) return;
  // An absent section is checked as its defaults read (all of them unset): a field without a default is checked at
  // its zero value, as the accessors of a missing message give it.
  const pb::Message* holder = find(e, s);
  if (holder == nullptr && !s.repeated) holder = s.empty;
  forEach(holder, s, [&](const pb::Message* m, const std::string& prefix) {
    for (const Bound& b : s.fields) {
      const Field& entry = *b.entry;
      if (!entry.check_when.holds(e)) continue;
      if (b.field->is_repeated()) {
        const pb::Reflection* r = m->GetReflection();
        const int n = r->FieldSize(*m, b.field);
        if (entry.rule.kind == Kind::kRange && b.field->cpp_type() == CppType::CPPTYPE_INT32) {
          // The lists of counts (hidden_sizes: up to 1,024 entries in each of 10,000 variants) read through one
          // reference, each entry compared with the bounds; only one out of them is looked at again for its message.
          const auto values = r->GetRepeatedFieldRef<int32_t>(*m, b.field);
          const Rule& rule = entry.rule;
          for (int i = 0; i < n; ++i) {
            const int32_t v = values.Get(i);
            if (v < rule.lo || v > rule.hi || (rule.lo_open && v == rule.lo) || (rule.hi_open && v == rule.hi))
              checkValue(c, prefix, *m, b.field, i, entry);
          }
          continue;
        }
        for (int i = 0; i < n; ++i) checkValue(c, prefix, *m, b.field, i, entry);
        continue;
      }
      if (entry.if_set && !m->GetReflection()->HasField(*m, b.field)) continue;
      checkValue(c, prefix, *m, b.field, -1, entry);
    }
  });
}

std::string defaultText(const pb::FieldDescriptor* f, const Default& d) {
  switch (d.kind) {
    case Default::Kind::kValue:
    case Default::Kind::kUnfilled: {
      std::string v = textValue(f, d.text);
      if (f->cpp_type() == CppType::CPPTYPE_STRING && d.text.empty()) v = "\"\"";
      return "`" + v + "`" + (d.kind == Default::Kind::kUnfilled ? " (left unset)" : "");
    }
    case Default::Kind::kComputed:
    case Default::Kind::kNone:
      return std::string(d.text);
  }
  return {};
}

std::string ruleText(const pb::FieldDescriptor* f, const Rule& r) {
  switch (r.kind) {
    case Kind::kFree:
      return std::string(r.doc);
    case Kind::kRange:
      return rangeText(f, r) + (r.finite && !(r.lo != -Rule::kNoBound && r.hi != Rule::kNoBound) ? ", finite" : "");
    case Kind::kEnum:
      return enumChoices(f->enum_type());
    case Kind::kOneOf:
      return choiceList(f, r.choices);
    case Kind::kDuration: {
      std::ostringstream os;
      os << "a duration (\"500ms\", \"30s\")" << (r.positive ? ", > 0" : "") << ", at most " << r.max_s << " s";
      return os.str();
    }
    case Kind::kBandwidth:
      return "\"unlimited\" or a rate in [" + comm::formatBandwidth(limits::kMinBandwidthBps) + ", " +
             comm::formatBandwidth(limits::kMaxBandwidthBps) + "] (\"10Gbps\", \"100Mbps\"; bytes: \"25GB/s\")";
    case Kind::kNonEmpty:
      return "not empty";
    case Kind::kFolderName:
      return "a folder name: [A-Za-z0-9._-], not \".\" or \"..\"";
    case Kind::kCustom:
      return std::string(r.doc);
  }
  return {};
}

// A Markdown table cell: pipes escaped, so a rule like "a | b" does not split the row.
std::string cell(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

std::vector<std::string> checkTables(std::span<const Section> tables) {
  std::vector<std::string> problems;
  bind(tables, problems);
  return problems;
}

void fillDefaults(Experiment& e) {
  for (const BoundSection& s : tables()) {
    if (!s.section->when.holds(e)) continue;
    auto fill = [&](pb::Message* m) {
      const pb::Reflection* r = m->GetReflection();
      for (const Bound& b : s.fields) {
        const Default& d = b.entry->def;
        if (d.kind != Default::Kind::kValue && d.kind != Default::Kind::kComputed) continue;
        if (r->HasField(*m, b.field) || !d.when.holds(e)) continue;
        if (d.kind == Default::Kind::kValue) {
          copyField(*s.prototype, *m, b.field);
        } else {
          const std::string text = d.compute(e);
          TERSE_CHECK(parseInto(*m, b.field, text), InternalError,
                      "computed default '" << text << "' of " << s.section->path << "." << b.entry->name
                                           << " is not a value of its type");
        }
      }
    };
    if (s.repeated) {
      forEach(find(e, s) == nullptr ? nullptr : mutableAt(e, s), s,
              [&](pb::Message* m, const std::string&) { fill(m); });
      continue;
    }
    // Created only when one of its fields gets a default: a section nobody set and without defaults stays absent.
    const pb::Message* present = find(e, s);
    bool needed = false;
    for (const Bound& b : s.fields) {
      const Default& d = b.entry->def;
      if ((d.kind == Default::Kind::kValue || d.kind == Default::Kind::kComputed) && d.when.holds(e) &&
          (present == nullptr || !present->GetReflection()->HasField(*present, b.field)))
        needed = true;
    }
    if (needed) fill(mutableAt(e, s));
  }
}

void checkFields(Checks& c, const Experiment& e) {
  for (const BoundSection& s : tables()) checkOne(c, e, s);
}

void checkSection(Checks& c, const Experiment& e, std::string_view path) {
  for (const BoundSection& s : tables())
    if (s.section->path == path) checkOne(c, e, s);
}

std::string reference() {
  std::ostringstream os;
  os << "Each section is one message of [`experiment.proto`](../config/experiment.proto); a default marked \"left "
        "unset\" is what the runtime reads when the field is absent, and is not written into the resolved config. "
        "Checks across fields are listed after the sections.\n";
  for (const BoundSection& s : tables()) {
    const Section& sec = *s.section;
    os << "\n### " << (sec.path.empty() ? "Experiment" : "`" + std::string(sec.path) + "`") << "\n\n";
    if (!sec.doc.empty() || !sec.when.doc.empty()) {
      os << sec.doc;
      if (!sec.when.doc.empty()) os << (sec.doc.empty() ? "" : " ") << "Applies with " << sec.when.doc << ".";
      os << "\n\n";
    }
    os << "| field | default | accepts | meaning |\n|---|---|---|---|\n";
    for (const Bound& b : s.fields) {
      const Field& f = *b.entry;
      std::string name = std::string(f.name) + (b.field->is_repeated() ? "[]" : "");
      std::string accepts = ruleText(b.field, f.rule);
      if (b.field->is_repeated() && f.rule.kind != Kind::kFree) accepts = "each " + accepts;
      std::vector<std::string> when;
      if (f.if_set) when.push_back("when set");
      if (!f.check_when.doc.empty()) when.push_back("with " + std::string(f.check_when.doc));
      for (std::size_t i = 0; i < when.size(); ++i) accepts += (i == 0 ? " (" : ", ") + when[i];
      if (!when.empty()) accepts += ")";
      std::string def = defaultText(b.field, f.def);
      if (!f.def.when.doc.empty()) def += " with " + std::string(f.def.when.doc);
      os << "| `" << name << "` | " << cell(def) << " | " << cell(accepts) << " | " << cell(f.doc) << " |\n";
    }
  }
  os << "\n### Checks across fields\n\n| rule | fields | refuses |\n|---|---|---|\n";
  for (const CrossRule& r : rules())
    os << "| `" << r.name << "` | " << cell(r.fields) << " | " << cell(r.doc) << " |\n";
  return os.str();
}

std::string withReference(std::string_view file, const std::string& source) {
  const auto begin = file.find(kReferenceBegin);
  const auto end = file.find(kReferenceEnd);
  TERSE_CHECK(begin != std::string_view::npos && end != std::string_view::npos && begin < end, InvalidArgument,
              source << ": no generated field reference to replace: it needs the line\n  "
                     << kReferenceBegin.substr(0, kReferenceBegin.size() - 1) << "\nthen, on a later line,\n  "
                     << kReferenceEnd.substr(0, kReferenceEnd.size() - 1));
  std::string out(file.substr(0, begin + kReferenceBegin.size()));
  out += reference();
  out += file.substr(end);
  return out;
}

}  // namespace table
}  // namespace terse::experiments
