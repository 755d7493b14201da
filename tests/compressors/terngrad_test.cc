// terngrad: exact sizes and layout, values in {-s, 0, +s} with s the bucket's max |g|, signs kept, the largest element
// always sent, unbiasedness over many steps with a bound from the Bernoulli variance, whole-tensor buckets,
// determinism, and validation of untrusted payloads (code 3, bad scalers, padding, parameters).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "terse/sdk/bitpack.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

namespace bitpack = sdk::bitpack;

uint64_t terngradExpectedBytes(uint64_t n, uint64_t bucket) {
  return 32 + (4 * bucketsOf(n, bucket) + 7) / 8 * 8 + 8 * ((n + 31) / 32);
}
std::vector<float> terngradScales(const Bytes& p, uint64_t n, uint64_t bucket) {
  std::vector<float> v(bucketsOf(n, bucket));
  if (!v.empty()) std::memcpy(v.data(), p.data() + 32, 4 * v.size());
  return v;
}

TEST(TernGrad, ParametersCapsAndSizes) {
  Plugin plugin("terngrad");
  Instance bad(plugin, {{"bucket_size", "-1"}});
  EXPECT_EQ(bad.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(bad.lastError().find("terngrad: 'bucket_size' must be a non-negative integer, got '-1'"), std::string::npos)
      << bad.lastError();
  Instance clip(plugin, {{"clip", "2.5"}});
  EXPECT_EQ(clip.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << "clipping is not implemented, so it is not accepted";

  Instance c(plugin);
  const auto caps = c.caps();
  EXPECT_EQ(caps.devices, kCudaPluginDevices);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_ALLGATHER);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);
  // 2^20 elements: 2048 scalers and 2 bits per element.
  EXPECT_EQ(c.sizes(tensorInfo(uint64_t{1} << 20)).max_output_bytes, 32u + 8192u + 262144u);
  for (uint64_t bucket : {0ull, 1ull, 5ull, 512ull}) {
    Instance t(plugin, {{"bucket_size", std::to_string(bucket)}});
    for (uint64_t n : {0ull, 1ull, 31ull, 32ull, 33ull, 1000ull}) {
      ASSERT_EQ(t.sizes(tensorInfo(n)).max_output_bytes, terngradExpectedBytes(n, bucket)) << bucket << " " << n;
      EXPECT_EQ(t.compress(tensorInfo(n), gaussian(n, 3)).size(), terngradExpectedBytes(n, bucket));
    }
  }
}

TEST(TernGrad, ValuesAreTernaryTimesTheBucketMax) {
  Plugin plugin("terngrad");
  for (uint64_t bucket : {0ull, 1ull, 7ull, 64ull, 512ull}) {
    Instance c(plugin, {{"bucket_size", std::to_string(bucket)}});
    for (uint64_t n : {1ull, 2ull, 65ull, 1001ull}) {
      auto g = gaussian(n, static_cast<uint32_t>(n * 31 + bucket));
      if (n > 10) g[2] = 0.0f, g[3] = -0.0f;
      const auto info = tensorInfo(n, {.step = bucket});
      const Bytes p = c.compress(info, g);
      const auto s = terngradScales(p, n, bucket);
      const uint64_t b_size = bucket == 0 ? n : bucket;
      for (uint64_t b = 0; b < s.size(); ++b) {
        float mx = 0;
        for (uint64_t i = b * b_size; i < std::min(n, (b + 1) * b_size); ++i) mx = std::max(mx, std::fabs(g[i]));
        ASSERT_EQ(s[b], mx) << "bucket " << b;
      }
      const auto out = c.decode(info, p);
      for (uint64_t i = 0; i < n; ++i) {
        const float sb = s[i / b_size];
        ASSERT_TRUE(out[i] == 0.0f || out[i] == sb || out[i] == -sb) << i;
        if (out[i] != 0.0f) {
          ASSERT_EQ(out[i] < 0, g[i] < 0) << i;
        }
        if (std::fabs(g[i]) == sb && sb > 0) {
          ASSERT_EQ(out[i], g[i]) << "the bucket's max is always sent";
        }
        if (g[i] == 0.0f) {
          ASSERT_EQ(out[i], 0.0f);
        }
      }
    }
  }
}

TEST(TernGrad, CodesFollowTheDocumentedLayout) {
  Plugin plugin("terngrad");
  Instance c(plugin, {{"bucket_size", "10"}});
  const uint64_t n = 70;
  const auto g = gaussian(n, 1);
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, g);
  EXPECT_EQ(readAt<uint64_t>(p, 16), 10u);
  EXPECT_EQ(readAt<uint32_t>(p, 24), 2u);
  EXPECT_EQ(readAt<uint32_t>(p, 28), 0u);
  const auto s = terngradScales(p, n, 10);
  std::vector<uint64_t> words(3);
  std::memcpy(words.data(), p.data() + 32 + 32, 24);
  const auto out = c.decode(info, p);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t code = bitpack::get(words.data(), i, 2);
    const float want = code == 0 ? 0.0f : code == 1 ? s[i / 10] : -s[i / 10];
    ASSERT_LT(code, 3u);
    EXPECT_EQ(out[i], want) << i;
  }
}

