// onebit: exact wire sizes (1 bit per element really), Seide's two-means reconstruction and the scaled sign computed
// independently here, the sign-bit layout, determinism, and validation of untrusted payloads.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/onebit/onebit_host.h"
#include "compressors/onebit/onebit_math.h"
#include "terse/sdk/bitpack.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

TEST(OneBit, ParametersCapsAndSizes) {
  Plugin plugin("onebit");
  Instance bad(plugin, {{"scale", "median"}});
  EXPECT_EQ(bad.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(bad.lastError().find("onebit: 'scale' must be one of {two_means, mean_abs}, got 'median'"),
            std::string::npos)
      << bad.lastError();

  Instance c(plugin);
  const auto caps = c.caps();
  EXPECT_EQ(caps.devices, kCudaPluginDevices);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_ALLGATHER);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);

  // N = 1000, default two_means, 512-element buckets: 32 bytes of header and parameters, 2 buckets x 2 scales x 4
  // bytes, and ceil(1000 / 64) = 16 words = 128 bytes of signs (125 bytes of bits rounded up to whole words).
  EXPECT_EQ(c.sizes(tensorInfo(1000)).max_output_bytes, 32u + 16u + 128u);
  Instance mean_abs(plugin, {{"scale", "mean_abs"}});
  EXPECT_EQ(mean_abs.sizes(tensorInfo(1000)).max_output_bytes, 32u + 8u + 128u);
  // N = 2^20: exactly N / 8 bytes of signs.
  EXPECT_EQ(c.sizes(tensorInfo(uint64_t{1} << 20)).max_output_bytes, 32u + 2048u * 8u + 131072u);
  for (const char* mode : {"two_means", "mean_abs"}) {
    for (uint64_t bucket : {0ull, 1ull, 3ull, 512ull}) {
      Instance o(plugin, {{"scale", mode}, {"bucket_size", std::to_string(bucket)}});
      const uint64_t k = std::string(mode) == "two_means" ? 2 : 1;
      for (uint64_t n : {0ull, 1ull, 63ull, 64ull, 65ull, 1000ull}) {
        const uint64_t want = 32 + (4 * k * bucketsOf(n, bucket) + 7) / 8 * 8 + 8 * ((n + 63) / 64);
        ASSERT_EQ(o.sizes(tensorInfo(n)).max_output_bytes, want) << mode << " " << bucket << " " << n;
        EXPECT_EQ(o.compress(tensorInfo(n), gaussian(n, 2)).size(), want);
      }
    }
  }
}

// Decoded values computed here from the definitions, in double: two_means gives each side its own mean, mean_abs
// gives every element sign * mean |g|; the side is the IEEE sign bit (+0 positive, -0 negative).
// The CUDA kernels sum a bucket one lane per thread (laneBucketSums) and close with combineLanes: together they must be
// bucketSums bit for bit, or the GPU's scales would differ from the CPU's.
TEST(OneBit, LaneSumsCombineToBucketSumsBitForBit) {
  namespace math = compressors::onebit;
  for (uint64_t n : {0ull, 1ull, 7ull, 15ull, 16ull, 17ull, 127ull, 128ull, 129ull, 1000ull, 100003ull}) {
    std::vector<float> x = gaussian(static_cast<size_t>(n), static_cast<uint32_t>(n) + 5);
    for (size_t i = 0; i < x.size(); i += 5) x[i] *= 1e5f;  // a wide range: another order would round differently
    if (n > 2) x[1] = -0.0f;
    double pos[math::kLanes], neg[math::kLanes], cnt[math::kLanes];
    for (unsigned l = 0; l < math::kLanes; ++l) {
      const math::BucketSums lane = math::laneBucketSums(x.data(), n, l);
      pos[l] = lane.positive, neg[l] = lane.negative_abs, cnt[l] = lane.negatives;
    }
    const math::BucketSums combined = math::combineLanes(pos, neg, cnt);
    const math::BucketSums reference = math::bucketSums(x.data(), n);
    EXPECT_EQ(0, std::memcmp(&combined.positive, &reference.positive, sizeof(double))) << "n=" << n;
    EXPECT_EQ(0, std::memcmp(&combined.negative_abs, &reference.negative_abs, sizeof(double))) << "n=" << n;
    EXPECT_EQ(combined.negatives, reference.negatives) << "n=" << n;
  }
}

