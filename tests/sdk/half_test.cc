// sdk/half.hpp: binary16 checked against GCC's _Float16 (the compiler's own IEEE conversions, in libgcc's soft-fp or
// F16C), exhaustively for half -> float and on a dense stride of all floats for float -> half; bfloat16 against a
// reference written here from the definition (nearest of the two neighbours, ties to even) rather than bit tricks.
// Exact bits for the cases that break first: ties, subnormals, overflow, infinities, NaN.
#include "terse/sdk/half.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

namespace terse::sdk {
namespace {

#if defined(__FLT16_MAX__)
__extension__ typedef _Float16 GccHalf;
constexpr bool kHaveGccHalf = true;
#else
typedef float GccHalf;
constexpr bool kHaveGccHalf = false;
#endif

uint16_t gccFloatToHalf(float f) {
  const GccHalf h = static_cast<GccHalf>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}
float gccHalfToFloat(uint16_t bits) {
  GccHalf h;
  std::memcpy(&h, &bits, sizeof bits);
  return static_cast<float>(h);
}

bool isHalfNan(uint16_t h) {
  return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0;
}

// bfloat16 from the definition: the two bf16 values around f (truncation and truncation + 1 ulp in the bit pattern),
// the nearer one in exact double arithmetic, ties to the even pattern. Overflow past the largest finite bf16 rounds to
// infinity because the +1 ulp neighbour of the largest finite value is the infinity pattern.
uint16_t referenceBf16(float f) {
  const uint32_t u = floatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint16_t down = static_cast<uint16_t>(u >> 16);
  if ((u & 0xFFFFu) == 0) return down;
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double x = std::fabs(static_cast<double>(f));
  const double lo = std::fabs(static_cast<double>(bf16ToFloat(down)));
  const double hi_pattern = std::fabs(static_cast<double>(bf16ToFloat(up)));
  // The neighbour above the largest finite value is infinity; measure the distance to 2^128 (where the next value
  // would be) instead, which is what IEEE rounding does.
  const double hi = std::isinf(hi_pattern) ? std::ldexp(1.0, 128) : hi_pattern;
  const double d_lo = x - lo, d_hi = hi - x;
  if (d_lo < d_hi) return down;
  if (d_hi < d_lo) return up;
  return (down & 1u) == 0 ? down : up;
}

TEST(Half, HalfToFloatMatchesGccForAll65536Halves) {
  if (!kHaveGccHalf) GTEST_SKIP() << "this compiler has no _Float16";
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float ours = halfToFloat(bits);
    const float gcc = gccHalfToFloat(bits);
    if (isHalfNan(bits)) {
      ASSERT_TRUE(std::isnan(ours)) << std::hex << h;
      EXPECT_EQ(std::signbit(ours), (h & 0x8000u) != 0) << std::hex << h;
      // Quiet, payload kept in the top mantissa bits (as F16C and CUDA do).
      EXPECT_EQ(floatBits(ours), ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x03FFu) << 13)) << std::hex << h;
    } else {
      ASSERT_EQ(floatBits(ours), floatBits(gcc)) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Half, RoundTripIsExactForEveryNonNanHalf) {
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if (isHalfNan(bits)) continue;
    ASSERT_EQ(floatToHalf(halfToFloat(bits)), bits) << std::hex << h;
  }
}

TEST(Half, FloatToHalfMatchesGccOnAStrideOfAllFloats) {
  if (!kHaveGccHalf) GTEST_SKIP() << "this compiler has no _Float16";
  // A prime stride visits every exponent and sign with varied mantissas (about 4.2 million floats); the rounding
  // decisions themselves are walked exhaustively below.
  uint64_t checked = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 1021) {
    const float f = bitsFloat(static_cast<uint32_t>(u));
    const uint16_t ours = floatToHalf(f);
    const uint16_t gcc = gccFloatToHalf(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(isHalfNan(ours)) << std::hex << u;
      ASSERT_EQ(ours & 0x8000u, gcc & 0x8000u) << std::hex << u;
    } else {
      ASSERT_EQ(ours, gcc) << "float bits 0x" << std::hex << u;
    }
    ++checked;
  }
  EXPECT_GT(checked, 4000000u);
}

TEST(Half, FloatToHalfMatchesGccAtEveryTieAndItsNeighbours) {
  if (!kHaveGccHalf) GTEST_SKIP() << "this compiler has no _Float16";
  // Rounding is decided at the midpoints between consecutive halves. For every pair of adjacent non-negative halves
  // (subnormals, normals, and the largest finite one with the overflow threshold 65520 above it), the midpoint is
  // exact in f32; check it and the floats one and two ulps either side, both signs.
  for (uint32_t h = 0; h < 0x7C00u; ++h) {
    const double lo = halfToFloat(static_cast<uint16_t>(h));
    const double hi = h == 0x7BFFu ? 65536.0 : static_cast<double>(halfToFloat(static_cast<uint16_t>(h + 1)));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoint not exact in f32 for half 0x" << std::hex << h;
    const uint32_t m = floatBits(mid);
    for (uint32_t u : {m - 2, m - 1, m, m + 1, m + 2}) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float f = bitsFloat(u | sign);
        ASSERT_EQ(floatToHalf(f), gccFloatToHalf(f)) << "float bits 0x" << std::hex << (u | sign);
      }
    }
  }
}

