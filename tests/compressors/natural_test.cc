// natural: exact sizes and the documented layout, every value a signed power of two adjacent to its input (or the
// input when it is one), the two probabilities of the rounding (exact at 24 bits, with the documented bias below),
// unbiasedness and the variance bound 1/8 over many steps, subnormals and zeros, determinism, the refusal of inputs
// with no power of two, and validation of untrusted payloads (exponent 255, padding bytes and bits, parameters).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/natural/natural_math.h"
#include "terse/sdk/philox.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

namespace math = compressors::natural;

uint64_t naturalExpectedBytes(uint64_t n) {
  return 32 + (n + 7) / 8 * 8 + 8 * ((n + 63) / 64);
}

// The power of two at or below |x| (x finite and nonzero), as the f32 with x's exponent and an empty mantissa; for a
// subnormal, 0.
float lowerPower(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits &= 0x7F800000u;
  float p;
  std::memcpy(&p, &bits, 4);
  return p;
}

TEST(Natural, ParametersCapsAndSizes) {
  Plugin plugin("natural");
  for (const char* b : {"0", "4", "12", "32", "-8", "many"}) {
    Instance rounding(plugin, {{"rounding_bits", b}});
    EXPECT_EQ(rounding.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << b;
    EXPECT_NE(
        rounding.lastError().find("natural: 'rounding_bits' must be one of {8, 16, 24}, got '" + std::string(b) + "'"),
        std::string::npos)
        << rounding.lastError();
  }
  Instance unknown(plugin, {{"exponent_bits", "7"}});
  EXPECT_EQ(unknown.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << "an unknown parameter is refused, not ignored";
  Instance c(plugin);
  const auto caps = c.caps();
  EXPECT_EQ(caps.devices, kCudaPluginDevices);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_ALLGATHER);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);
  // 2^20 elements at 9 bits: 1,048,576 exponent bytes and 131,072 bytes of signs, 3.56x smaller than f32.
  EXPECT_EQ(c.sizes(tensorInfo(uint64_t{1} << 20)).max_output_bytes, 32u + 1179648u);
  for (uint64_t n : {0ull, 1ull, 7ull, 63ull, 64ull, 65ull, 1000ull}) {
    ASSERT_EQ(c.sizes(tensorInfo(n)).max_output_bytes, naturalExpectedBytes(n)) << n;
    EXPECT_EQ(c.compress(tensorInfo(n), gaussian(n, 3)).size(), naturalExpectedBytes(n)) << n;
  }
}

// Every decoded value is sign(x) times the power of two at or below |x| or twice it; powers of two and zeros travel
// exactly.
TEST(Natural, ValuesAreTheAdjacentPowersOfTwo) {
  Plugin plugin("natural");
  Instance c(plugin);
  for (uint64_t n : {1ull, 2ull, 63ull, 64ull, 65ull, 1001ull, 4097ull}) {
    auto g = gaussian(n, static_cast<uint32_t>(n));
    if (n > 10) {
      g[2] = 0.0f;
      g[3] = -0.0f;
      g[4] = 0.25f;
      g[5] = -1024.0f;
      g[6] = 1e-30f;
    }
    const auto info = tensorInfo(n, {.step = n});
    const auto out = c.decode(info, c.compress(info, g));
    for (uint64_t i = 0; i < n; ++i) {
      if (g[i] == 0.0f) {
        ASSERT_EQ(out[i], 0.0f) << i;
        ASSERT_EQ(std::signbit(out[i]), std::signbit(g[i])) << "a zero keeps its sign";
        continue;
      }
      const float a = lowerPower(g[i]);
      ASSERT_TRUE(out[i] == std::copysign(a, g[i]) || out[i] == std::copysign(2 * a, g[i]))
          << i << ": " << g[i] << " -> " << out[i];
      if (std::fabs(g[i]) == a) {
        ASSERT_EQ(out[i], g[i]) << "a power of two is its own code";
      }
    }
  }
}

