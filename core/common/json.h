// JSON for every file terse writes or reads back (the results folder, trace timelines, `terse compare --format json`)
// through nlohmann-json, with the limits untrusted result files need. DESIGN.md section 7 lists the files.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace terse {

// Objects keep their members in insertion order, so a file reads in the order its writer chose and `terse compare`
// shows provenance's parameters as the run recorded them.
using Json = nlohmann::ordered_json;

// Nesting limit of parseJson. Our deepest file (compare's JSON) nests 6 levels; the bound keeps a hostile file's
// cost and the recursion of later walks over the document (dump, compare) small.
inline constexpr int kMaxJsonDepth = 64;

// `value` as JSON text: one line when indent < 0, else pretty-printed with `indent` spaces. Doubles are written with
// the shortest digits that read back to the same bits (nlohmann's Grisu2); non-finite doubles, which JSON cannot
// spell, become null; bytes that are not UTF-8 (a plugin's name, an error message) become U+FFFD instead of throwing.
// A double with an integer value up to 2^53 is written as that integer (2, not 2.0), as the files written before
// nlohmann spelled it.
std::string dumpJson(const Json& value, int indent = -1);

// Parses one whole JSON text (surrounding white space allowed). Result files are untrusted input, so these are
// errors: nesting deeper than kMaxJsonDepth, a key repeated within one object (RFC 8259 leaves its meaning open; our
// writers never repeat one, so a repeat means an edited or corrupt file), non-JSON numbers (nan, inf, hex, 01),
// comments and trailing text. On failure returns nullopt and, when `error` is given, sets it to what went wrong and
// where (line and column); callers prefix the file's name.
std::optional<Json> parseJson(std::string_view text, std::string* error = nullptr);

// parseJson, and the value must be an object (a metrics.jsonl record, status.json, a trace line).
std::optional<Json> parseJsonObject(std::string_view text, std::string* error = nullptr);

// Member access for documents of unknown shape: nullptr / nullopt when `object` is not an object, the member is
// absent, or it has another type. Integers and floats are both numbers.
const Json* findMember(const Json& object, std::string_view key);
std::optional<double> getNumber(const Json& object, std::string_view key);
std::optional<std::string> getString(const Json& object, std::string_view key);

}  // namespace terse
