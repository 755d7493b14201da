// sdk::Params and sdk::Range: typed getters, whole-string parsing, ranges with every kind of end, and the exact
// message texts researchers see when a config is wrong.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "terse/sdk.hpp"

namespace terse::sdk {
namespace {

// Owns the strings a terse_param_v1 array points into.
class ParamList {
 public:
  ParamList(std::initializer_list<std::pair<std::string, std::string>> kv) : kv_(kv) {
    for (const auto& [k, v] : kv_) raw_.push_back(terse_param_v1{k.c_str(), v.c_str()});
  }
  Params make(const std::string& plugin = "topk") const { return Params(plugin, raw_.data(), raw_.size()); }

 private:
  std::vector<std::pair<std::string, std::string>> kv_;
  std::vector<terse_param_v1> raw_;
};

// The message of the InvalidArgument `f` throws ("" and a failure if it throws nothing).
template <class F>
std::string invalidArgument(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.status(), TERSE_ERR_INVALID_ARGUMENT);
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgument thrown";
  return "";
}

// The message getDouble("k", ...) throws for value `v` under `range`.
std::string doubleError(const std::string& v, const Range& range = Range::any()) {
  ParamList l{{"k", v}};
  Params p = l.make("x");
  return invalidArgument([&] { p.getDouble("k", 0, range); });
}
std::string intError(const std::string& v, const Range& range = Range::any()) {
  ParamList l{{"k", v}};
  Params p = l.make("x");
  return invalidArgument([&] { p.getInt("k", 0, range); });
}
std::string uintError(const std::string& v, const Range& range = Range::any()) {
  ParamList l{{"k", v}};
  Params p = l.make("x");
  return invalidArgument([&] { p.getUint("k", 0, range); });
}

TEST(SdkParams, AbsentKeysGiveTheDefaultsUnchecked) {
  ParamList l{};
  Params p = l.make();
  EXPECT_EQ(p.getDouble("ratio", 0.01, Range::openClosed(0, 1)), 0.01);
  // A default outside the range is the author's sentinel, returned as is.
  EXPECT_EQ(p.getInt("levels", -1, Range::atLeast(1)), -1);
  EXPECT_EQ(p.getUint("chunk", 0, Range::atLeast(1)), 0u);
  EXPECT_TRUE(p.getBool("flag", true));
  EXPECT_EQ(p.getString("name", "dflt"), "dflt");
  EXPECT_EQ(p.getChoice("mode", "a", {"a", "b"}), "a");
  EXPECT_FALSE(p.has("ratio"));
  EXPECT_NO_THROW(p.finish());
  EXPECT_EQ(p.plugin(), "topk");
}

// What terse_*_resolved_params_v1 reports: every key a getter returned, the config's values as parsed and the
// defaults, in first-read order; a key read twice keeps its last value.
TEST(Params, RecordsEveryResolvedValueDefaultsIncluded) {
  ParamList l{{"ratio", "0.25"}, {"flag", "off"}, {"mode", "b"}};
  Params p = l.make();
  p.getDouble("ratio", 0.01);
  p.getInt("levels", -1);
  p.getUint("chunk", 18446744073709551615u);
  p.getBool("flag", true);
  p.getString("name", "dflt");
  p.getChoice("mode", "a", {"a", "b"});
  p.getDouble("scale", 0.1);
  p.getDouble("scale", 1.0 / 3);
  EXPECT_FALSE(p.has("absent"));
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"ratio", "0.25"}, {"levels", "-1"}, {"chunk", "18446744073709551615"}, {"flag", "false"},
      {"name", "dflt"},  {"mode", "b"},    {"scale", "0.3333333333333333"}};
  EXPECT_EQ(p.resolved(), expected);
}