// ---- The host's vector loop (onebit_host.h) against the scalar math it must reproduce bit for bit.

// Inputs that stress the sums' order and the sign bits: a wide range of magnitudes (another order of additions would
// round differently), zeros of both signs, subnormals, and, where `special`, an inf or a NaN.
std::vector<float> oneBitHostInput(uint64_t n, uint32_t seed, int special) {
  std::vector<float> x = gaussian(static_cast<size_t>(n), seed);
  for (size_t i = 0; i < x.size(); i += 5) x[i] *= 1e6f;
  for (size_t i = 3; i < x.size(); i += 7) x[i] *= 1e-6f;
  for (size_t i = 4; i < x.size(); i += 11) x[i] = (i & 1) != 0 ? -0.0f : 0.0f;
  for (size_t i = 6; i < x.size(); i += 13) x[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i);
  for (size_t i = 9; i < x.size(); i += 17) x[i] = -std::numeric_limits<float>::denorm_min() * static_cast<float>(i);
  if (special != 0 && n > 0) {
    const float v[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
    x[(seed * 7919u) % n] = v[(special - 1) % 4];
  }
  return x;
}

// Equal bits, or both NaN (which NaN an addition of two NaNs keeps is the compiler's choice of operand order, and a
// NaN sum makes compress refuse the tensor whatever its bits).
void expectSameDouble(double got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
  } else {
    EXPECT_EQ(0, std::memcmp(&got, &want, sizeof got)) << what << ": " << got << " vs " << want;
  }
}

TEST(OneBit, HostVectorSumsAndSignsMatchTheScalarBitForBit) {
  namespace math = compressors::onebit;
  namespace host = compressors::onebit::host;
  // Every loop this host runs, each with and without the sign words.
  std::vector<std::pair<const char*, host::SumsAndSigns>> loops;
#if TERSE_ONEBIT_X86
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt")) {
    loops.emplace_back("AVX2", host::sumsAndSignsAvx2<true>);
    loops.emplace_back("AVX2 sums", host::sumsAndSignsAvx2<false>);
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("popcnt")) {
    loops.emplace_back("AVX-512", host::sumsAndSignsAvx512<true>);
    loops.emplace_back("AVX-512 sums", host::sumsAndSignsAvx512<false>);
  }
#endif
  if (loops.empty()) GTEST_SKIP() << "this host has neither AVX2 nor AVX-512F: compress runs the scalar loops only";
  // Sizes around rows (16), groups (64) and chunks (128), a large one, and the special values at every position kind.
  for (uint64_t n : {0ull,   1ull,   15ull,  16ull,  17ull,  63ull,  64ull,  65ull,  100ull, 127ull,  128ull,
                     129ull, 191ull, 192ull, 255ull, 256ull, 257ull, 511ull, 512ull, 513ull, 1000ull, 100003ull}) {
    for (int special = 0; special <= 4; ++special) {
      const std::vector<float> x = oneBitHostInput(n, static_cast<uint32_t>(n) + 11, special);
      const std::string what = "n=" + std::to_string(n) + " special=" + std::to_string(special);
      const math::BucketSums want = math::bucketSums(x.data(), n);
      const uint64_t nwords = (n + 63) / 64;
      std::vector<uint64_t> want_words(nwords + 1, 0);
      for (uint64_t i = 0; i < n; ++i) want_words[i / 64] |= uint64_t{math::signBit(x[i])} << (i % 64);
      want_words[nwords] = 0xA5A5A5A5A5A5A5A5ull;  // the word past the end stays untouched
      for (size_t v = 0; v < loops.size(); ++v) {
        const bool with_words = v % 2 == 0;
        std::vector<uint64_t> words(nwords + 1, 0xA5A5A5A5A5A5A5A5ull);
        const math::BucketSums got = loops[v].second(x.data(), n, with_words ? words.data() : nullptr);
        const std::string where = what + " " + loops[v].first;
        expectSameDouble(got.positive, want.positive, where + " positive");
        expectSameDouble(got.negative_abs, want.negative_abs, where + " negative_abs");
        EXPECT_EQ(got.negatives, want.negatives) << where;
        if (with_words) {
          EXPECT_EQ(words, want_words) << where;
        }
      }
    }
  }
}

