// terse plugin SDK: the plugin's key/value parameters with typed, validated getters.
//
// Every getter takes the value to use when the key is absent (returned as is: a default outside the range can be a
// deliberate sentinel such as "0 = whole tensor"), parses the whole string (no trailing junk, no leading blanks, no
// silent wrap-around), checks the range, and throws sdk::InvalidArgument with a message that names the plugin, the key,
// what was expected and what was given:
//   topk: 'ratio' must be in (0, 1], got 2
//   topk: 'ratio' must be a number, got 'abc'
//   qsgd: 'levels' must be an integer >= 1, got 0
//   x: 'mode' must be one of {a, b}, got 'c'
//   topk: unknown parameter 'ration' (known: ratio)        <- finish(), for keys no getter asked for
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "terse/build_info_v1.h"
#include "terse/sdk/error.hpp"
#include "terse/types_v1.h"

namespace terse::sdk {

// Shortest text that reads back as the same double: 2, 0.5, 1e-06, 0.1 (not 2.000000 or 0.10000000000000001).
inline std::string formatNumber(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc()) return std::to_string(v);
  return std::string(buf, end);
}

// An interval for numeric parameters. Bounds are long double so that every int64 and uint64 bound compares exactly.
class Range {
 public:
  static Range any() { return Range(End::kNone, 0, 0, End::kNone); }
  static Range closed(long double lo, long double hi) { return Range(End::kClosed, lo, hi, End::kClosed); }
  static Range open(long double lo, long double hi) { return Range(End::kOpen, lo, hi, End::kOpen); }
  static Range openClosed(long double lo, long double hi) { return Range(End::kOpen, lo, hi, End::kClosed); }
  static Range closedOpen(long double lo, long double hi) { return Range(End::kClosed, lo, hi, End::kOpen); }
  static Range atLeast(long double lo) { return Range(End::kClosed, lo, 0, End::kNone); }
  static Range greaterThan(long double lo) { return Range(End::kOpen, lo, 0, End::kNone); }
  static Range atMost(long double hi) { return Range(End::kNone, 0, hi, End::kClosed); }
  static Range lessThan(long double hi) { return Range(End::kNone, 0, hi, End::kOpen); }

  bool contains(long double v) const noexcept {
    if (lo_end_ == End::kClosed && !(v >= lo_)) return false;
    if (lo_end_ == End::kOpen && !(v > lo_)) return false;
    if (hi_end_ == End::kClosed && !(v <= hi_)) return false;
    if (hi_end_ == End::kOpen && !(v < hi_)) return false;
    return true;
  }

  // "in (0, 1]", ">= 1", "> 0", "<= 8", "< 8"; "" for any().
  std::string describe() const {
    if (lo_end_ != End::kNone && hi_end_ != End::kNone) {
      return std::string("in ") + (lo_end_ == End::kOpen ? "(" : "[") + formatBound(lo_) + ", " + formatBound(hi_) +
             (hi_end_ == End::kOpen ? ")" : "]");
    }
    if (lo_end_ != End::kNone) return (lo_end_ == End::kOpen ? "> " : ">= ") + formatBound(lo_);
    if (hi_end_ != End::kNone) return (hi_end_ == End::kOpen ? "< " : "<= ") + formatBound(hi_);
    return "";
  }

 private:
  enum class End : unsigned char { kNone, kOpen, kClosed };
  Range(End lo_end, long double lo, long double hi, End hi_end) : lo_(lo), hi_(hi), lo_end_(lo_end), hi_end_(hi_end) {}

  // Integral bounds print as integers (exactly, even 2^63 - 1), the rest as the double they came from.
  static std::string formatBound(long double v) {
    constexpr long double kTwo63 = 9223372036854775808.0L;
    if (v == std::floor(v) && v >= -kTwo63 && v < kTwo63) return std::to_string(static_cast<long long>(v));
    if (v == std::floor(v) && v >= 0 && v < 2 * kTwo63) return std::to_string(static_cast<unsigned long long>(v));
    return formatNumber(static_cast<double>(v));
  }