TEST(SdkParams, GettersParseGivenValues) {
  ParamList l{{"d", "0.25"}, {"e", "1e-3"},     {"neg", "-2"}, {"i", "-7"},   {"u", "18446744073709551615"},
              {"b", "Yes"},  {"s", "any text"}, {"c", "b"},    {"half", ".5"}};
  Params p = l.make();
  EXPECT_EQ(p.getDouble("d", 0), 0.25);
  EXPECT_EQ(p.getDouble("e", 0), 1e-3);
  EXPECT_EQ(p.getDouble("neg", 0), -2.0);
  EXPECT_EQ(p.getDouble("half", 0), 0.5);
  EXPECT_EQ(p.getInt("i", 0), -7);
  EXPECT_EQ(p.getUint("u", 0), std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(p.getBool("b", false));
  EXPECT_EQ(p.getString("s", ""), "any text");
  EXPECT_EQ(p.getChoice("c", "a", {"a", "b"}), "b");
  EXPECT_NO_THROW(p.finish());
}

TEST(SdkParams, BoolSpellings) {
  for (const char* t : {"true", "1", "yes", "on", "TRUE", "On", "YES"}) {
    ParamList l{{"b", t}};
    Params p = l.make();
    EXPECT_TRUE(p.getBool("b", false)) << t;
  }
  for (const char* f : {"false", "0", "no", "off", "False", "OFF"}) {
    ParamList l{{"b", f}};
    Params p = l.make();
    EXPECT_FALSE(p.getBool("b", true)) << f;
  }
  ParamList l{{"b", "maybe"}};
  Params p = l.make("x");
  EXPECT_EQ(invalidArgument([&] { p.getBool("b", true); }),
            "x: 'b' must be a boolean (true/false, 1/0, yes/no, on/off), got 'maybe'");
  ParamList empty{{"b", ""}};
  Params q = empty.make("x");
  EXPECT_EQ(invalidArgument([&] { q.getBool("b", true); }),
            "x: 'b' must be a boolean (true/false, 1/0, yes/no, on/off), got ''");
}

TEST(SdkParams, DesignDocMessages) {
  ParamList l{{"ratio", "2"}};
  Params p = l.make("topk");
  EXPECT_EQ(invalidArgument([&] { p.getDouble("ratio", 0.1, Range::openClosed(0, 1)); }),
            "topk: 'ratio' must be in (0, 1], got 2");

  ParamList abc{{"ratio", "abc"}};
  Params q = abc.make("topk");
  EXPECT_EQ(invalidArgument([&] { q.getDouble("ratio", 0.1, Range::openClosed(0, 1)); }),
            "topk: 'ratio' must be a number, got 'abc'");

  ParamList lv{{"levels", "0"}};
  Params r = lv.make("qsgd");
  EXPECT_EQ(invalidArgument([&] { r.getInt("levels", 4, Range::atLeast(1)); }),
            "qsgd: 'levels' must be an integer >= 1, got 0");

  ParamList m{{"mode", "c"}};
  Params s = m.make("x");
  EXPECT_EQ(invalidArgument([&] { s.getChoice("mode", "a", {"a", "b"}); }), "x: 'mode' must be one of {a, b}, got 'c'");
}

TEST(SdkParams, EveryKindOfRangeEnd) {
  // Each end accepts its boundary exactly when closed.
  struct Case {
    Range range;
    const char* value;
    bool ok;
    const char* describe;
  };
  const std::vector<Case> cases = {
      {Range::closed(0, 1), "0", true, "in [0, 1]"},
      {Range::closed(0, 1), "1", true, "in [0, 1]"},
      {Range::closed(0, 1), "1.5", false, "in [0, 1]"},
      {Range::open(0, 1), "0", false, "in (0, 1)"},
      {Range::open(0, 1), "1", false, "in (0, 1)"},
      {Range::open(0, 1), "0.5", true, "in (0, 1)"},
      {Range::openClosed(0, 1), "0", false, "in (0, 1]"},
      {Range::openClosed(0, 1), "1", true, "in (0, 1]"},
      {Range::closedOpen(0, 1), "0", true, "in [0, 1)"},
      {Range::closedOpen(0, 1), "1", false, "in [0, 1)"},
      {Range::atLeast(1), "1", true, ">= 1"},
      {Range::atLeast(1), "0.999", false, ">= 1"},
      {Range::greaterThan(0), "0", false, "> 0"},
      {Range::greaterThan(0), "1e-300", true, "> 0"},
      {Range::atMost(8), "8", true, "<= 8"},
      {Range::atMost(8), "8.5", false, "<= 8"},
      {Range::lessThan(8), "8", false, "< 8"},
      {Range::lessThan(8), "-1e300", true, "< 8"},
      {Range::any(), "-1e300", true, ""},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.range.describe(), c.describe);
    ParamList l{{"k", c.value}};
    Params p = l.make("x");
    if (c.ok) {
      EXPECT_NO_THROW(p.getDouble("k", 0, c.range)) << c.describe << " " << c.value;
    } else {
      EXPECT_EQ(invalidArgument([&] { p.getDouble("k", 0, c.range); }),
                std::string("x: 'k' must be ") + c.describe + ", got " + c.value);
    }
  }
}