TEST(Natural, PayloadFollowsTheDocumentedLayout) {
  Plugin plugin("natural");
  Instance c(plugin);
  const uint64_t n = 70;  // 70 exponent bytes padded to 72, then 2 sign words
  auto g = gaussian(n, 1);
  g[0] = 0.0f;
  g[1] = -0.5f;
  g[2] = 3.0f;
  g[3] = -0.0f;
  g[69] = -1.0f;
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, g);
  ASSERT_EQ(p.size(), 32u + 72u + 16u);
  EXPECT_EQ(readAt<uint32_t>(p, 16), 8u);
  EXPECT_EQ(readAt<uint32_t>(p, 20), 0u);
  EXPECT_EQ(readAt<uint64_t>(p, 24), 0u);
  EXPECT_EQ(readAt<uint8_t>(p, 32), 0u);
  EXPECT_EQ(readAt<uint8_t>(p, 33), 126u) << "0.5 = 2^-1: exponent 126";
  EXPECT_TRUE(readAt<uint8_t>(p, 34) == 128u || readAt<uint8_t>(p, 34) == 129u) << "3: 2 or 4";
  EXPECT_EQ(readAt<uint8_t>(p, 101), 127u);
  EXPECT_EQ(readAt<uint16_t>(p, 102), 0u) << "padding";
  const uint64_t w0 = readAt<uint64_t>(p, 104), w1 = readAt<uint64_t>(p, 112);
  EXPECT_EQ(w1 >> 5, 1u) << "element 69's sign, and nothing after it";
  const auto out = c.decode(info, p);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t e = readAt<uint8_t>(p, 32 + i);
    const uint64_t sign = ((i < 64 ? w0 : w1) >> (i % 64)) & 1;
    EXPECT_EQ(sign, std::signbit(g[i]) ? 1u : 0u) << i;
    const float magnitude = e == 0 ? 0.0f : std::ldexp(1.0f, static_cast<int>(e) - 127);
    EXPECT_EQ(out[i], sign != 0 ? -magnitude : magnitude) << i;
    EXPECT_EQ(std::signbit(out[i]), sign != 0) << i;
  }
}

// The math the kernels share, on single values: up iff (draw >> 8) < 2 m.
TEST(Natural, RoundedExponentGoesUpExactlyWhenTheDrawIsBelowTwiceTheMantissa) {
  const float x = 1.75f;  // exponent 127, m = 0.75 2^23
  const uint32_t m = 3u << 21;
  EXPECT_EQ(math::roundedExponent(x, (2 * m - 1) << 8), 128u) << "just below: up to 2";
  EXPECT_EQ(math::roundedExponent(x, (2 * m) << 8), 127u) << "at 2m: down to 1";
  EXPECT_EQ(math::roundedExponent(x, 0xFFFFFFFFu), 127u);
  EXPECT_EQ(math::roundedExponent(-x, 0), 128u) << "the sign travels apart";
  EXPECT_EQ(math::roundedExponent(1.0f, 0), 127u) << "m = 0 never rounds up";
  EXPECT_EQ(math::decodeValue(128u, 1u), -2.0f);
  // Subnormals: 2^-149 m rounds to 2^-126 with probability m 2^-23, else to zero.
  const float tiny = std::numeric_limits<float>::denorm_min() * 3;
  EXPECT_EQ(math::roundedExponent(tiny, 5u << 8), 1u);
  EXPECT_EQ(math::roundedExponent(tiny, 6u << 8), 0u);
  EXPECT_EQ(math::decodeValue(1u, 0u), std::numeric_limits<float>::min());
  EXPECT_TRUE(std::signbit(math::decodeValue(0u, 1u)));
  // No power of two: inf, NaN (whatever the draw) and a value at or above 2^127 that rounds up.
  EXPECT_EQ(math::roundedExponent(std::numeric_limits<float>::infinity(), 0), math::kBadExponent);
  EXPECT_EQ(math::roundedExponent(std::numeric_limits<float>::quiet_NaN(), 0), math::kBadExponent);
  EXPECT_EQ(math::roundedExponent(-std::numeric_limits<float>::quiet_NaN(), 0xFFFFFFFFu), math::kBadExponent);
  EXPECT_EQ(math::roundedExponent(std::numeric_limits<float>::max(), 0), math::kBadExponent);
  EXPECT_EQ(math::roundedExponent(std::numeric_limits<float>::max(), 0xFFFFFFFFu), 254u);
}