  long double lo_, hi_;
  End lo_end_, hi_end_;
};

// The parameters of one init call, copied (the ABI's strings live only during init). Not thread-safe; it is meant to
// be read in the plugin's constructor and dropped.
class Params {
 public:
  // Throws InvalidArgument for a NULL or empty key, a NULL value, or a key given twice.
  Params(std::string plugin, const terse_param_v1* params, size_t count) : plugin_(std::move(plugin)) {
    if (params == nullptr && count > 0) fail("parameter list is NULL but holds " + std::to_string(count) + " entries");
    entries_.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      const terse_param_v1& p = params[i];
      if (p.key == nullptr || *p.key == '\0') fail("parameter #" + std::to_string(i) + " has no key");
      if (p.value == nullptr) fail("parameter '" + std::string(p.key) + "' has a NULL value");
      for (const Entry& e : entries_) {
        if (e.key == p.key) {
          fail("parameter '" + e.key + "' is given twice ('" + e.value + "' and '" + std::string(p.value) + "')");
        }
      }
      entries_.push_back(Entry{p.key, p.value, false});
    }
  }

  const std::string& plugin() const noexcept { return plugin_; }

  // Whether the key was given. Counts as reading it: a plugin that asks has() has considered the key.
  bool has(std::string_view key) { return find(key) != nullptr; }

  double getDouble(std::string_view key, double def, const Range& range = Range::any()) {
    const Entry* e = find(key);
    if (e == nullptr) return resolve(key, def);
    double v = 0;
    const char* first = e->value.data();
    const char* last = first + e->value.size();
    auto [end, ec] = std::from_chars(first, last, v);
    if (ec == std::errc::result_out_of_range && end == last) {
      fail(quoteKey(key) + " must be a number within the range of a double, got '" + e->value + "'");
    }
    if (ec == std::errc() && end == last && !std::isfinite(v)) {
      fail(quoteKey(key) + " must be a finite number, got '" + e->value + "'");
    }
    if (ec != std::errc() || end != last) fail(quoteKey(key) + " must be a number, got '" + e->value + "'");
    if (!range.contains(static_cast<long double>(v))) {
      fail(quoteKey(key) + " must be " + range.describe() + ", got " + formatNumber(v));
    }
    return resolve(key, v);
  }

  int64_t getInt(std::string_view key, int64_t def, const Range& range = Range::any()) {
    const Entry* e = find(key);
    if (e == nullptr) return resolve(key, def);
    int64_t v = 0;
    const char* first = e->value.data();
    const char* last = first + e->value.size();
    auto [end, ec] = std::from_chars(first, last, v, 10);
    if (ec == std::errc::result_out_of_range && end == last) {
      fail(quoteKey(key) + " must be an integer in [" + std::to_string(std::numeric_limits<int64_t>::min()) + ", " +
           std::to_string(std::numeric_limits<int64_t>::max()) + "], got '" + e->value + "'");
    }
    if (ec != std::errc() || end != last) fail(quoteKey(key) + " must be an integer, got '" + e->value + "'");
    if (!range.contains(static_cast<long double>(v))) {
      fail(quoteKey(key) + " must be an integer " + range.describe() + ", got " + std::to_string(v));
    }
    return resolve(key, v);
  }

  uint64_t getUint(std::string_view key, uint64_t def, const Range& range = Range::any()) {
    const Entry* e = find(key);
    if (e == nullptr) return resolve(key, def);
    uint64_t v = 0;
    const char* first = e->value.data();
    const char* last = first + e->value.size();
    auto [end, ec] = std::from_chars(first, last, v, 10);
    if (ec == std::errc::result_out_of_range && end == last) {
      fail(quoteKey(key) + " must be an integer in [0, " + std::to_string(std::numeric_limits<uint64_t>::max()) +
           "], got '" + e->value + "'");
    }
    if (ec != std::errc() || end != last)
      fail(quoteKey(key) + " must be a non-negative integer, got '" + e->value + "'");
    if (!range.contains(static_cast<long double>(v))) {
      fail(quoteKey(key) + " must be an integer " + range.describe() + ", got " + std::to_string(v));
    }
    return resolve(key, v);
  }

  // true/false, 1/0, yes/no, on/off, in any letter case.
  bool getBool(std::string_view key, bool def) {
    const Entry* e = find(key);
    if (e == nullptr) return resolve(key, def);
    std::string lower;
    for (char c : e->value) lower += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return resolve(key, true);
    if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return resolve(key, false);
    fail(quoteKey(key) + " must be a boolean (true/false, 1/0, yes/no, on/off), got '" + e->value + "'");
  }

  std::string getString(std::string_view key, std::string def) {
    const Entry* e = find(key);
    return resolve(key, e == nullptr ? std::move(def) : e->value);
  }

  // One of `choices`, compared exactly.
  std::string getChoice(std::string_view key, std::string def, std::initializer_list<std::string_view> choices) {
    const Entry* e = find(key);
    if (e == nullptr) return resolve(key, std::move(def));
    for (std::string_view c : choices) {
      if (c == e->value) return resolve(key, e->value);
    }
    std::string list;
    for (std::string_view c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
    fail(quoteKey(key) + " must be one of {" + list + "}, got '" + e->value + "'");
  }

  // Every parameter a getter returned, with the value returned (the config's or the default) as text, in first-read
  // order; a key read twice keeps the last value. What terse_*_resolved_params_v1 reports (resolved_params_v1.h).
  const std::vector<std::pair<std::string, std::string>>& resolved() const noexcept { return resolved_; }

  // Throws InvalidArgument naming every given key that no getter (or has()) asked for: a typo in a config must not
  // silently run the default. The export macros call this after the plugin's constructor.
  void finish() const {
    std::vector<const Entry*> unknown;
    for (const Entry& e : entries_) {
      if (!e.read) unknown.push_back(&e);
    }
    if (unknown.empty()) return;
    std::string names;
    for (const Entry* e : unknown) names += (names.empty() ? "'" : ", '") + e->key + "'";
    std::string known;
    for (const std::string& k : known_) known += (known.empty() ? "" : ", ") + k;
    fail(std::string(unknown.size() == 1 ? "unknown parameter " : "unknown parameters ") + names +
         " (known: " + (known.empty() ? "none" : known) + ")");
  }

 private:
  struct Entry {
    std::string key;
    std::string value;
    bool read;
  };

  // Records the key as known (for finish()'s list) and returns its entry, marked read, or nullptr.
  Entry* find(std::string_view key) {
    bool seen = false;
    for (const std::string& k : known_) seen = seen || k == key;
    if (!seen) known_.emplace_back(key);
    for (Entry& e : entries_) {
      if (e.key == key) {
        e.read = true;
        return &e;
      }
    }
    return nullptr;
  }

  template <class T>
  T resolve(std::string_view key, T value) {
    std::string text;
    if constexpr (std::is_same_v<T, bool>) {
      text = value ? "true" : "false";
    } else if constexpr (std::is_same_v<T, double>) {
      text = formatNumber(value);  // shortest text that parses back to the same double
    } else if constexpr (std::is_integral_v<T>) {
      text = std::to_string(value);
    } else {
      text = value;
    }
    for (auto& [k, v] : resolved_) {
      if (k == key) {
        v = std::move(text);
        return value;
      }
    }
    resolved_.emplace_back(std::string(key), std::move(text));
    return value;
  }

  static std::string quoteKey(std::string_view key) { return "'" + std::string(key) + "'"; }

  [[noreturn]] void fail(const std::string& what) const { throw InvalidArgument(plugin_ + ": " + what); }

  std::string plugin_;
  std::vector<Entry> entries_;
  std::vector<std::string> known_;
  std::vector<std::pair<std::string, std::string>> resolved_;
};