TEST(Half, FloatToHalfExactBits) {
  struct Case {
    float in;
    uint16_t out;
    const char* why;
  };
  const Case cases[] = {
      {0.0f, 0x0000, "zero"},
      {-0.0f, 0x8000, "negative zero keeps its sign"},
      {1.0f, 0x3C00, "one"},
      {-2.0f, 0xC000, "minus two"},
      {1.0f + 0x1p-11f, 0x3C00, "tie between 1 and 1+2^-10 goes to the even 1"},
      {1.0f + 3 * 0x1p-11f, 0x3C02, "tie between 1+2^-10 and 1+2^-9 goes to the even 1+2^-9"},
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01, "just above the tie rounds up"},
      {65504.0f, 0x7BFF, "largest half"},
      {65519.99f, 0x7BFF, "below the overflow threshold rounds to the largest half"},
      {65520.0f, 0x7C00, "tie at the threshold overflows to infinity"},
      {1e10f, 0x7C00, "overflow"},
      {-1e10f, 0xFC00, "negative overflow"},
      {std::numeric_limits<float>::infinity(), 0x7C00, "inf"},
      {-std::numeric_limits<float>::infinity(), 0xFC00, "-inf"},
      {0x1p-14f, 0x0400, "smallest normal half"},
      {0x1p-14f - 0x1p-25f, 0x0400, "tie just below the smallest normal rounds up into it (0x3FF is odd)"},
      {0x1p-24f, 0x0001, "smallest subnormal half"},
      {0x1p-25f, 0x0000, "half the smallest subnormal ties to even zero"},
      {0x1p-25f + 0x1p-40f, 0x0001, "just above it rounds up"},
      {3 * 0x1p-25f, 0x0002, "tie between subnormals 1 and 2 goes to the even 2"},
      {5 * 0x1p-25f, 0x0002, "tie between subnormals 2 and 3 goes to the even 2"},
      {-3 * 0x1p-24f, 0x8003, "negative subnormal"},
      {0x1p-149f, 0x0000, "a float subnormal is half zero"},
  };
  for (const Case& c : cases) EXPECT_EQ(floatToHalf(c.in), c.out) << c.why;
}

TEST(Half, FloatToHalfKeepsNanSignAndQuietsIt) {
  const uint16_t q = floatToHalf(bitsFloat(0x7FC00000u));
  EXPECT_EQ(q, 0x7E00);
  EXPECT_EQ(floatToHalf(bitsFloat(0xFFC00000u)), 0xFE00);
  // A signalling NaN whose payload sits below the bits a half keeps must not turn into infinity.
  const uint16_t s = floatToHalf(bitsFloat(0x7F800001u));
  EXPECT_TRUE(isHalfNan(s)) << std::hex << s;
  EXPECT_EQ(floatToHalf(bitsFloat(0x7FA00000u)), 0x7F00) << "top payload bits are kept, quiet bit set";
}

TEST(Half, HalfToFloatExactValues) {
  EXPECT_EQ(halfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(halfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(halfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(halfToFloat(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(halfToFloat(0x8001), -0x1p-24f);
  EXPECT_TRUE(std::isinf(halfToFloat(0x7C00)) && halfToFloat(0x7C00) > 0);
  EXPECT_TRUE(std::isinf(halfToFloat(0xFC00)) && halfToFloat(0xFC00) < 0);
  EXPECT_EQ(floatBits(halfToFloat(0x8000)), 0x80000000u);
}

TEST(Bf16, MatchesTheReferenceOnAStrideOfAllFloats) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 65521) {
    const float f = bitsFloat(static_cast<uint32_t>(u));
    ASSERT_EQ(floatToBf16(f), referenceBf16(f)) << "float bits 0x" << std::hex << u;
  }
}

TEST(Bf16, MatchesTheReferenceAroundEveryTie) {
  // For a sample of upper halves, every low half that matters: just below, at and just above the tie, both parities.
  for (uint32_t hi = 0; hi <= 0xFFFFu; hi += 7) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const uint32_t u = hi << 16 | lo;
      const float f = bitsFloat(u);
      ASSERT_EQ(floatToBf16(f), referenceBf16(f)) << "float bits 0x" << std::hex << u;
    }
  }
}

TEST(Bf16, ExactBits) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(floatToBf16(bitsFloat(0x3F808000u)), 0x3F80) << "tie goes to even";
  EXPECT_EQ(floatToBf16(bitsFloat(0x3F818000u)), 0x3F82) << "tie goes to even (up)";
  EXPECT_EQ(floatToBf16(bitsFloat(0x3F808001u)), 0x3F81) << "above the tie rounds up";
  EXPECT_EQ(floatToBf16(bitsFloat(0x7F7FFFFFu)), 0x7F80) << "largest float rounds to infinity";
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(floatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(floatToBf16(bitsFloat(0x00000001u)), 0x0000) << "smallest float subnormal";
  EXPECT_EQ(floatToBf16(bitsFloat(0x00008000u)), 0x0000) << "tie at a subnormal goes to even zero";
  EXPECT_EQ(floatToBf16(bitsFloat(0x00018000u)), 0x0002) << "tie at a subnormal goes to even";
  EXPECT_EQ(floatToBf16(bitsFloat(0x7FC00000u)), 0x7FC0);
  EXPECT_EQ(floatToBf16(bitsFloat(0xFF800001u)), 0xFFC0) << "signalling NaN stays a NaN (quiet), sign kept";
  EXPECT_EQ(bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(floatBits(bf16ToFloat(0x8000)), 0x80000000u);
}

}  // namespace
}  // namespace terse::sdk
