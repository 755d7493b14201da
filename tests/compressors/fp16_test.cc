// fp16: the vectorizable encoder in fp16_math.h against the SDK's reference conversion for every f32, the exact wire
// bits of the cases that break first (RNE ties, subnormals, overflow, infinities, NaN), round trips, the core's SUM
// path in f16, and payload validation.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/fp16/fp16_f16c.h"
#include "compressors/fp16/fp16_math.h"
#include "terse/sdk/half.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

namespace math = compressors::fp16;

std::vector<uint16_t> wireValues(const Bytes& p, size_t n) {
  std::vector<uint16_t> v(n);
  if (n > 0) std::memcpy(v.data(), p.data() + 16, 2 * n);
  return v;
}

// Every float whose half is not a constant: all non-negative floats from just below 2^-25 (below it everything is
// +0) to 65520 (from there to infinity everything is +inf), every NaN and infinity, and the same ranges negated on a
// stride of 3 (the sign is a plain OR in both encoders); the constant stretches on a stride of 4099. About 470 million
// floats, so the branch-free encoder may replace the SDK's without any doubt. Where the CPU has F16C, the plugin's
// F16C loop (fp16_f16c.h) must give the same bits on the same floats: they go through it in chunks of 4099, so its
// scalar remainder runs too.
TEST(Fp16, EncoderMatchesTheSdkConversionWhereverTheResultVaries) {
  uint64_t mismatches = 0, checked = 0, f16c_mismatches = 0;
  uint32_t first = 0;
  std::vector<float> chunk(4099);
  std::vector<uint16_t> f16c(chunk.size());
#if TERSE_FP16_F16C
  const bool with_f16c = math::hasF16c();
#else
  const bool with_f16c = false;
#endif
  auto check = [&](uint64_t lo, uint64_t hi, uint64_t stride) {
    for (uint64_t u = lo; u < hi;) {
      size_t n = 0;
      for (; n < chunk.size() && u < hi; ++n, u += stride) chunk[n] = sdk::bitsFloat(static_cast<uint32_t>(u));
#if TERSE_FP16_F16C
      if (with_f16c) math::encodeF16c(chunk.data(), f16c.data(), n);
#endif
      for (size_t j = 0; j < n; ++j) {
        const uint16_t h = math::encodeValue(chunk[j]);
        if (h != sdk::floatToHalf(chunk[j]) && mismatches++ == 0) first = sdk::floatBits(chunk[j]);
        f16c_mismatches += with_f16c && f16c[j] != h;
      }
      checked += n;
    }
  };
  const uint64_t kVaryLo = 0x32FFFFF0u, kVaryHi = 0x47800000u, kInf = 0x7F800000u, kSign = 0x80000000u;
  check(kVaryLo, kVaryHi, 1);
  check(kInf, kSign, 1);
  check(kSign + kVaryLo, kSign + kVaryHi, 3);
  check(kSign + kInf, uint64_t{1} << 32, 3);
  check(0, kVaryLo, 4099);
  check(kVaryHi, kInf, 4099);
  check(kSign, kSign + kVaryLo, 4099);
  check(kSign + kVaryHi, kSign + kInf, 4099);
  EXPECT_GT(checked, 450000000u);
  EXPECT_EQ(mismatches, 0u) << "first mismatch at float bits 0x" << std::hex << first << ": 0x"
                            << math::encodeValue(sdk::bitsFloat(first)) << " vs 0x"
                            << sdk::floatToHalf(sdk::bitsFloat(first));
  EXPECT_EQ(f16c_mismatches, 0u);
}

TEST(Fp16, DecoderMatchesTheSdkConversionForAll65536Halves) {
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    ASSERT_EQ(sdk::floatBits(math::decodeValue(bits)), sdk::floatBits(sdk::halfToFloat(bits))) << std::hex << h;
  }
}

#if TERSE_FP16_F16C
// The plugin's F16C decode loop on every half (and a ragged tail), writing and accumulating.
TEST(Fp16, F16cDecoderMatchesTheSelectForm) {
  if (!math::hasF16c()) GTEST_SKIP() << "this CPU has no F16C";
  std::vector<uint16_t> halves(0x10003);  // not a multiple of 8
  for (size_t h = 0; h < halves.size(); ++h) halves[h] = static_cast<uint16_t>(h);
  std::vector<float> got(halves.size()), sum(halves.size(), 0.25f);
  math::decodeF16c(halves.data(), got.data(), halves.size(), false);
  math::decodeF16c(halves.data(), sum.data(), halves.size(), true);
  for (size_t h = 0; h < halves.size(); ++h) {
    ASSERT_EQ(sdk::floatBits(got[h]), sdk::floatBits(math::decodeValue(halves[h]))) << std::hex << h;
    const float want = 0.25f + math::decodeValue(halves[h]);
    if (!std::isnan(want)) {
      ASSERT_EQ(sdk::floatBits(sum[h]), sdk::floatBits(want)) << std::hex << h;
    }
  }
}
#endif