namespace detail {

// An instance's resolved parameters as the C table terse_*_resolved_params_v1 hands out; lives in the export
// macros' per-instance context, so the pointers stay valid until finalize.
class ResolvedParams {
 public:
  void set(std::vector<std::pair<std::string, std::string>> kv) {
    kv_ = std::move(kv);
    table_.clear();
    for (const auto& [k, v] : kv_) table_.push_back(terse_param_v1{k.c_str(), v.c_str()});
  }
  terse_status_v1 report(const terse_param_v1** params, size_t* num_params) const noexcept {
    if (params == nullptr || num_params == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
    *params = table_.data();
    *num_params = table_.size();
    return TERSE_OK;
  }

 private:
  std::vector<std::pair<std::string, std::string>> kv_;
  std::vector<terse_param_v1> table_;
};

// terse_*_resolved_params_v1 for an adapter whose ctx is a Context with a `resolved` member.
template <class Context>
terse_status_v1 reportResolvedParams(void* ctx, const terse_param_v1** params, size_t* num_params) noexcept {
  if (ctx == nullptr) return TERSE_ERR_INVALID_ARGUMENT;
  return static_cast<const Context*>(ctx)->resolved.report(params, num_params);
}

}  // namespace detail

}  // namespace terse::sdk

// The export macros' definition of terse_<kind>_resolved_params_v1 (symbol_) for the adapter context Context_.
#define TERSE_SDK_DETAIL_EXPORT_RESOLVED_PARAMS(symbol_, Context_)                         \
  TERSE_PLUGIN_V1_EXPORT terse_status_v1 symbol_(void* ctx, const terse_param_v1** params, \
                                                 size_t* num_params) noexcept {            \
    return ::terse::sdk::detail::reportResolvedParams<Context_>(ctx, params, num_params);  \
  }

