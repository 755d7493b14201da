#include "core/common/json.h"

#include <cmath>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <vector>

namespace terse {

namespace {

// Thrown from the parser callback to stop a parse; nlohmann lets it through unchanged.
struct Rejected : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// nlohmann's messages start with "[json.exception.parse_error.101] "; the id means nothing to a user.
std::string withoutExceptionId(const char* what) {
  const std::string_view s(what);
  const auto close = s.find("] ");
  return std::string(s.starts_with("[json.exception.") && close != std::string_view::npos ? s.substr(close + 2) : s);
}

// A double with an integer value as that integer: nlohmann writes 2.0 where terse's files (written with %.17g before
// nlohmann) have 2, and scripts and tests compare such fields as text (workers_live, byte counts). Exact up to 2^53;
// -0.0 stays a double, to keep its sign.
Json integralAsInteger(const Json& value) {
  if (value.is_number_float()) {
    const double x = value.get<double>();
    constexpr double kExact = 9007199254740992.0;  // 2^53
    if (std::trunc(x) == x && std::fabs(x) <= kExact && !(x == 0 && std::signbit(x)))
      return Json(static_cast<int64_t>(x));
    return value;
  }
  if (value.is_object()) {
    Json out = Json::object();
    for (const auto& [k, v] : value.items()) out[k] = integralAsInteger(v);
    return out;
  }
  if (value.is_array()) {
    Json out = Json::array();
    for (const auto& v : value) out.push_back(integralAsInteger(v));
    return out;
  }
  return value;
}

}  // namespace

std::string dumpJson(const Json& value, int indent) {
  return integralAsInteger(value).dump(indent, ' ', false, Json::error_handler_t::replace);
}

std::optional<Json> parseJson(std::string_view text, std::string* error) {
  // The keys seen so far in each open object, innermost last: a key event always belongs to the innermost one.
  std::vector<std::set<std::string, std::less<>>> keys;
  const Json::parser_callback_t check = [&](int depth, nlohmann::json::parse_event_t event, Json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    // `depth` counts the containers around the one starting, so the top-level value starts at 0.
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth)
      throw Rejected("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end) keys.pop_back();
    if (event == Event::key && !keys.back().insert(parsed.get<std::string>()).second)
      throw Rejected("duplicate key \"" + parsed.get<std::string>() + "\" in one object");
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::parse_error& e) {
    if (error != nullptr) *error = withoutExceptionId(e.what());
  } catch (const Json::out_of_range& e) {
    // A number too large for a double (1e999) is well-formed JSON that nlohmann refuses with out_of_range, not
    // parse_error: still the file's fault, so the same nullopt, never an exception out of a reader.
    if (error != nullptr) *error = withoutExceptionId(e.what());
  } catch (const Rejected& e) {
    if (error != nullptr) *error = e.what();
  }
  return std::nullopt;
}

std::optional<Json> parseJsonObject(std::string_view text, std::string* error) {
  auto value = parseJson(text, error);
  if (value && !value->is_object()) {
    if (error != nullptr) *error = std::string("a JSON ") + value->type_name() + ", not an object";
    return std::nullopt;
  }
  return value;
}

const Json* findMember(const Json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

std::optional<double> getNumber(const Json& object, std::string_view key) {
  const Json* v = findMember(object, key);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  return v->get<double>();
}

std::optional<std::string> getString(const Json& object, std::string_view key) {
  const Json* v = findMember(object, key);
  if (v == nullptr || !v->is_string()) return std::nullopt;
  return v->get<std::string>();
}

}  // namespace terse