TEST(Fp16, CapsAndSizes) {
  Plugin plugin("fp16");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  const auto caps = c.caps();
  EXPECT_EQ(caps.devices, kCudaPluginDevices);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_SUM);
  EXPECT_EQ(caps.wire_dtype, TERSE_DTYPE_F16);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);
  terse_compressor_caps_v1 other{};
  EXPECT_EQ(c.getCaps(TERSE_DTYPE_F64, &other), TERSE_ERR_UNSUPPORTED);
  for (uint64_t n : {0ull, 1ull, 1001ull, 1ull << 20}) {
    const auto s = c.sizes(tensorInfo(n));
    EXPECT_EQ(s.max_output_bytes, 16 + 2 * n);
    EXPECT_EQ(s.sum_header_bytes, 16u);
    EXPECT_EQ(s.workspace_bytes, 0u);
    EXPECT_EQ(s.state_bytes, 0u);
  }
  Instance bad(plugin, {{"precision", "half"}});
  EXPECT_EQ(bad.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
}

TEST(Fp16, ExactWireBits) {
  Plugin plugin("fp16");
  Instance c(plugin);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> in = {0.0f,         -0.0f,         1.0f,          1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                                 65504.0f,     65519.99f,     65520.0f,      1e10f,           -1e10f,
                                 inf,          -inf,          0x1p-14f,      0x1p-24f,        0x1p-25f,
                                 3 * 0x1p-25f, 0x1p-26f,      -0x1p-24f,     1e-30f,          0.1f,
                                 -2.5f,        std::nanf(""), -std::nanf("")};
  const std::vector<uint16_t> want = {0x0000, 0x8000, 0x3C00, 0x3C00, 0x3C02, 0x7BFF, 0x7BFF, 0x7C00,
                                      0x7C00, 0xFC00, 0x7C00, 0xFC00, 0x0400, 0x0001, 0x0000, 0x0002,
                                      0x0000, 0x8001, 0x0000, 0x2E66, 0xC100, 0x7E00, 0xFE00};
  ASSERT_EQ(in.size(), want.size());
  const auto info = tensorInfo(in.size());
  const Bytes p = c.compress(info, in);
  ASSERT_EQ(p.size(), 16 + 2 * in.size());
  const auto wire = wireValues(p, in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(wire[i], want[i]) << "element " << i << " (" << in[i] << ")";
  }
  // Decompress gives the half's exact value back; NaN stays NaN with its sign, infinities stay infinite.
  const std::vector<float> out = c.decode(info, p);
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(out[i]));
      EXPECT_EQ(std::signbit(out[i]), std::signbit(in[i]));
    } else {
      EXPECT_EQ(sdk::floatBits(out[i]), sdk::floatBits(sdk::halfToFloat(want[i]))) << "element " << i;
    }
  }
}

TEST(Fp16, RoundTripErrorIsWithinHalfAnUlp) {
  Plugin plugin("fp16");
  Instance c(plugin);
  for (uint64_t n : {1ull, 2ull, 63ull, 64ull, 65ull, (1ull << 20) + 3}) {
    const auto g = gaussian(n, static_cast<uint32_t>(n), 10.0f);
    const auto info = tensorInfo(n);
    const Bytes p = c.compress(info, g);
    ASSERT_EQ(p.size(), 16 + 2 * n);
    const auto out = c.decode(info, p);
    for (uint64_t i = 0; i < n; ++i) {
      const double err = std::fabs(static_cast<double>(out[i]) - g[i]);
      // Half an ulp: 2^-11 relative for normal halves, 2^-25 absolute below 2^-14.
      ASSERT_LE(err, std::max(std::fabs(static_cast<double>(g[i])) * 0x1p-11, 0x1p-25)) << "n " << n << " i " << i;
    }
  }
}

TEST(Fp16, AccumulateAndTheSumPathInF16) {
  Plugin plugin("fp16");
  Instance c(plugin);
  const int world = 4;
  const uint64_t n = 1003;
  std::vector<Bytes> payloads;
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < world; ++r) {
    grads.push_back(gaussian(n, 7 + static_cast<uint32_t>(r)));
    payloads.push_back(c.compress(tensorInfo(n, {.rank = r, .world_size = world}), grads.back()));
  }
  // The core sums halves pairwise in f32, rounding back to f16 after each pair.
  std::vector<uint16_t> want(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t acc = sdk::floatToHalf(grads[0][i]);
    for (int r = 1; r < world; ++r)
      acc = sdk::floatToHalf(sdk::halfToFloat(acc) + sdk::halfToFloat(sdk::floatToHalf(grads[r][i])));
    want[i] = acc;
  }
  const Bytes sum = sumPayloads(payloads, 16, TERSE_DTYPE_F16);
  EXPECT_EQ(wireValues(sum, n), want);
  const auto agg = aggregateInfo(tensorInfo(n, {.world_size = world}));
  std::vector<float> out(n, 1.0f);
  ASSERT_EQ(c.decompress(agg, sum, out, /*accumulate=*/true), TERSE_OK) << c.lastError();
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 1.0f + sdk::halfToFloat(want[i])) << i;
}

TEST(Fp16, RejectsMalformedPayloads) {
  Plugin plugin("fp16");
  Instance c(plugin);
  for (uint64_t n : {0ull, 1ull, 40ull}) {
    const auto info = tensorInfo(n);
    expectRejectsStructuralDamage(c, info, c.compress(info, gaussian(n, 3)));
  }
  // A bf16 payload of the same size is not an fp16 one.
  Plugin bf16("bf16");
  Instance b(bf16);
  const auto info = tensorInfo(8);
  const Bytes other = b.compress(info, gaussian(8, 1));
  EXPECT_EQ(decodeOutcome(c, info, other).status, TERSE_ERR_INVALID_PAYLOAD);
  EXPECT_NE(c.lastError().find("magic"), std::string::npos) << c.lastError();
}

}  // namespace
}  // namespace terse::testing