TEST(SdkParams, NumbersPrintShortestNatural) {
  EXPECT_EQ(formatNumber(2.0), "2");
  EXPECT_EQ(formatNumber(0.5), "0.5");
  EXPECT_EQ(formatNumber(1e-6), "1e-06");
  EXPECT_EQ(formatNumber(0.1), "0.1");
  EXPECT_EQ(formatNumber(-3.25), "-3.25");
  EXPECT_EQ(doubleError("0", Range::atLeast(1e-6)), "x: 'k' must be >= 1e-06, got 0");
  EXPECT_EQ(doubleError("2.000", Range::closed(0.1, 0.5)), "x: 'k' must be in [0.1, 0.5], got 2");
  // Integral bounds print exactly, even where a double would not.
  EXPECT_EQ(Range::atMost(static_cast<long double>(std::numeric_limits<int64_t>::max())).describe(),
            "<= 9223372036854775807");
  EXPECT_EQ(Range::atMost(static_cast<long double>(std::numeric_limits<uint64_t>::max())).describe(),
            "<= 18446744073709551615");
}

TEST(SdkParams, BadNumbersAreRejectedWholeString) {
  for (const char* bad : {"", "abc", "1.5x", " 1", "1 ", "1,5", "+1", "0x10", "5e", "--1"}) {
    EXPECT_EQ(doubleError(bad), std::string("x: 'k' must be a number, got '") + bad + "'") << bad;
  }
  EXPECT_EQ(doubleError("nan"), "x: 'k' must be a finite number, got 'nan'");
  EXPECT_EQ(doubleError("-inf"), "x: 'k' must be a finite number, got '-inf'");
  EXPECT_EQ(doubleError("1e999"), "x: 'k' must be a number within the range of a double, got '1e999'");
  EXPECT_EQ(doubleError("1e999x"), "x: 'k' must be a number, got '1e999x'");
}