// The whole payload of compress, whatever loop this host picks (the one-pass loop for buckets that start a group, the
// vector sums with the scalar signs for the others, the scalar loops without AVX2), against one built here from
// the scalar math: bucket sizes that straddle groups and chunks, a whole-tensor bucket, both scale modes.
TEST(OneBit, CompressMatchesTheScalarPayloadForEveryBucketShape) {
  namespace math = compressors::onebit;
  Plugin plugin("onebit");
  for (const char* mode : {"two_means", "mean_abs"}) {
    const uint32_t k = std::string(mode) == "two_means" ? 2 : 1;
    for (uint64_t bucket : {0ull, 1ull, 3ull, 17ull, 64ull, 100ull, 128ull, 192ull, 320ull, 512ull, 1000ull}) {
      Instance c(plugin, {{"scale", mode}, {"bucket_size", std::to_string(bucket)}});
      for (uint64_t n : {1ull, 63ull, 64ull, 65ull, 129ull, 700ull, 4099ull, 70001ull}) {
        const std::vector<float> x = oneBitHostInput(n, static_cast<uint32_t>(n + bucket), 0);
        const Bytes p = c.compress(tensorInfo(n), x);
        const uint64_t b = bucket == 0 ? n : std::min(bucket, n);
        const uint64_t buckets = (n - 1) / b + 1;
        const size_t scales_at = 32, words_at = 32 + (4 * k * buckets + 7) / 8 * 8;
        ASSERT_EQ(p.size(), words_at + 8 * ((n + 63) / 64));
        const std::string what = std::string(mode) + " bucket=" + std::to_string(bucket) + " n=" + std::to_string(n);
        for (uint64_t j = 0; j < buckets; ++j) {
          const uint64_t len = std::min(b, n - j * b);
          const math::BucketSums s = math::bucketSums(x.data() + j * b, len);
          float pos = 0, neg = 0;
          if (k == 2) {
            math::twoMeans(s, len, &pos, &neg);
          } else {
            pos = neg = math::meanAbs(s, len);
          }
          ASSERT_EQ(readAt<uint32_t>(p, scales_at + 4 * k * j), sdk::floatBits(pos)) << what << " bucket " << j;
          if (k == 2) {
            ASSERT_EQ(readAt<uint32_t>(p, scales_at + 8 * j + 4), sdk::floatBits(neg)) << what << " bucket " << j;
          }
        }
        for (uint64_t w = 0; w < (n + 63) / 64; ++w) {
          uint64_t want = 0;
          for (uint64_t i = 64 * w; i < std::min(n, 64 * w + 64); ++i) {
            want |= uint64_t{math::signBit(x[i])} << (i % 64);
          }
          ASSERT_EQ(readAt<uint64_t>(p, words_at + 8 * w), want) << what << " word " << w;
        }
      }
    }
  }
}

TEST(OneBit, ReconstructionsMatchTheirDefinitions) {
  Plugin plugin("onebit");
  for (const char* mode : {"two_means", "mean_abs"}) {
    const bool two = std::string(mode) == "two_means";
    for (uint64_t bucket : {0ull, 1ull, 5ull, 64ull, 512ull}) {
      Instance c(plugin, {{"scale", mode}, {"bucket_size", std::to_string(bucket)}});
      for (uint64_t n : {1ull, 2ull, 100ull, 1000ull}) {
        auto g = gaussian(n, static_cast<uint32_t>(n + bucket), 1.0f, 0.3f);  // uneven sides
        if (n > 10) g[1] = 0.0f, g[2] = -0.0f;
        const auto info = tensorInfo(n);
        const auto out = c.decode(info, c.compress(info, g));
        const uint64_t b_size = bucket == 0 ? n : bucket;
        for (uint64_t b = 0; b * b_size < n; ++b) {
          const uint64_t lo = b * b_size, hi = std::min(n, lo + b_size);
          double pos = 0, neg = 0, abs_sum = 0;
          uint64_t npos = 0, nneg = 0;
          for (uint64_t i = lo; i < hi; ++i) {
            if (std::signbit(g[i])) {
              neg += g[i], ++nneg;
            } else {
              pos += g[i], ++npos;
            }
            abs_sum += std::fabs(g[i]);
          }
          for (uint64_t i = lo; i < hi; ++i) {
            double want;
            if (two) {
              want = std::signbit(g[i]) ? neg / static_cast<double>(nneg) : pos / static_cast<double>(npos);
            } else {
              want = (std::signbit(g[i]) ? -1 : 1) * abs_sum / static_cast<double>(hi - lo);
            }
            ASSERT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-30) << mode << " bucket " << bucket << " i " << i;
          }
          if (two) {
            // Two means preserve each bucket's sum.
            double decoded = 0;
            for (uint64_t i = lo; i < hi; ++i) decoded += out[i];
            EXPECT_NEAR(decoded, pos + neg, 1e-4 * (std::fabs(pos) + std::fabs(neg)) + 1e-6);
          }
        }
      }
    }
  }
}