// E[C(x)] = x and E(C(x) - x)^2 = a^2 p (1 - p) for x = a (1 + p): over K steps every element's mean within 5
// standard deviations, the mean squared z-score near 1, and the summed variance below ||x||^2 / 8 (Theorem 1), close
// to its exact value.
TEST(Natural, UnbiasedWithinTheVarianceBound) {
  Plugin plugin("natural");
  Instance c(plugin);
  const uint64_t n = 300;
  auto g = gaussian(n, 99);
  g[7] = std::numeric_limits<float>::denorm_min() * 12345;  // a subnormal: rounds between 0 and 2^-126
  const int steps = 4000;
  RunningMoments m(n);
  double sq_err = 0;
  for (int k = 0; k < steps; ++k) {
    const auto info = tensorInfo(n, {.step = static_cast<uint64_t>(k), .seed = 5});
    const auto out = c.decode(info, c.compress(info, g));
    for (uint64_t i = 0; i < n; ++i)
      sq_err += (static_cast<double>(out[i]) - g[i]) * (static_cast<double>(out[i]) - g[i]);
    m.add(out);
  }
  double z2 = 0, norm2 = 0, var_sum = 0;
  int counted = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double x = std::fabs(static_cast<double>(g[i]));
    const double a = i == 7 ? 0.0 : lowerPower(g[i]);
    const double gap = i == 7 ? std::numeric_limits<float>::min() : a;
    const double p = (x - a) / gap;
    const double var = gap * gap * p * (1 - p);
    norm2 += x * x;
    var_sum += var;
    const double dev = m.mean(i) - g[i];
    EXPECT_LE(std::fabs(dev), 5 * std::sqrt(var / steps) + 1e-12 * x) << i;
    if (var > 0) {
      z2 += dev * dev / (var / steps);
      ++counted;
    }
  }
  EXPECT_LT(z2 / counted, 1.5) << "mean squared z-score; 1 expected for an unbiased rounding";
  EXPECT_LE(sq_err / steps, norm2 / 8) << "the measured error within Theorem 1's bound";
  EXPECT_NEAR(sq_err / steps, var_sum, 0.1 * var_sum) << "the measured error is the exact variance";
}

// rounding_bits b: up iff r < 2m, r on 24 bits in steps of 2^(24 - b), so P(up) = ceil(m 2^(b - 23)) 2^-b. 1 + 2^-10
// (m = 2^13) rounds up with probability 2^-10 at 24 and 16 bits and 2^-8 at 8 bits (ceil(2^-2) = 1); 1.5 with 1/2 at
// every b. 2^18 elements over 4 steps: the rate within 5 sigma of the formula, and at 1.5 elements d apart agreeing
// half the time (independent draws).
TEST(Natural, RoundingBitsGiveTheirRateAndBias) {
  Plugin plugin("natural");
  const uint64_t n = uint64_t{1} << 18;
  const int steps = 4;
  for (const unsigned b : {24u, 16u, 8u}) {
    for (const float f : {std::ldexp(1.0f, -10), 0.5f}) {
      SCOPED_TRACE("rounding_bits " + std::to_string(b) + ", f " + std::to_string(f));
      Instance c(plugin, {{"rounding_bits", std::to_string(b)}});
      ASSERT_TRUE(c.ok()) << c.lastError();
      const std::vector<float> g(n, 1.0f + f);
      const double scale = std::ldexp(1.0, static_cast<int>(b));
      const double p = std::ceil(f * scale) / scale;
      const double draws = static_cast<double>(n) * steps;
      double up = 0, agree = 0, pairs = 0;
      for (int step = 0; step < steps; ++step) {
        const auto info = tensorInfo(n, {.step = static_cast<uint64_t>(step), .seed = 41});
        const auto out = c.decode(info, c.compress(info, g));
        for (uint64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(out[i] == 1.0f || out[i] == 2.0f) << i << ": " << out[i];
          up += out[i] == 2.0f ? 1 : 0;
          if (i + 3 < n) {
            agree += out[i] == out[i + 3] ? 1 : 0;
            pairs += 1;
          }
        }
      }
      const double sd = std::sqrt(p * (1 - p) / draws);
      EXPECT_NEAR(up / draws, p, 5 * sd) << "round-up rate; ceil(f 2^b) / 2^b expected";
      if (f == 0.5f) {
        EXPECT_NEAR(agree / pairs, 0.5, 5 * 0.5 / std::sqrt(pairs)) << "elements 3 apart";
      }
    }
  }
}

TEST(Natural, DeterministicPerSeedStepAndTensor) {
  Plugin plugin("natural");
  Instance c(plugin);
  const uint64_t n = 30000;
  const auto g = gaussian(n, 5);
  const auto info = tensorInfo(n, {.step = 1, .seed = 2, .tensor_id = 3});
  const Bytes a = c.compress(info, g);
  EXPECT_EQ(c.compress(info, g), a);
  EXPECT_NE(c.compress(tensorInfo(n, {.step = 2, .seed = 2, .tensor_id = 3}), g), a);
  EXPECT_NE(c.compress(tensorInfo(n, {.step = 1, .seed = 3, .tensor_id = 3}), g), a);
  EXPECT_NE(c.compress(tensorInfo(n, {.step = 1, .seed = 2, .tensor_id = 4}), g), a);
  // Element i's draw is its own: a prefix decodes as the whole tensor's first elements.
  const auto full = c.decode(info, a);
  const std::vector<float> head(g.begin(), g.begin() + 1000);
  const auto hinfo = tensorInfo(1000, {.step = 1, .seed = 2, .tensor_id = 3});
  const auto part = c.decode(hinfo, c.compress(hinfo, head));
  for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], full[i]) << i;
}