TEST(SdkParams, IntegersAreWholeAndInRange) {
  for (const char* bad : {"", "1.5", "1e3", "12abc", " 3", "+3", "0x10", "three"}) {
    EXPECT_EQ(intError(bad), std::string("x: 'k' must be an integer, got '") + bad + "'") << bad;
  }
  EXPECT_EQ(intError("9223372036854775808"),
            "x: 'k' must be an integer in [-9223372036854775808, 9223372036854775807], got '9223372036854775808'");
  EXPECT_EQ(intError("-9223372036854775809"),
            "x: 'k' must be an integer in [-9223372036854775808, 9223372036854775807], got '-9223372036854775809'");
  EXPECT_EQ(intError("9", Range::closed(1, 8)), "x: 'k' must be an integer in [1, 8], got 9");
  EXPECT_EQ(intError("-1", Range::greaterThan(-1)), "x: 'k' must be an integer > -1, got -1");

  ParamList l{{"max", "9223372036854775807"}, {"min", "-9223372036854775808"}};
  Params p = l.make();
  EXPECT_EQ(p.getInt("max", 0, Range::atMost(static_cast<long double>(std::numeric_limits<int64_t>::max()))),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(p.getInt("min", 0), std::numeric_limits<int64_t>::min());
}

TEST(SdkParams, UnsignedIntegers) {
  for (const char* bad : {"-1", "-0", "", "1.0", "abc", "+1"}) {
    EXPECT_EQ(uintError(bad), std::string("x: 'k' must be a non-negative integer, got '") + bad + "'") << bad;
  }
  EXPECT_EQ(uintError("18446744073709551616"),
            "x: 'k' must be an integer in [0, 18446744073709551615], got '18446744073709551616'");
  EXPECT_EQ(uintError("0", Range::atLeast(1)), "x: 'k' must be an integer >= 1, got 0");
  // Bounds near 2^64 compare exactly: a double would round 2^64 - 1 up to 2^64.
  EXPECT_EQ(uintError("18446744073709551615",
                      Range::lessThan(static_cast<long double>(std::numeric_limits<uint64_t>::max()))),
            "x: 'k' must be an integer < 18446744073709551615, got 18446744073709551615");
}

TEST(SdkParams, FinishRejectsUnreadKeys) {
  ParamList one{{"ration", "0.1"}};
  Params p = one.make("topk");
  p.getDouble("ratio", 0.01);
  EXPECT_EQ(invalidArgument([&] { p.finish(); }), "topk: unknown parameter 'ration' (known: ratio)");

  ParamList two{{"a", "1"}, {"ratio", "0.5"}, {"b", "2"}};
  Params q = two.make("topk");
  q.getDouble("ratio", 0.01);
  q.getInt("k", 3);
  q.getDouble("ratio", 0.01);  // asked twice, listed once
  EXPECT_EQ(invalidArgument([&] { q.finish(); }), "topk: unknown parameters 'a', 'b' (known: ratio, k)");

  ParamList none{{"x", "1"}};
  Params r = none.make("identity");
  EXPECT_EQ(invalidArgument([&] { r.finish(); }), "identity: unknown parameter 'x' (known: none)");
}

TEST(SdkParams, HasCountsAsRead) {
  ParamList l{{"seed", "3"}};
  Params p = l.make();
  EXPECT_TRUE(p.has("seed"));
  EXPECT_FALSE(p.has("other"));
  EXPECT_NO_THROW(p.finish());
}

TEST(SdkParams, MalformedListsAreRejected) {
  ParamList dup{{"ratio", "0.1"}, {"k", "1"}, {"ratio", "0.2"}};
  EXPECT_EQ(invalidArgument([&] { dup.make("topk"); }), "topk: parameter 'ratio' is given twice ('0.1' and '0.2')");

  const terse_param_v1 null_key[] = {{nullptr, "1"}};
  EXPECT_EQ(invalidArgument([&] { Params("p", null_key, 1); }), "p: parameter #0 has no key");
  const terse_param_v1 empty_key[] = {{"a", "1"}, {"", "1"}};
  EXPECT_EQ(invalidArgument([&] { Params("p", empty_key, 2); }), "p: parameter #1 has no key");
  const terse_param_v1 null_value[] = {{"a", nullptr}};
  EXPECT_EQ(invalidArgument([&] { Params("p", null_value, 1); }), "p: parameter 'a' has a NULL value");
  EXPECT_EQ(invalidArgument([&] { Params("p", nullptr, 2); }), "p: parameter list is NULL but holds 2 entries");
  EXPECT_NO_THROW(Params("p", nullptr, 0).finish());
}

TEST(SdkParams, ValuesAreCopied) {
  std::string key = "ratio";
  std::string value = "0.5";
  const terse_param_v1 raw[] = {{key.c_str(), value.c_str()}};
  Params p("topk", raw, 1);
  key.assign("xxxxx");
  value.assign("garbage");
  EXPECT_EQ(p.getDouble("ratio", 0), 0.5);
}

}  // namespace
}  // namespace terse::sdk
