// bf16: the vectorizable encoder in bf16_math.h against the SDK's reference conversion for every f32, exact wire bits
// (RNE ties, overflow, infinities, NaN, subnormals), round trips, the core's SUM path in bf16, and payload validation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/bf16/bf16_avx2.h"
#include "compressors/bf16/bf16_math.h"
#include "terse/sdk/half.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

namespace math = compressors::bf16;

std::vector<uint16_t> wireValues(const Bytes& p, size_t n) {
  std::vector<uint16_t> v(n);
  if (n > 0) std::memcpy(v.data(), p.data() + 16, 2 * n);
  return v;
}

// The result depends on the upper 16 bits (kept or bumped by one) and on the lower 16 (the rounding): every lower
// half for every 61st upper half, plus every float whose upper half is near the overflow and NaN boundaries of either
// sign. About 88 million floats; the AVX2 loop the plugin runs where the host has AVX2 gets the same floats.
TEST(Bf16Plugin, EncoderMatchesTheSdkConversionForEveryLowHalf) {
  uint64_t mismatches = 0, checked = 0, avx2_mismatches = 0;
  uint32_t first = 0, avx2_first = 0;
  std::vector<float> chunk(0x10000);
  std::vector<uint16_t> avx2(chunk.size());
  auto checkUpper = [&](uint32_t hi) {
    for (uint32_t lo = 0; lo <= 0xFFFFu; ++lo) {
      const uint32_t u = hi << 16 | lo;
      const float f = sdk::bitsFloat(u);
      chunk[lo] = f;
      ++checked;
      if (math::encodeValue(f) != sdk::floatToBf16(f) && mismatches++ == 0) first = u;
    }
#if TERSE_BF16_AVX2
    // The plugin's AVX2 loop (bf16_avx2.h) on the same floats, 16 at a time.
    if (!math::hasAvx2()) return;
    math::encodeAvx2(chunk.data(), avx2.data(), chunk.size());
    for (uint32_t lo = 0; lo <= 0xFFFFu; ++lo) {
      if (avx2[lo] != math::encodeValue(chunk[lo]) && avx2_mismatches++ == 0) avx2_first = hi << 16 | lo;
    }
#endif
  };
  for (uint32_t hi = 0; hi <= 0xFFFFu; hi += 61) checkUpper(hi);
  for (uint32_t hi = 0x7F70u; hi <= 0x7FFFu; ++hi) {
    checkUpper(hi);
    checkUpper(hi | 0x8000u);
  }
  checkUpper(0x0000u);
  checkUpper(0x8000u);
  EXPECT_GT(checked, 80000000u);
  EXPECT_EQ(mismatches, 0u) << "first mismatch at float bits 0x" << std::hex << first;
  EXPECT_EQ(avx2_mismatches, 0u) << "AVX2 loop: first mismatch at float bits 0x" << std::hex << avx2_first;
}

// The streaming decode (bf16_avx2.h) against decodeValue for every bf16 value, at every alignment of the output to
// the 32-byte stores and lengths around the 16-value steps; and the plugin's decompress of a tensor above the size
// where it streams, bit for bit against the payload's values, accumulate (the cached loop) included.
TEST(Bf16Plugin, StreamingDecodeMatchesDecodeValue) {
#if TERSE_BF16_AVX2
  if (!math::hasAvx2()) GTEST_SKIP() << "this host has no AVX2";
  std::vector<uint16_t> all(0x10000);
  for (uint32_t w = 0; w <= 0xFFFFu; ++w) all[w] = static_cast<uint16_t>(w);
  std::vector<float> streamed(all.size() + 8);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{40}, all.size()}) {
    for (size_t offset = 0; offset < 8; ++offset) {
      std::fill(streamed.begin(), streamed.end(), 1.5f);
      math::decodeStreamAvx2(all.data(), streamed.data() + offset, n);
      for (size_t i = 0; i < streamed.size(); ++i) {
        const bool inside = i >= offset && i < offset + n;
        const uint32_t want = inside ? sdk::floatBits(math::decodeValue(all[i - offset])) : sdk::floatBits(1.5f);
        ASSERT_EQ(sdk::floatBits(streamed[i]), want) << "n " << n << ", offset " << offset << ", index " << i;
      }
    }
  }
#endif
  Plugin plugin("bf16");
  Instance c(plugin);
  const size_t n = (size_t{4} << 20) + 13;  // at least kAvx2MinFloats in bf16.cc
  auto g = gaussian(n, 5);
  g[3] = std::numeric_limits<float>::infinity();
  g[n - 2] = std::nanf("");
  g[n - 1] = -0.0f;
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, g);
  const auto wire = wireValues(p, n);
  const auto out = c.decode(info, p);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(sdk::floatBits(out[i]), uint32_t{wire[i]} << 16) << "element " << i;
  std::vector<float> acc(n, 2.0f);
  ASSERT_EQ(c.decompress(info, p, acc, /*accumulate=*/true), TERSE_OK);
  for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(acc[i], 2.0f + math::decodeValue(wire[i])) << "element " << i;
}