TEST(OneBit, SignBitsAndScalesFollowTheDocumentedLayout) {
  Plugin plugin("onebit");
  Instance c(plugin, {{"bucket_size", "8"}});
  // Bucket 0: positives {1, 2, +0, 3}, negatives {1, 2, -0, 4} (the sign bit decides); bucket 1: all negative;
  // bucket 2: all positive.
  const std::vector<float> g = {1, -1, 2, -2, 0, -0.0f, 3, -4, -5, -7, -6, -6, -6, -6, -6, -6, 4, 5};
  const auto info = tensorInfo(g.size());
  const Bytes p = c.compress(info, g);
  ASSERT_EQ(p.size(), 32u + 24u + 8u);
  EXPECT_EQ(readAt<uint64_t>(p, 16), 8u);
  EXPECT_EQ(readAt<uint32_t>(p, 24), 0u) << "two_means";
  EXPECT_EQ(readAt<uint32_t>(p, 28), 2u) << "scales per bucket";
  EXPECT_EQ(readAt<float>(p, 32), 1.5f);
  EXPECT_EQ(readAt<float>(p, 36), 1.75f);
  EXPECT_EQ(readAt<float>(p, 40), 0.0f) << "no positives";
  EXPECT_EQ(readAt<float>(p, 44), 6.0f);
  EXPECT_EQ(readAt<float>(p, 48), 4.5f);
  EXPECT_EQ(readAt<float>(p, 52), 0.0f) << "no negatives";
  // Sign bits, LSB first: elements 1, 3, 5 (-0), 7 and 8..15.
  EXPECT_EQ(readAt<uint64_t>(p, 56), 0xFFAAu);
  EXPECT_EQ(c.decode(info, p), (std::vector<float>{1.5f, -1.75f, 1.5f, -1.75f, 1.5f, -1.75f, 1.5f, -1.75f, -6, -6, -6,
                                                   -6, -6, -6, -6, -6, 4.5f, 4.5f}));
}

TEST(OneBit, DeterministicAndIndependentOfTheSeed) {
  Plugin plugin("onebit");
  Instance c(plugin);
  const auto g = gaussian(5000, 3);
  const Bytes a = c.compress(tensorInfo(5000, {.step = 0, .seed = 1}), g);
  EXPECT_EQ(c.compress(tensorInfo(5000, {.step = 9, .seed = 2, .tensor_id = 4}), g), a);
}

TEST(OneBit, EmptyOddAndAccumulate) {
  Plugin plugin("onebit");
  Instance c(plugin);
  EXPECT_EQ(c.compress(tensorInfo(0), std::vector<float>{}).size(), 32u);
  const uint64_t n = (uint64_t{1} << 20) + 3;
  const auto g = gaussian(n, 8);
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, g);
  EXPECT_EQ(p.size(), 32 + (4 * 2 * 2049 + 7) / 8 * 8 + 8 * ((n + 63) / 64));
  const auto plain = c.decode(info, p);
  std::vector<float> out(n, -1.0f);
  ASSERT_EQ(c.decompress(info, p, out, /*accumulate=*/true), TERSE_OK);
  for (uint64_t i = 0; i < n; i += 1013) ASSERT_EQ(out[i], -1.0f + plain[i]) << i;
}