// The payload, byte for byte, against the format's definition computed here element by element: exponent byte i =
// roundedExponent(g_i, element i's draw at width b), read through PhiloxStream::drawBits (not the plugin's group
// loops), sign bit i = g_i's, at every draw width and on several threads (ranges of whole groups), on a tensor long
// enough to be cut (4 x 2^16 + 77 elements) with subnormals, zeros and an odd tail.
TEST(Natural, PayloadMatchesTheElementwiseDefinition) {
  Plugin plugin("natural");
  const uint64_t n = 4 * (uint64_t{1} << 16) + 77;
  auto g = gaussian(n, 17);
  for (uint64_t i = 0; i < n; i += 1009) g[i] *= 1e-39f;  // subnormal
  g[5] = 0.0f;
  g[6] = -0.0f;
  const auto info = tensorInfo(n, {.step = 7, .seed = 3, .tensor_id = 2});
  const sdk::PhiloxStream rng(info.seed, info.step, info.tensor_id);
  for (const unsigned b : {24u, 16u, 8u}) {
    Bytes want(naturalExpectedBytes(n), std::byte{0});
    std::memcpy(want.data(), Instance(plugin).compress(info, g).data(), 32);  // the header and the parameters
    const uint64_t signs = 32 + (n + 7) / 8 * 8;
    for (uint64_t i = 0; i < n; ++i) {
      want[32 + i] = static_cast<std::byte>(math::roundedExponent(g[i], rng.drawBits(i, b)));
      if (std::signbit(g[i])) want[signs + i / 64 * 8 + i % 64 / 8] |= static_cast<std::byte>(1u << (i % 8));
    }
    for (const char* threads : {"1", "4"}) {
      Instance c(plugin, {{"rounding_bits", std::to_string(b)}, {"threads", threads}});
      ASSERT_TRUE(c.compress(info, g) == want) << "rounding_bits " << b << ", threads " << threads;
    }
  }
}

TEST(Natural, RefusesInputsWithNoPowerOfTwo) {
  Plugin plugin("natural");
  Instance c(plugin);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::max()}) {
    std::vector<float> g(100, 1.0f);
    g[77] = bad;
    // FLT_MAX rounds up past 2^127 with probability 1 - 2^-23 per draw: find a step where it does.
    bool refused = false;
    for (uint64_t step = 0; step < 4 && !refused; ++step) {
      Bytes out;
      const terse_status_v1 s = c.tryCompress(tensorInfo(100, {.step = step}), g, &out);
      if (s == TERSE_OK) continue;
      refused = true;
      EXPECT_EQ(s, TERSE_ERR_INVALID_ARGUMENT);
      EXPECT_NE(c.lastError().find("gradient element 77"), std::string::npos) << c.lastError();
    }
    EXPECT_TRUE(refused) << bad;
  }
  std::vector<float> edge(10, std::ldexp(1.0f, 127));  // 2^127 itself is a power of two
  EXPECT_EQ(c.decode(tensorInfo(10), c.compress(tensorInfo(10), edge)), edge);
}

TEST(Natural, RejectsMalformedPayloads) {
  Plugin plugin("natural");
  Instance c(plugin);
  const uint64_t n = 45;  // 45 exponent bytes padded to 48, one sign word with 19 padding bits
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, gaussian(n, 4));
  expectRejectsStructuralDamage(c, info, p);
  expectRejectsStructuralDamage(c, tensorInfo(0), c.compress(tensorInfo(0), std::vector<float>{}));
  auto expectBad = [&](const Bytes& q, const char* what, const char* message) {
    const DecodeOutcome o = decodeOutcome(c, info, q, /*accumulate=*/true);
    EXPECT_EQ(o.status, TERSE_ERR_INVALID_PAYLOAD) << what;
    EXPECT_TRUE(o.untouched) << what;
    EXPECT_NE(c.lastError().find(message), std::string::npos) << what << ": " << c.lastError();
  };
  expectBad(patched<uint32_t>(p, 16, 9), "exponent bits changed", "exponent bits=9");
  expectBad(patched<uint32_t>(p, 20, 1), "reserved set", "reserved=1");
  expectBad(patched<uint64_t>(p, 24, 2), "second reserved set", "reserved=0, 2");
  expectBad(patched<uint8_t>(p, 32 + 17, 255), "exponent 255", "exponent 17 is 255");
  expectBad(patched<uint8_t>(p, 32 + 46, 1), "padding after the exponents", "after the exponents");
  const size_t signs = 32 + 48;
  expectBad(patched<uint64_t>(p, signs, readAt<uint64_t>(p, signs) | (uint64_t{1} << 50)), "padding bit",
            "padding bits after the last sign");
}

}  // namespace
}  // namespace terse::testing
