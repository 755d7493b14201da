// core/common/json.h: what the results folder's files need from JSON (round trips, untrusted input's limits).
#include "core/common/json.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

namespace terse {
namespace {

TEST(Json, DoublesReadBackBitExactly) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> bits;
  int tried = 0;
  while (tried < 20000) {
    const double d = std::bit_cast<double>(bits(rng));
    if (!std::isfinite(d)) continue;
    ++tried;
    const auto back = parseJsonObject(dumpJson(Json{{"x", d}}));
    ASSERT_TRUE(back);
    ASSERT_EQ(std::bit_cast<uint64_t>(*getNumber(*back, "x")), std::bit_cast<uint64_t>(d)) << dumpJson(d);
  }
  for (double d : {0.1, -0.0, 5e-324, std::numeric_limits<double>::max(), 1.0 / 3}) {
    const auto back = parseJson(dumpJson(d));
    ASSERT_TRUE(back);
    EXPECT_EQ(std::bit_cast<uint64_t>(back->get<double>()), std::bit_cast<uint64_t>(d)) << dumpJson(d);
  }
}

// Files written before nlohmann-json spelled doubles with printf's %.17g; they must read to the same bits.
TEST(Json, ReadsThePrintfSpellingOfOlderFiles) {
  for (double d : {0.1, 0.87283333333333335, 1e-300, 123456789.123456789, 3.0}) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", d);
    const auto back = parseJson(buf);
    ASSERT_TRUE(back) << buf;
    EXPECT_EQ(back->get<double>(), d) << buf;
  }
}

TEST(Json, IntegralDoublesAreWrittenAsIntegers) {
  const Json o{{"live", 2.0}, {"bytes", 1e15}, {"half", 0.5}, {"neg_zero", -0.0}, {"big", 1e300}, {"nested", {3.0}}};
  EXPECT_EQ(dumpJson(o), R"({"live":2,"bytes":1000000000000000,"half":0.5,"neg_zero":-0.0,"big":1e+300,"nested":[3]})");
}

TEST(Json, StringsAndOtherScalarsRoundTrip) {
  const Json record{{"s", "a\"b\\c\nd\x01/é"},
                    {"i", int64_t{-3}},
                    {"u", uint64_t{18446744073709551615u}},
                    {"t", true},
                    {"n", nullptr},
                    {"nested", {{"a", Json::array({1, "x", false})}}}};
  const std::string text = dumpJson(record);
  EXPECT_EQ(text.find('\n'), std::string::npos) << "one line, as metrics.jsonl needs";
  const auto back = parseJsonObject(text);
  ASSERT_TRUE(back) << text;
  EXPECT_EQ(*back, record);
  EXPECT_EQ(dumpJson(*back), text) << "members keep their order";
}

TEST(Json, NonFiniteNumbersAndBadUtf8AreWrittenNotThrown) {
  const auto back = parseJsonObject(dumpJson(Json{{"inf", HUGE_VAL}, {"nan", std::nan("")}, {"s", "ok\xff"}}));
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->at("inf").is_null());
  EXPECT_TRUE(back->at("nan").is_null());
  EXPECT_EQ(getString(*back, "s"), "ok\xEF\xBF\xBD");  // U+FFFD
}

TEST(Json, MalformedAndTruncatedTextSaysWhereAndWhat) {
  std::string error;
  EXPECT_FALSE(parseJson("{\"a\": nan}", &error));
  EXPECT_NE(error.find("line 1, column 8"), std::string::npos) << error;
  EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
  EXPECT_FALSE(parseJson("{\"a\":1", &error));  // a torn line
  EXPECT_NE(error.find("end of input"), std::string::npos) << error;
  EXPECT_FALSE(parseJson("{\"a\": 1} x", &error));
  EXPECT_NE(error.find("line 1, column 10"), std::string::npos) << error;
  for (const char* bad : {"", "[1, 2", "0x10", "01", "inf", "{\"a\": 1 // c\n}", "{'a': 1}"})
    EXPECT_FALSE(parseJson(bad, &error)) << bad;
  EXPECT_FALSE(parseJsonObject("[1]", &error));
  EXPECT_EQ(error, "a JSON array, not an object");
  // Well-formed JSON a double cannot hold: an error like the rest, not an exception out of the parser.
  EXPECT_FALSE(parseJson("{\"t\": 1e999}", &error));
  EXPECT_NE(error.find("number overflow"), std::string::npos) << error;
  EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
}

TEST(Json, NestingBeyondTheLimitIsAnErrorNotAStackOverflow) {
  std::string error;
  EXPECT_TRUE(parseJson(std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']'), &error)) << error;
  EXPECT_FALSE(parseJson(std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']'), &error));
  EXPECT_EQ(error, "nested deeper than 64 levels");
  // A million levels, objects and arrays mixed: rejected at level 65 without recursing through the rest.
  std::string deep;
  for (int i = 0; i < 500000; ++i) deep += "{\"a\":[";
  EXPECT_FALSE(parseJson(deep, &error));
  EXPECT_EQ(error, "nested deeper than 64 levels");
}

TEST(Json, ADuplicateKeyIsAnError) {
  std::string error;
  EXPECT_FALSE(parseJson(R"({"a": 1, "b": {"a": 2}, "a": 3})", &error));
  EXPECT_EQ(error, "duplicate key \"a\" in one object");
  // The same key in sibling and nested objects is fine.
  EXPECT_TRUE(parseJson(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})", &error)) << error;
}

TEST(Json, MemberAccessToleratesOtherShapes) {
  const Json doc{{"n", 2}, {"f", 2.5}, {"s", "x"}, {"o", Json::object()}};
  EXPECT_EQ(getNumber(doc, "n"), 2.0);
  EXPECT_EQ(getNumber(doc, "f"), 2.5);
  EXPECT_FALSE(getNumber(doc, "s"));
  EXPECT_FALSE(getString(doc, "n"));
  EXPECT_FALSE(getString(doc, "missing"));
  EXPECT_EQ(findMember(doc, "o"), &doc.at("o"));
  EXPECT_EQ(findMember(Json::array({1}), "n"), nullptr);
}

}  // namespace
}  // namespace terse