TEST(OneBit, RefusesNonFiniteGradients) {
  Plugin plugin("onebit");
  for (const char* mode : {"two_means", "mean_abs"}) {
    Instance c(plugin, {{"scale", mode}, {"bucket_size", "4"}});
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> g(10, 1.0f);
      g[5] = bad;
      Bytes out;
      EXPECT_EQ(c.tryCompress(tensorInfo(10), g, &out), TERSE_ERR_INVALID_ARGUMENT) << mode;
      EXPECT_NE(c.lastError().find("starting at element 4"), std::string::npos) << c.lastError();
    }
    // Buckets that start 64-element groups (the host's one-pass loop where it has one) and a whole-tensor bucket.
    for (const auto& [bucket, want] : {std::pair<const char*, const char*>{"64", "starting at element 128"},
                                       std::pair<const char*, const char*>{"0", "starting at element 0"}}) {
      Instance d(plugin, {{"scale", mode}, {"bucket_size", bucket}});
      for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> g = gaussian(300, 6);
        g[150] = bad;
        Bytes out;
        EXPECT_EQ(d.tryCompress(tensorInfo(300), g, &out), TERSE_ERR_INVALID_ARGUMENT) << mode << " " << bucket;
        EXPECT_NE(d.lastError().find(want), std::string::npos) << d.lastError();
      }
    }
  }
}

TEST(OneBit, RejectsMalformedPayloads) {
  Plugin plugin("onebit");
  Instance c(plugin, {{"bucket_size", "20"}});
  const uint64_t n = 50;  // 3 buckets, 6 scales (24 bytes), 1 word of which 14 bits are padding
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, gaussian(n, 4));
  ASSERT_EQ(p.size(), 32u + 24u + 8u);
  expectRejectsStructuralDamage(c, info, p);
  expectRejectsStructuralDamage(c, tensorInfo(0), c.compress(tensorInfo(0), std::vector<float>{}));
  auto expectBad = [&](const Bytes& q, const char* what, const char* message) {
    const DecodeOutcome o = decodeOutcome(c, info, q, /*accumulate=*/true);
    EXPECT_EQ(o.status, TERSE_ERR_INVALID_PAYLOAD) << what;
    EXPECT_TRUE(o.untouched) << what;
    EXPECT_NE(c.lastError().find(message), std::string::npos) << what << ": " << c.lastError();
  };
  expectBad(patched<uint64_t>(p, 16, 0), "bucket size changed", "bucket_size=0");
  expectBad(patched<uint32_t>(p, 24, 1), "scale mode changed", "scale mode 1");
  expectBad(patched<uint32_t>(p, 28, 1), "scales per bucket changed", "1 scales per bucket");
  expectBad(patched<float>(p, 36, -1.0f), "negative scale", "scale 1 (bucket 0) is -1");
  expectBad(patched<float>(p, 52, std::nanf("")), "NaN scale", "scale 5 (bucket 2)");
  expectBad(patched<float>(p, 40, std::numeric_limits<float>::infinity()), "infinite scale", "scale 2 (bucket 1)");
  expectBad(patched<uint64_t>(p, 56, readAt<uint64_t>(p, 56) | (uint64_t{1} << 50)), "padding bit", "padding");
  Instance mean_abs(plugin, {{"scale", "mean_abs"}, {"bucket_size", "20"}});
  EXPECT_EQ(decodeOutcome(mean_abs, info, p).status, TERSE_ERR_INVALID_PAYLOAD);
  // mean_abs with 3 buckets: 3 scales (12 bytes) and 4 bytes of padding before the signs.
  const Bytes q = mean_abs.compress(info, gaussian(n, 4));
  ASSERT_EQ(q.size(), 32u + 16u + 8u);
  const DecodeOutcome o = decodeOutcome(mean_abs, info, patched<uint8_t>(q, 45, 1));
  EXPECT_EQ(o.status, TERSE_ERR_INVALID_PAYLOAD);
  EXPECT_NE(mean_abs.lastError().find("after the scales: nonzero padding"), std::string::npos) << mean_abs.lastError();
}

}  // namespace
}  // namespace terse::testing
