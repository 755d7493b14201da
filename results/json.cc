#include "results/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace terse::results {

void JsonObject::key(std::string_view k) {
  if (body_.size() > 1) body_ += ',';
  appendJsonString(body_, k);
  body_ += ':';
}

JsonObject& JsonObject::add(std::string_view k, std::string_view value) {
  key(k);
  appendJsonString(body_, value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, double value) {
  key(k);
  if (!std::isfinite(value)) {
    body_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", value);
    body_ += buf;
  }
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, uint64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::raw(std::string_view k, std::string_view json) {
  key(k);
  body_ += json;
  return *this;
}

namespace {

struct Reader {
  std::string_view s;
  std::size_t i = 0;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool literal(std::string_view word) {
    if (s.substr(i, word.size()) != word) return false;
    i += word.size();
    return true;
  }
  static int hexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  std::optional<std::string> string() {
    if (!eat('"')) return std::nullopt;
    std::string out;
    while (i < s.size()) {
      const char c = s[i++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) return std::nullopt;
      const char e = s[i++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (i + 4 > s.size()) return std::nullopt;
          unsigned cp = 0;
          for (int k = 0; k < 4; ++k) {
            const int d = hexDigit(s[i++]);
            if (d < 0) return std::nullopt;
            cp = cp * 16 + static_cast<unsigned>(d);
          }
          // Enough for what we write (control characters); other code points are stored as UTF-8.
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:
          return std::nullopt;
      }
    }
    return std::nullopt;
  }
  std::optional<JsonValue> value() {
    ws();
    if (i >= s.size()) return std::nullopt;
    if (s[i] == '"') {
      auto str = string();
      if (!str) return std::nullopt;
      return JsonValue(std::move(*str));
    }
    if (literal("null")) return JsonValue(nullptr);
    if (literal("true")) return JsonValue(true);
    if (literal("false")) return JsonValue(false);
    const std::string rest(s.substr(i, std::min<std::size_t>(64, s.size() - i)));
    char* end = nullptr;
    const double d = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) return std::nullopt;
    i += static_cast<std::size_t>(end - rest.c_str());
    return JsonValue(d);
  }
};

// JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? (strtod alone would take nan, inf, hex).
bool jsonNumber(Reader& r, double& out) {
  const std::string_view s = r.s;
  std::size_t j = r.i;
  auto digits = [&] {
    const std::size_t from = j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    return j > from;
  };
  if (j < s.size() && s[j] == '-') ++j;
  if (j < s.size() && s[j] == '0')
    ++j;
  else if (!digits())
    return false;
  if (j < s.size() && s[j] == '.') {
    ++j;
    if (!digits()) return false;
  }
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    ++j;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    if (!digits()) return false;
  }
  const std::string text(s.substr(r.i, j - r.i));
  out = std::strtod(text.c_str(), nullptr);
  r.i = j;
  return true;
}

constexpr int kMaxJsonDepth = 64;

bool parseValue(Reader& r, Json& out, int depth, std::string& error) {
  if (depth > kMaxJsonDepth) {
    error = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return false;
  }
  r.ws();
  if (r.i >= r.s.size()) {
    error = "unexpected end of text";
    return false;
  }
  const char c = r.s[r.i];
  if (c == '{') {
    ++r.i;
    out.kind = Json::Kind::kObject;
    if (r.eat('}')) return true;
    for (;;) {
      r.ws();
      auto key = r.string();
      if (!key) {
        error = "expected a string key";
        return false;
      }
      if (!r.eat(':')) {
        error = "expected ':'";
        return false;
      }
      Json v;
      if (!parseValue(r, v, depth + 1, error)) return false;
      out.object.emplace_back(std::move(*key), std::move(v));
      if (r.eat(',')) continue;
      if (r.eat('}')) return true;
      error = "expected ',' or '}'";
      return false;
    }
  }
  if (c == '[') {
    ++r.i;
    out.kind = Json::Kind::kArray;
    if (r.eat(']')) return true;
    for (;;) {
      Json v;
      if (!parseValue(r, v, depth + 1, error)) return false;
      out.array.push_back(std::move(v));
      if (r.eat(',')) continue;
      if (r.eat(']')) return true;
      error = "expected ',' or ']'";
      return false;
    }
  }
  if (c == '"') {
    auto s = r.string();
    if (!s) {
      error = "malformed string";
      return false;
    }
    out.kind = Json::Kind::kString;
    out.string = std::move(*s);
    return true;
  }
  if (r.literal("null")) {
    out.kind = Json::Kind::kNull;
    return true;
  }
  if (r.literal("true")) {
    out.kind = Json::Kind::kBool;
    out.boolean = true;
    return true;
  }
  if (r.literal("false")) {
    out.kind = Json::Kind::kBool;
    return true;
  }
  if (jsonNumber(r, out.number)) {
    out.kind = Json::Kind::kNumber;
    return true;
  }
  error = "unexpected character";
  return false;
}

}  // namespace

const Json* Json::find(std::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& [k, v] : object)
    if (k == key) return &v;
  return nullptr;
}

std::string Json::str(std::string_view key, std::string_view fallback) const {
  const Json* v = find(key);
  return v != nullptr && v->kind == Kind::kString ? v->string : std::string(fallback);
}

std::optional<double> Json::num(std::string_view key) const {
  const Json* v = find(key);
  if (v == nullptr || v->kind != Kind::kNumber) return std::nullopt;
  return v->number;
}

std::optional<Json> parseJson(std::string_view text, std::string* error) {
  Reader r{text};
  Json out;
  std::string why;
  if (parseValue(r, out, 0, why)) {
    r.ws();
    if (r.i == text.size()) return out;
    why = "unexpected text after the value";
  }
  if (error != nullptr) *error = why + " at byte " + std::to_string(r.i);
  return std::nullopt;
}

std::optional<FlatJson> parseFlatJson(std::string_view text) {
  Reader r{text};
  FlatJson out;
  if (!r.eat('{')) return std::nullopt;
  if (!r.eat('}')) {
    for (;;) {
      auto k = r.string();
      if (!k || !r.eat(':')) return std::nullopt;
      auto v = r.value();
      if (!v) return std::nullopt;
      out[*k] = std::move(*v);
      if (r.eat(',')) continue;
      if (r.eat('}')) break;
      return std::nullopt;
    }
  }
  r.ws();
  if (r.i != text.size()) return std::nullopt;
  return out;
}

std::optional<double> getNumber(const FlatJson& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || !std::holds_alternative<double>(it->second)) return std::nullopt;
  return std::get<double>(it->second);
}

std::optional<std::string> getString(const FlatJson& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || !std::holds_alternative<std::string>(it->second)) return std::nullopt;
  return std::get<std::string>(it->second);
}

}  // namespace terse::results