// The export macros' definition of terse_<kind>_build_info_v1 (symbol_). It is expanded in the plugin's own translation
// unit, which alone knows how the plugin was compiled (__OPTIMIZE__, read by terse/build_info_v1.h).
#define TERSE_SDK_DETAIL_EXPORT_BUILD_INFO(symbol_) \
  TERSE_PLUGIN_V1_EXPORT constinit const terse_build_info_v1 symbol_ = TERSE_BUILD_INFO_V1_INIT;

// The body of TERSE_EXPORT_COMPRESSOR and TERSE_EXPORT_SCHEDULER, one plugin kind apart: Kind_ names the adapter
// (::terse::sdk::detail::<Kind_>Adapter) and kind_ the C symbols (terse_<kind_>_plugin_v1 of type terse_<kind_>_v1,
// terse_<kind_>_resolved_params_v1, terse_<kind_>_build_info_v1, and what TERSE_SDK_DETAIL_EXPORT_KIND_<Kind_> adds
// for the kind); macro_ is the public macro's name for the static_assert's message.
#define TERSE_SDK_DETAIL_EXPORT_PLUGIN(macro_, Kind_, kind_, Class_, name_, description_, version_)                \
  static_assert(::terse::sdk::detail::isValidPluginName(name_), macro_ ": the plugin name must match [a-z0-9_]+"); \
  namespace {                                                                                                      \
  struct Terse##Kind_##Export {                                                                                    \
    using Type = Class_;                                                                                           \
    static constexpr const char* kName = name_;                                                                    \
    static constexpr const char* kDescription = description_;                                                      \
    static constexpr const char* kVersion = version_;                                                              \
  };                                                                                                               \
  }                                                                                                                \
  TERSE_SDK_DETAIL_EXPORT_RESOLVED_PARAMS(terse_##kind_##_resolved_params_v1,                                      \
                                          ::terse::sdk::detail::Kind_##Adapter<Terse##Kind_##Export>::Context)     \
  TERSE_SDK_DETAIL_EXPORT_BUILD_INFO(terse_##kind_##_build_info_v1)                                                \
  TERSE_SDK_DETAIL_EXPORT_KIND_##Kind_(Terse##Kind_##Export)                                                       \
      TERSE_PLUGIN_V1_EXPORT constinit const terse_##kind_##_v1 terse_##kind_##_plugin_v1 =                        \
          ::terse::sdk::detail::Kind_##Adapter<Terse##Kind_##Export>::table()
