// The little JSON the results folder needs: one-line objects written by a tiny escaping writer, and a reader for the
// flat objects we write (metrics.jsonl records, status.json) so tools and tests can read results back without a JSON
// library. Numbers are written with 17 significant digits (doubles round-trip exactly); non-finite numbers, which JSON
// cannot spell, become null.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/common/json_string.h"

namespace terse::results {

using terse::appendJsonString;  // core/common/json_string.h

// Builds one JSON object; nested objects go in with raw().
class JsonObject {
 public:
  JsonObject& add(std::string_view key, std::string_view value);
  JsonObject& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  JsonObject& add(std::string_view key, const std::string& value) { return add(key, std::string_view(value)); }
  JsonObject& add(std::string_view key, double value);
  JsonObject& add(std::string_view key, int64_t value);
  JsonObject& add(std::string_view key, uint64_t value);
  JsonObject& add(std::string_view key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonObject& add(std::string_view key, bool value);
  // `json` must already be valid JSON (an object or array built elsewhere).
  JsonObject& raw(std::string_view key, std::string_view json);
  // "{...}" on one line.
  std::string str() const { return body_ + "}"; }

 private:
  void key(std::string_view k);
  std::string body_ = "{";
};

// A value of a flat object: null, bool, number or string.
using JsonValue = std::variant<std::nullptr_t, bool, double, std::string>;
using FlatJson = std::map<std::string, JsonValue, std::less<>>;

// Parses one object whose values are scalars (no nested objects or arrays). Returns nullopt for anything else or
// malformed text (a torn last line of a killed run's metrics.jsonl, say).
std::optional<FlatJson> parseFlatJson(std::string_view text);

// Convenience getters; nullopt when absent or of another type.
std::optional<double> getNumber(const FlatJson& obj, std::string_view key);
std::optional<std::string> getString(const FlatJson& obj, std::string_view key);

// A JSON document of any shape: provenance.json nests objects and arrays, and `terse compare --format json` writes
// them. Objects keep their members in file order (a duplicate key keeps the first: find() returns it).
struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  // The member named `key` of an object; nullptr when absent or this is not an object.
  const Json* find(std::string_view key) const;
  // The string member `key`, or `fallback` when absent or not a string.
  std::string str(std::string_view key, std::string_view fallback = "") const;
  // The number member `key`; nullopt when absent or not a number.
  std::optional<double> num(std::string_view key) const;
};

// Parses a whole JSON text (one value, optional surrounding white space). Result files are untrusted input: nesting
// deeper than 64 levels, a non-JSON number (nan, inf, hex) or trailing text is an error. On failure returns nullopt
// and, when `error` is given, sets it to what went wrong and the byte offset.
std::optional<Json> parseJson(std::string_view text, std::string* error = nullptr);

}  // namespace terse::results
