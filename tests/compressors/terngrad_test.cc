// terngrad: exact sizes and layout, values in {-s, 0, +s} with s the bucket's max |g|, signs kept, the largest element
// always sent, unbiasedness over many steps with a bound from the Bernoulli variance, whole-tensor buckets,
// determinism, and validation of untrusted payloads (code 3, bad scalers, padding, parameters).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/terngrad/terngrad_host.h"
#include "compressors/terngrad/terngrad_math.h"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/philox.hpp"
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
  for (const char* b : {"0", "4", "12", "32", "-8", "sixteen"}) {
    Instance rounding(plugin, {{"rounding_bits", b}});
    EXPECT_EQ(rounding.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << b;
    EXPECT_NE(
        rounding.lastError().find("terngrad: 'rounding_bits' must be one of {8, 16, 24}, got '" + std::string(b) + "'"),
        std::string::npos)
        << rounding.lastError();
  }
  for (const char* b : {"8", "16", "24"}) {
    Instance rounding(plugin, {{"rounding_bits", b}});
    EXPECT_TRUE(rounding.ok()) << b << ": " << rounding.lastError();
  }

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

// rounding_bits b: an element is sent iff r 2^-b s < |g| with r uniform on b bits, so P(sent) = ceil(f 2^b) / 2^b for
// f = |g| / s, and E[T(g)] - g = s (P(sent) - f), in [0, s 2^-b): the one level's step is s. Buckets of 512 whose first
// element is 1 (the scaler) and the rest 2^-9 (f = 1/512: 8-bit draws send with probability 1/256, r = 0 only; 16-
// and 24-bit draws with 1/512) or 0.5 (f = 1/2 at every b), 2^18 elements over 4 steps: the rate within 5 sigma of
// the formula (1/256 and 1/512 are 32 sigma apart), the mean decode within 5 sigma of g + s (P(sent) - f) and below
// the bound, and at f = 1/2, elements d = 1, 2, 3, 4, 8, 16 apart agreeing half the time (independent draws).
TEST(TernGrad, RoundingBitsGiveTheirSendRateAndBias) {
  Plugin plugin("terngrad");
  const uint64_t n = uint64_t{1} << 18, bucket = 512;
  const int steps = 4;
  for (const unsigned b : {24u, 16u, 8u}) {
    for (const float f : {1.0f / 512, 0.5f}) {
      SCOPED_TRACE("rounding_bits " + std::to_string(b) + ", f " + std::to_string(f));
      Instance c(plugin, {{"rounding_bits", std::to_string(b)}});
      ASSERT_TRUE(c.ok()) << c.lastError();
      std::vector<float> g(n, f);
      for (uint64_t i = 0; i < n; i += bucket) g[i] = 1.0f;
      const double scale = std::ldexp(1.0, static_cast<int>(b));
      const double p = std::ceil(f * scale) / scale;
      const double draws = static_cast<double>(n - n / bucket) * steps;
      double sent = 0, sum = 0;
      const uint64_t lags[] = {1, 2, 3, 4, 8, 16};
      double agree[std::size(lags)] = {}, pairs[std::size(lags)] = {};
      for (int step = 0; step < steps; ++step) {
        const auto info = tensorInfo(n, {.step = static_cast<uint64_t>(step), .seed = 41});
        const auto out = c.decode(info, c.compress(info, g));
        for (uint64_t i = 0; i < n; ++i) {
          if (i % bucket == 0) {
            ASSERT_EQ(out[i], 1.0f) << "the scaler's own element is always sent";
            continue;
          }
          ASSERT_TRUE(out[i] == 0.0f || out[i] == 1.0f) << i << ": " << out[i];
          sent += out[i];
          sum += out[i];
          for (size_t k = 0; k < std::size(lags); ++k) {
            if (i + lags[k] < n && (i + lags[k]) % bucket != 0) {
              agree[k] += out[i] == out[i + lags[k]] ? 1 : 0;
              pairs[k] += 1;
            }
          }
        }
      }
      const double sd = std::sqrt(p * (1 - p) / draws);
      EXPECT_NEAR(sent / draws, p, 5 * sd) << "send rate; ceil(f 2^b) / 2^b expected";
      const double bias = sum / draws - f;
      EXPECT_NEAR(bias, p - f, 5 * sd) << "mean decode minus g";
      EXPECT_LE(bias, 1.0 / scale + 5 * sd) << "the documented bound s 2^-b";
      if (f == 0.5f) {
        for (size_t k = 0; k < std::size(lags); ++k) {
          EXPECT_NEAR(agree[k] / pairs[k], 0.5, 5 * 0.5 / std::sqrt(pairs[k])) << "elements " << lags[k] << " apart";
        }
      }
    }
  }
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

// ---- The host's vector loops (terngrad_host.h) against the scalar math they must reproduce bit for bit.

// Every vector loop this host runs against ternarizeGroupsScalar at draw width B (which reads the draws through
// sdk::drawAt, checked against the documented layout by PayloadMatchesTheElementwiseDefinition).
template <unsigned B>
void ternCheckVectorLoops() {
  namespace host = compressors::terngrad::host;
  std::vector<std::pair<const char*, host::TernarizeGroups>> loops;
#if TERSE_TERNGRAD_X86
  if (__builtin_cpu_supports("avx2")) loops.emplace_back("AVX2", host::ternarizeGroupsAvx2<B>);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("bmi2")) {
    loops.emplace_back("AVX-512", host::ternarizeGroupsAvx512<B>);
  }
#endif
  if (loops.empty()) GTEST_SKIP() << "this host has neither AVX2 nor AVX-512F";
  SCOPED_TRACE("rounding_bits " + std::to_string(B));
  const uint64_t groups = 5, n = groups * 64;
  const auto bits = awkwardStreamWords(n, 17);
  std::vector<std::vector<float>> inputs = {awkwardInput(n, 3), gaussian(n, 4, 1e-42f), std::vector<float>(n, 0.0f)};
  for (uint64_t i = 0; i < n; i += 3) inputs[2][i] = -0.0f;
  for (const auto& x : inputs) {
    // The bucket's own scale, and scales below and above it (codes that saturate, or that are all 0).
    const float max = compressors::terngrad::bucketMaxAbs(x.data(), n);
    for (const float scale : {max, max * 0.5f, max * 4.0f, 0.0f}) {
      std::vector<uint64_t> want(groups * 2), got(groups * 2);
      host::ternarizeGroupsScalar<B>(x.data(), scale, bits.data(), groups, want.data());
      for (const auto& [name, loop] : loops) {
        std::fill(got.begin(), got.end(), ~uint64_t{0});
        loop(x.data(), scale, bits.data(), groups, got.data());
        for (uint64_t k = 0; k < got.size(); ++k) {
          ASSERT_EQ(got[k], want[k]) << name << ", scale " << scale << ": word " << k;
        }
      }
    }
  }
}

TEST(TernGrad, VectorLoopsMatchTheScalarLoop) {
  ternCheckVectorLoops<24>();
  ternCheckVectorLoops<16>();
  ternCheckVectorLoops<8>();
}

// The vector bucket maxima against bucketMaxAbs, bit for bit: lengths around the 16-lane vectors and the 64-element
// unrolled steps, the largest magnitude in the masked tail, and inf and NaN (whose bits a max over magnitudeBits
// keeps).
TEST(TernGrad, VectorMaxLoopsMatchBucketMaxAbs) {
  namespace host = compressors::terngrad::host;
  std::vector<std::pair<const char*, host::BucketMaxAbs>> loops;
#if TERSE_TERNGRAD_X86
  if (__builtin_cpu_supports("avx2")) loops.emplace_back("AVX2", host::bucketMaxAbsAvx2);
  if (__builtin_cpu_supports("avx512f")) loops.emplace_back("AVX-512", host::bucketMaxAbsAvx512);
#endif
  if (loops.empty()) GTEST_SKIP() << "this host has neither AVX2 nor AVX-512F";
  for (const uint64_t n : {uint64_t{1}, uint64_t{15}, uint64_t{16}, uint64_t{17}, uint64_t{63}, uint64_t{64},
                           uint64_t{65}, uint64_t{100}, uint64_t{511}, uint64_t{512}, uint64_t{513}}) {
    auto x = awkwardInput(n, static_cast<uint32_t>(n));
    for (const float special :
         {0.0f, -7e30f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()}) {
      for (const uint64_t at : {uint64_t{0}, n / 2, n - 1}) {
        auto y = x;
        if (special != 0.0f || std::isnan(special)) y[at] = special;
        const uint32_t want = sdk::floatBits(compressors::terngrad::bucketMaxAbs(y.data(), n));
        for (const auto& [name, loop] : loops) {
          EXPECT_EQ(sdk::floatBits(loop(y.data(), n)), want) << name << ", n " << n << ", " << special << " at " << at;
        }
      }
    }
  }
}

// The payload of compress, whatever loops this host picks (vector runs of up to 16 groups, groups straddling buckets,
// short last groups, several threads, one whole-tensor bucket), against one built here element by element from
// terngrad_math.h and PhiloxStream::bits.
TEST(TernGrad, PayloadMatchesTheElementwiseDefinition) {
  Plugin plugin("terngrad");
  struct Case {
    uint64_t bucket, n, threads;
    unsigned rounding_bits = 24;
  };
  // At 16 and 8 bits: buckets, runs and thread ranges that start inside a Philox group of the shorter draws.
  for (const Case k :
       {Case{512, 100000, 1},     Case{2048, 9000, 1},      Case{96, 1001, 1},       Case{16, 100, 1},
        Case{1, 70, 1},           Case{0, 70000, 1},        Case{4097, 20000, 3},    Case{512, 63, 1},
        Case{100, 6400, 2},       Case{512, 100000, 1, 16}, Case{512, 100000, 1, 8}, Case{96, 1001, 1, 16},
        Case{96, 1001, 1, 8},     Case{1, 70, 1, 8},        Case{0, 70000, 1, 16},   Case{4097, 20000, 3, 8},
        Case{1088, 20000, 3, 16}, Case{1088, 20000, 3, 8},  Case{512, 63, 1, 16},    Case{100, 6400, 2, 8}}) {
    Instance c(plugin, {{"bucket_size", std::to_string(k.bucket)},
                        {"threads", std::to_string(k.threads)},
                        {"rounding_bits", std::to_string(k.rounding_bits)}});
    const auto info = tensorInfo(k.n, {.step = 5, .seed = 99});
    const uint64_t bucket = k.bucket == 0 ? k.n : std::min(k.bucket, k.n);
    const auto x = awkwardInput(k.n, static_cast<uint32_t>(k.n), bucket);
    const Bytes p = c.compress(info, x);
    const sdk::PhiloxStream s(info.seed, info.step, info.tensor_id);
    std::vector<float> scales(bucketsOf(k.n, bucket));
    std::vector<uint32_t> codes(k.n);
    for (uint64_t b = 0; b < scales.size(); ++b) {
      scales[b] = compressors::terngrad::bucketMaxAbs(x.data() + b * bucket, std::min(bucket, k.n - b * bucket));
    }
    for (uint64_t i = 0; i < k.n; ++i) {
      codes[i] = compressors::terngrad::quantizeValue(x[i], scales[i / bucket], referenceDraw(s, i, k.rounding_bits));
    }
    std::vector<uint64_t> words(bitpack::wordCount(k.n, 2));
    bitpack::pack(2, codes.data(), k.n, words.data());
    const std::string label = "bucket " + std::to_string(k.bucket) + ", n " + std::to_string(k.n) + ", threads " +
                              std::to_string(k.threads) + ", rounding_bits " + std::to_string(k.rounding_bits);
    const size_t codes_at = 32 + (4 * scales.size() + 7) / 8 * 8;
    ASSERT_EQ(p.size(), codes_at + 8 * words.size()) << label;
    EXPECT_EQ(std::memcmp(p.data() + 32, scales.data(), 4 * scales.size()), 0) << label << ": the scalers differ";
    for (uint64_t w = 0; w < words.size(); ++w) {
      uint64_t word = 0;
      std::memcpy(&word, p.data() + codes_at + 8 * w, 8);
      ASSERT_EQ(word, words[w]) << label << ": word " << w << " (elements " << 32 * w << " to " << 32 * w + 31 << ")";
    }
  }
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