// E[T(g)_i] = g_i with Var = s |g_i| - g_i^2 <= s^2 / 4. Over K steps, every element's mean within 5 standard
// deviations of the bound, and the average squared z-score (with the exact variance) near 1.
TEST(TernGrad, UnbiasedOverManySteps) {
  Plugin plugin("terngrad");
  Instance c(plugin, {{"bucket_size", "50"}});
  const uint64_t n = 200;
  const auto g = gaussian(n, 99);
  const int steps = 4000;
  RunningMoments m(n);
  std::vector<float> s;
  for (int k = 0; k < steps; ++k) {
    const auto info = tensorInfo(n, {.step = static_cast<uint64_t>(k), .seed = 5});
    const Bytes p = c.compress(info, g);
    if (k == 0) s = terngradScales(p, n, 50);
    m.add(c.decode(info, p));
  }
  double z2 = 0;
  int counted = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double sb = s[i / 50];
    const double dev = m.mean(i) - g[i];
    EXPECT_LE(std::fabs(dev), 5 * sb * 0.5 / std::sqrt(static_cast<double>(steps)) + 1e-6) << i;
    const double var = sb * std::fabs(g[i]) - static_cast<double>(g[i]) * g[i];
    if (var > 1e-6) {
      z2 += dev * dev / (var / steps);
      ++counted;
    }
  }
  EXPECT_LT(z2 / counted, 1.5) << "mean squared z-score; 1 expected for an unbiased quantizer";
}

TEST(TernGrad, DeterministicPerSeedStepAndTensor) {
  Plugin plugin("terngrad");
  Instance c(plugin);
  const uint64_t n = 3000;
  const auto g = gaussian(n, 5);
  const auto info = tensorInfo(n, {.step = 1, .seed = 2, .tensor_id = 3});
  const Bytes a = c.compress(info, g);
  EXPECT_EQ(c.compress(info, g), a);
  EXPECT_NE(c.compress(tensorInfo(n, {.step = 2, .seed = 2, .tensor_id = 3}), g), a);
  EXPECT_NE(c.compress(tensorInfo(n, {.step = 1, .seed = 3, .tensor_id = 3}), g), a);
  EXPECT_NE(c.compress(tensorInfo(n, {.step = 1, .seed = 2, .tensor_id = 4}), g), a);
  // Element i's draw is its own: a prefix ending on a bucket boundary decodes identically.
  const auto full = c.decode(info, a);
  const std::vector<float> head(g.begin(), g.begin() + 1024);
  const auto hinfo = tensorInfo(1024, {.step = 1, .seed = 2, .tensor_id = 3});
  const auto part = c.decode(hinfo, c.compress(hinfo, head));
  for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], full[i]) << i;
}

TEST(TernGrad, EmptyOddAndAccumulate) {
  Plugin plugin("terngrad");
  Instance c(plugin);
  EXPECT_EQ(c.compress(tensorInfo(0), std::vector<float>{}).size(), 32u);
  const uint64_t n = (uint64_t{1} << 20) + 3;
  const auto g = gaussian(n, 8);
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, g);
  EXPECT_EQ(p.size(), terngradExpectedBytes(n, 512));
  const auto plain = c.decode(info, p);
  std::vector<float> out(n, 2.0f);
  ASSERT_EQ(c.decompress(info, p, out, /*accumulate=*/true), TERSE_OK);
  for (uint64_t i = 0; i < n; i += 1009) ASSERT_EQ(out[i], 2.0f + plain[i]) << i;
}

TEST(TernGrad, RefusesNonFiniteGradients) {
  Plugin plugin("terngrad");
  Instance c(plugin, {{"bucket_size", "4"}});
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> g(10, 1.0f);
    g[9] = bad;
    Bytes out;
    EXPECT_EQ(c.tryCompress(tensorInfo(10), g, &out), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(c.lastError().find("starting at element 8"), std::string::npos) << c.lastError();
  }
}

TEST(TernGrad, RejectsMalformedPayloads) {
  Plugin plugin("terngrad");
  Instance c(plugin, {{"bucket_size", "16"}});
  const uint64_t n = 45;  // 90 bits of codes in 2 words: 38 padding bits
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
  expectBad(patched<uint64_t>(p, 16, 0), "bucket size changed", "bucket_size=0");
  expectBad(patched<uint32_t>(p, 24, 3), "code bits changed", "code bits=3");
  expectBad(patched<uint32_t>(p, 28, 1), "reserved set", "reserved=1");
  expectBad(patched<float>(p, 32, -0.5f), "negative scaler", "bucket 0 has scaler -0.5");
  expectBad(patched<float>(p, 40, std::numeric_limits<float>::infinity()), "infinite scaler", "bucket 2");
  expectBad(patched<float>(p, 36, std::nanf("")), "NaN scaler", "bucket 1");
  expectBad(patched<uint8_t>(p, 46, 1), "padding after the scalers", "after the scalers: nonzero padding");
  const size_t codes = 32 + 16;  // 3 scalers, padded to 16 bytes
  expectBad(patched<uint64_t>(p, codes, readAt<uint64_t>(p, codes) | (uint64_t{3} << 20)), "code 3", "holds code 3");
  expectBad(patched<uint64_t>(p, codes + 8, readAt<uint64_t>(p, codes + 8) | (uint64_t{1} << 40)), "padding bit",
            "padding");
}

}  // namespace
}  // namespace terse::testing