TEST(Bf16Plugin, CapsAndSizes) {
  Plugin plugin("bf16");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  const auto caps = c.caps();
  EXPECT_EQ(caps.devices, kCudaPluginDevices);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_SUM);
  EXPECT_EQ(caps.wire_dtype, TERSE_DTYPE_BF16);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);
  terse_compressor_caps_v1 other{};
  EXPECT_EQ(c.getCaps(TERSE_DTYPE_BF16, &other), TERSE_ERR_UNSUPPORTED);
  for (uint64_t n : {0ull, 1ull, 1001ull, 1ull << 20}) {
    const auto s = c.sizes(tensorInfo(n));
    EXPECT_EQ(s.max_output_bytes, 16 + 2 * n);
    EXPECT_EQ(s.sum_header_bytes, 16u);
  }
}

TEST(Bf16Plugin, ExactWireBits) {
  Plugin plugin("bf16");
  Instance c(plugin);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {0.0f,
                                 -0.0f,
                                 1.0f,
                                 sdk::bitsFloat(0x3F808000u),  // tie, even below
                                 sdk::bitsFloat(0x3F818000u),  // tie, even above
                                 sdk::bitsFloat(0x3F808001u),  // just above a tie
                                 sdk::bitsFloat(0x7F7FFFFFu),  // largest float: rounds to infinity
                                 inf,
                                 -inf,
                                 sdk::bitsFloat(0x00018000u),  // subnormal tie
                                 0.1f,
                                 -3.0f,
                                 std::nanf(""),
                                 sdk::bitsFloat(0xFF800001u)};  // signalling NaN
  const std::vector<uint16_t> want = {0x0000, 0x8000, 0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80,
                                      0x7F80, 0xFF80, 0x0002, 0x3DCD, 0xC040, 0x7FC0, 0xFFC0};
  ASSERT_EQ(in.size(), want.size());
  const auto info = tensorInfo(in.size());
  const Bytes p = c.compress(info, in);
  const auto wire = wireValues(p, in.size());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(wire[i], want[i]) << "element " << i;
  const auto out = c.decode(info, p);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(sdk::floatBits(out[i]), uint32_t{want[i]} << 16) << "element " << i;
  }
}

// Half an ulp of an 8-bit significand: at most 2^-8 |g|.
TEST(Bf16Plugin, RoundTripErrorIsWithinHalfAnUlp) {
  Plugin plugin("bf16");
  Instance c(plugin);
  for (uint64_t n : {1ull, 2ull, 63ull, 64ull, 65ull, (1ull << 20) + 3}) {
    const auto g = gaussian(n, static_cast<uint32_t>(n), 1e3f);
    const auto info = tensorInfo(n);
    const Bytes p = c.compress(info, g);
    ASSERT_EQ(p.size(), 16 + 2 * n);
    const auto out = c.decode(info, p);
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(static_cast<double>(out[i]) - g[i]), std::fabs(static_cast<double>(g[i])) * 0x1p-8)
          << "n " << n << " i " << i;
    }
  }
}

TEST(Bf16Plugin, SumPathInBf16) {
  Plugin plugin("bf16");
  Instance c(plugin);
  const int world = 3;
  const uint64_t n = 515;
  std::vector<Bytes> payloads;
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < world; ++r) {
    grads.push_back(gaussian(n, 70 + static_cast<uint32_t>(r)));
    payloads.push_back(c.compress(tensorInfo(n, {.rank = r, .world_size = world}), grads.back()));
  }
  std::vector<uint16_t> want(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t acc = sdk::floatToBf16(grads[0][i]);
    for (int r = 1; r < world; ++r) {
      acc = sdk::floatToBf16(sdk::bf16ToFloat(acc) + sdk::bf16ToFloat(sdk::floatToBf16(grads[r][i])));
    }
    want[i] = acc;
  }
  const Bytes sum = sumPayloads(payloads, 16, TERSE_DTYPE_BF16);
  EXPECT_EQ(wireValues(sum, n), want);
  const auto out = c.decode(aggregateInfo(tensorInfo(n, {.world_size = world})), sum);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], sdk::bf16ToFloat(want[i])) << i;
}

TEST(Bf16Plugin, RejectsMalformedPayloads) {
  Plugin plugin("bf16");
  Instance c(plugin);
  for (uint64_t n : {0ull, 1ull, 40ull}) {
    const auto info = tensorInfo(n);
    expectRejectsStructuralDamage(c, info, c.compress(info, gaussian(n, 3)));
  }
}

}  // namespace
}  // namespace terse::testing
