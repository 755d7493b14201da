// qsgd: parameters, exact wire sizes and layout, the per-element error bound |Q(v)_i - v_i| <= ||v|| / s, values on
// the quantization grid, unbiasedness measured over many steps with a bound derived from the variance, determinism
// and per-element randomness, and validation of every field of untrusted payloads.
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

#include "compressors/qsgd/qsgd_host.h"
#include "compressors/qsgd/qsgd_math.h"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/philox.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

namespace bitpack = sdk::bitpack;

uint64_t qsgdExpectedBytes(uint64_t n, uint64_t levels, uint64_t bucket) {
  const unsigned w = 1 + bitpack::bitsFor(levels);
  return 32 + (4 * bucketsOf(n, bucket) + 7) / 8 * 8 + 8 * bitpack::wordCount(n, w);
}

// The norms section as the payload holds it.
std::vector<float> qsgdNorms(const Bytes& p, uint64_t n, uint64_t bucket) {
  std::vector<float> v(bucketsOf(n, bucket));
  if (!v.empty()) std::memcpy(v.data(), p.data() + 32, 4 * v.size());
  return v;
}
size_t qsgdCodesOffset(uint64_t n, uint64_t bucket) {
  return 32 + (4 * bucketsOf(n, bucket) + 7) / 8 * 8;
}

TEST(Qsgd, ParametersAreValidated) {
  Plugin plugin("qsgd");
  struct Case {
    Instance::ParamList params;
    const char* message;
  };
  const Case cases[] = {
      {{{"levels", "0"}}, "qsgd: 'levels' must be an integer >= 1, got 0"},
      {{{"levels", "-3"}}, "qsgd: 'levels' must be an integer >= 1, got -3"},
      {{{"levels", "16777216"}}, "qsgd: 'levels' must be an integer <= 16777215"},
      {{{"levels", "2.5"}}, "qsgd: 'levels' must be an integer, got '2.5'"},
      {{{"bucket_size", "0"}}, "qsgd: 'bucket_size' must be an integer >= 1, got 0"},
      {{{"rounding_bits", "12"}}, "qsgd: 'rounding_bits' must be one of {8, 16, 24}, got '12'"},
      {{{"rounding_bits", "32"}}, "qsgd: 'rounding_bits' must be one of {8, 16, 24}, got '32'"},
      {{{"rounding_bits", "08"}}, "qsgd: 'rounding_bits' must be one of {8, 16, 24}, got '08'"},
      {{{"bucket", "512"}}, "qsgd: unknown parameter 'bucket' (known: levels, bucket_size, threads, rounding_bits)"},
  };
  for (const Case& c : cases) {
    Instance i(plugin, c.params);
    EXPECT_EQ(i.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << c.message;
    EXPECT_NE(i.lastError().find(c.message), std::string::npos) << i.lastError();
  }
  Instance ok(plugin, {{"levels", "16777215"}, {"bucket_size", "1"}});
  EXPECT_TRUE(ok.ok()) << ok.lastError();
  for (const char* b : {"8", "16", "24"}) {
    Instance rounding(plugin, {{"rounding_bits", b}});
    EXPECT_TRUE(rounding.ok()) << b << ": " << rounding.lastError();
  }
}

TEST(Qsgd, CapsAndExactSizes) {
  Plugin plugin("qsgd");
  Instance c(plugin);
  const auto caps = c.caps();
  EXPECT_EQ(caps.devices, kCudaPluginDevices);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_ALLGATHER);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);
  terse_compressor_caps_v1 other{};
  EXPECT_EQ(c.getCaps(TERSE_DTYPE_F16, &other), TERSE_ERR_UNSUPPORTED);

  // The default: 127 levels, sign + 7 bits = one byte per element, one f32 norm per 512 elements.
  const auto s = c.sizes(tensorInfo(uint64_t{1} << 20));
  EXPECT_EQ(s.max_output_bytes, 32u + 4u * 2048u + (uint64_t{1} << 20));
  EXPECT_EQ(s.workspace_bytes, 0u);
  EXPECT_EQ(s.state_bytes, 0u);

  for (uint64_t levels : {1ull, 2ull, 3ull, 15ull, 127ull, 128ull, 255ull, 1000ull, 16777215ull}) {
    for (uint64_t bucket : {1ull, 7ull, 512ull, 100000ull}) {
      Instance q(plugin, {{"levels", std::to_string(levels)}, {"bucket_size", std::to_string(bucket)}});
      for (uint64_t n : {0ull, 1ull, 63ull, 64ull, 65ull, 1001ull}) {
        const auto info = tensorInfo(n);
        ASSERT_EQ(q.sizes(info).max_output_bytes, qsgdExpectedBytes(n, levels, bucket))
            << "levels " << levels << " bucket " << bucket << " n " << n;
        // Fixed size: the payload is exactly that long whatever the data.
        EXPECT_EQ(q.compress(info, gaussian(n, 1)).size(), qsgdExpectedBytes(n, levels, bucket));
        EXPECT_EQ(q.compress(info, std::vector<float>(n, 0.0f)).size(), qsgdExpectedBytes(n, levels, bucket));
      }
    }
  }
}

// The CUDA kernels sum a bucket's squares one lane per thread (laneSumSquares) and close with combineLanes: together
// they must be sumSquares bit for bit, or the GPU's norms (and so every code) would differ from the CPU's.
TEST(Qsgd, LaneSumsCombineToSumSquaresBitForBit) {
  namespace math = compressors::qsgd;
  for (uint64_t n : {0ull, 1ull, 7ull, 8ull, 9ull, 511ull, 512ull, 1000ull, 100003ull}) {
    // A wide dynamic range, so that a different order of additions would round differently.
    std::vector<float> x = gaussian(static_cast<size_t>(n), static_cast<uint32_t>(n) + 11);
    for (size_t i = 0; i < x.size(); i += 3) x[i] *= 1e6f;
    double lanes[math::kLanes];
    for (unsigned l = 0; l < math::kLanes; ++l) lanes[l] = math::laneSumSquares(x.data(), n, l);
    const double combined = math::combineLanes(lanes);
    const double reference = math::sumSquares(x.data(), n);
    EXPECT_EQ(0, std::memcmp(&combined, &reference, sizeof combined)) << "n=" << n;
    EXPECT_EQ(math::normOf(reference), math::bucketNorm(x.data(), n)) << "n=" << n;
  }
}

TEST(Qsgd, NormsAreTheBucketL2Norms) {
  Plugin plugin("qsgd");
  Instance c(plugin, {{"bucket_size", "100"}});
  const uint64_t n = 1050;
  const auto g = gaussian(n, 9);
  const Bytes p = c.compress(tensorInfo(n), g);
  const auto got = qsgdNorms(p, n, 100);
  ASSERT_EQ(got.size(), 11u);
  for (uint64_t b = 0; b < got.size(); ++b) {
    double ss = 0;
    for (uint64_t i = b * 100; i < std::min<uint64_t>(n, (b + 1) * 100); ++i) ss += static_cast<double>(g[i]) * g[i];
    EXPECT_EQ(got[b], static_cast<float>(std::sqrt(ss))) << "bucket " << b;
  }
}

// |Q(v)_i - v_i| <= ||v|| / s, Q(v)_i = sign(v_i) ||v|| xi_i / s with integer 0 <= xi_i <= s, for many shapes of
// buckets against the 64-element groups, odd sizes and several levels.
TEST(Qsgd, ErrorBoundAndGridHoldForEveryElement) {
  Plugin plugin("qsgd");
  for (uint64_t levels : {1ull, 4ull, 127ull, 1000ull}) {
    for (uint64_t bucket : {1ull, 7ull, 64ull, 100ull, 512ull, 1000000ull}) {
      Instance c(plugin, {{"levels", std::to_string(levels)}, {"bucket_size", std::to_string(bucket)}});
      for (uint64_t n : {1ull, 2ull, 65ull, 1001ull}) {
        auto g = gaussian(n, static_cast<uint32_t>(n + levels + bucket), 3.0f);
        if (n > 10) g[3] = 0.0f, g[4] = -0.0f, g[5] = 1e-30f;
        const auto info = tensorInfo(n, {.step = levels});
        const Bytes p = c.compress(info, g);
        const auto out = c.decode(info, p);
        const auto nb = qsgdNorms(p, n, bucket);
        for (uint64_t i = 0; i < n; ++i) {
          const double norm = nb[i / bucket];
          const double unit = norm / static_cast<double>(levels);
          const double err = std::fabs(static_cast<double>(out[i]) - g[i]);
          ASSERT_LE(err, unit * (1 + 1e-6) + 1e-37) << "levels " << levels << " bucket " << bucket << " i " << i;
          if (unit > 0) {
            const double xi = std::fabs(out[i]) / unit;
            ASSERT_NEAR(xi, std::round(xi), 1e-4) << "off the grid: levels " << levels << " i " << i;
            ASSERT_LE(std::round(xi), static_cast<double>(levels));
          }
          if (out[i] != 0.0f) {
            ASSERT_EQ(std::signbit(out[i]), std::signbit(g[i])) << i;
          }
        }
      }
    }
  }
}

TEST(Qsgd, ExactCasesNeedNoRandomness) {
  Plugin plugin("qsgd");
  Instance c(plugin, {{"levels", "4"}, {"bucket_size", "4"}});
  // Bucket {3, 0, -4, 0}: norm 5; x = 4 * {0.6, 0, 0.8, 0} = {2.4, 0, 3.2, 0}. Bucket {0, 0, 0, 0}: all zero. Bucket
  // {0, -2, 0, 0}: one element carries the whole norm, so x = s exactly.
  const std::vector<float> g = {3, 0, -4, 0, 0, 0, 0, 0, 0, -2, 0, 0};
  for (uint64_t step = 0; step < 20; ++step) {
    const auto info = tensorInfo(g.size(), {.step = step});
    const Bytes p = c.compress(info, g);
    EXPECT_EQ(qsgdNorms(p, g.size(), 4), (std::vector<float>{5, 0, 2}));
    const auto out = c.decode(info, p);
    EXPECT_TRUE(out[0] == 2.5f || out[0] == 3.75f) << out[0];  // xi in {2, 3} times 5/4
    EXPECT_TRUE(out[2] == -3.75f || out[2] == -5.0f) << out[2];
    EXPECT_EQ(out[1], 0.0f);
    for (int i = 4; i < 8; ++i) EXPECT_EQ(out[i], 0.0f);
    EXPECT_EQ(out[9], -2.0f);
  }
}

// E[Q(v)] = v. Over K independent steps the mean of the decodes has per-element variance Var(Q_i) / K with
// Var(Q_i) = unit^2 p (1 - p) <= unit^2 / 4 (one Bernoulli choice between adjacent levels, unit = ||v|| / s). Check
// every element within 5 standard deviations of that bound, and the average squared z-score near its expectation.
TEST(Qsgd, UnbiasedOverManySteps) {
  Plugin plugin("qsgd");
  Instance c(plugin, {{"levels", "3"}, {"bucket_size", "64"}});
  const uint64_t n = 300;
  const auto g = gaussian(n, 4242);
  const int steps = 4000;
  RunningMoments m(n);
  std::vector<float> nb;
  for (int s = 0; s < steps; ++s) {
    const auto info = tensorInfo(n, {.step = static_cast<uint64_t>(s), .seed = 77});
    const Bytes p = c.compress(info, g);
    if (s == 0) nb = qsgdNorms(p, n, 64);
    m.add(c.decode(info, p));
  }
  double z2 = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double unit = nb[i / 64] / 3.0;
    const double x = std::fabs(g[i]) / unit;
    const double p = x - std::floor(x);
    const double sd = unit * std::sqrt(std::max(p * (1 - p), 1e-12) / steps);
    const double dev = m.mean(i) - g[i];
    EXPECT_LE(std::fabs(dev), 5 * unit * 0.5 / std::sqrt(static_cast<double>(steps)) + 1e-6) << "element " << i;
    z2 += dev * dev / (sd * sd);
  }
  EXPECT_LT(z2 / static_cast<double>(n), 1.5) << "mean squared z-score; 1 expected for an unbiased quantizer";
}

// rounding_bits b: element e rounds up iff r_e 2^-b < frac with r_e uniform on b bits, so P(up) = ceil(frac 2^b) / 2^b
// and E[Q(v)_e] - v_e = unit (P(up) - frac), in [0, unit 2^-b). A bucket of 2^18 ones has norm 512 exactly, so with s
// levels every element has x = s / 512 exactly: s = 513 gives frac 1/512, which 8-bit draws round up with probability
// 1/256 (r = 0 only) and 16- and 24-bit draws with 1/512; s = 768 gives frac 1/2 at every b. Over 4 steps (2^20
// draws) each rate must be within 5 sigma of its formula (the 1/256 and 1/512 rates are 32 sigma apart), the mean
// decode within 5 sigma of v + unit (P(up) - frac) and below the bound; and at frac 1/2, elements d = 1, 2, 3, 4, 8,
// 16 apart (halves and bytes of one stream word, neighbouring words and blocks) must agree half the time, as
// independent draws do (a draw reused for two elements would make them agree 3/4 of the time or more).
TEST(Qsgd, RoundingBitsGiveTheirRoundUpRateAndBias) {
  Plugin plugin("qsgd");
  const uint64_t n = uint64_t{1} << 18;
  const std::vector<float> ones(n, 1.0f);
  const int steps = 4;
  const double draws = static_cast<double>(n) * steps;
  for (const unsigned b : {24u, 16u, 8u}) {
    for (const int levels : {513, 768}) {
      SCOPED_TRACE("rounding_bits " + std::to_string(b) + ", levels " + std::to_string(levels));
      Instance c(plugin, {{"levels", std::to_string(levels)},
                          {"bucket_size", std::to_string(n)},
                          {"rounding_bits", std::to_string(b)}});
      ASSERT_TRUE(c.ok()) << c.lastError();
      const double frac = levels == 513 ? 1.0 / 512 : 0.5;
      const double p = std::ceil(frac * std::ldexp(1.0, static_cast<int>(b))) / std::ldexp(1.0, static_cast<int>(b));
      const float unit = 512.0f / static_cast<float>(levels);  // decodeValue's unit: norm / s
      double ups = 0, sum = 0;
      const uint64_t lags[] = {1, 2, 3, 4, 8, 16};
      double agree[std::size(lags)] = {};
      for (int step = 0; step < steps; ++step) {
        const auto info = tensorInfo(n, {.step = static_cast<uint64_t>(step), .seed = 31});
        const auto out = c.decode(info, c.compress(info, ones));
        std::vector<uint8_t> up(n);
        for (uint64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(out[i] == 1.0f * unit || out[i] == 2.0f * unit) << i << ": " << out[i];
          up[i] = out[i] == 2.0f * unit ? 1 : 0;
          ups += up[i];
          sum += out[i];
        }
        for (size_t k = 0; k < std::size(lags); ++k) {
          for (uint64_t i = 0; i + lags[k] < n; ++i) agree[k] += up[i] == up[i + lags[k]] ? 1 : 0;
        }
      }
      const double sd = std::sqrt(p * (1 - p) / draws);
      EXPECT_NEAR(ups / draws, p, 5 * sd) << "round-up rate; ceil(frac 2^b) / 2^b expected";
      const double bias = sum / draws - 1.0;
      EXPECT_NEAR(bias, unit * (p - frac), 5 * unit * sd + 1e-6) << "mean decode minus v";
      EXPECT_LE(bias, unit * std::ldexp(1.0, -static_cast<int>(b)) + 5 * unit * sd + 1e-6) << "the documented bound";
      if (levels == 768) {
        for (size_t k = 0; k < std::size(lags); ++k) {
          const double pairs = static_cast<double>(n - lags[k]) * steps;
          EXPECT_NEAR(agree[k] / pairs, 0.5, 5 * 0.5 / std::sqrt(pairs)) << "elements " << lags[k] << " apart";
        }
      }
    }
  }
}

TEST(Qsgd, DeterministicPerSeedStepAndTensor) {
  Plugin plugin("qsgd");
  Instance c(plugin, {{"levels", "7"}});
  const uint64_t n = 2000;
  const auto g = gaussian(n, 5);
  const auto info = tensorInfo(n, {.step = 3, .seed = 11, .tensor_id = 2});
  const Bytes a = c.compress(info, g);
  EXPECT_EQ(c.compress(info, g), a);
  Instance other(plugin, {{"levels", "7"}});  // another instance, same answer
  EXPECT_EQ(other.compress(info, g), a);
  for (const auto& changed :
       {tensorInfo(n, {.step = 4, .seed = 11, .tensor_id = 2}), tensorInfo(n, {.step = 3, .seed = 12, .tensor_id = 2}),
        tensorInfo(n, {.step = 3, .seed = 11, .tensor_id = 3})}) {
    EXPECT_NE(c.compress(changed, g), a);
  }
}

// Element i uses its own draw: a prefix of the tensor (ending on a bucket boundary, so the norms agree) quantizes to
// exactly the same values, however the elements fall into 64-element groups.
TEST(Qsgd, ElementsDrawTheirOwnRandomNumbers) {
  Plugin plugin("qsgd");
  Instance c(plugin, {{"levels", "5"}, {"bucket_size", "10"}});
  const auto g = gaussian(1000, 6);
  const auto full = c.decode(tensorInfo(1000), c.compress(tensorInfo(1000), g));
  for (uint64_t prefix : {10ull, 70ull, 130ull, 990ull}) {
    const std::vector<float> head(g.begin(), g.begin() + static_cast<long>(prefix));
    const auto part = c.decode(tensorInfo(prefix), c.compress(tensorInfo(prefix), head));
    for (uint64_t i = 0; i < prefix; ++i) ASSERT_EQ(part[i], full[i]) << "prefix " << prefix << " element " << i;
  }
}

TEST(Qsgd, CodesFollowTheDocumentedLayout) {
  Plugin plugin("qsgd");
  Instance c(plugin, {{"levels", "5"}, {"bucket_size", "16"}});  // W = 1 + 3 bits
  const uint64_t n = 100;
  const auto g = gaussian(n, 8);
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, g);
  EXPECT_EQ(readAt<uint32_t>(p, 16), 5u);
  EXPECT_EQ(readAt<uint32_t>(p, 20), 4u);
  EXPECT_EQ(readAt<uint64_t>(p, 24), 16u);
  const auto nb = qsgdNorms(p, n, 16);
  std::vector<uint64_t> words(bitpack::wordCount(n, 4));
  std::memcpy(words.data(), p.data() + qsgdCodesOffset(n, 16), 8 * words.size());
  const auto out = c.decode(info, p);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t code = bitpack::get(words.data(), i, 4);
    const float want = compressors::qsgd::decodeValue(code, nb[i / 16] / 5.0f, 3);
    EXPECT_EQ(out[i], want) << i;
    EXPECT_EQ(code >> 3, g[i] < 0 ? 1u : 0u) << i;
    EXPECT_LE(code & 7u, 5u);
  }
}

// ---- The host's vector loops (qsgd_host.h) against the scalar math they must reproduce bit for bit.

// Every quantize loop this host can run against quantizeGroupsScalar, for code width W = bitsFor(levels) + 1 and draw
// width B, on buckets whose divisor is a normal norm, a subnormal norm, 1 (all zeros) and a norm equal to one element.
// The scalar loop reads the draws through sdk::drawAt, which PayloadMatchesTheElementwiseDefinition checks against the
// documented layout. Returns how many vector loops ran.
template <unsigned W, unsigned B>
int qsgdCheckQuantizeLoops(int32_t levels) {
  namespace host = compressors::qsgd::host;
  std::vector<std::pair<const char*, host::QuantizeGroups>> loops;
#if TERSE_QSGD_X86
  if (__builtin_cpu_supports("avx2")) loops.emplace_back("AVX2", host::quantizeGroupsAvx2<W, B>);
  if (__builtin_cpu_supports("avx512f")) loops.emplace_back("AVX-512", host::quantizeGroupsAvx512<W, B>);
#endif
  const uint64_t groups = 5, n = groups * 64;
  const auto bits = awkwardStreamWords(n, static_cast<uint64_t>(levels));
  std::vector<std::vector<float>> inputs = {awkwardInput(n, 3), gaussian(n, 4, 1e-42f), std::vector<float>(n, 0.0f),
                                            std::vector<float>(n, 0.0f)};
  for (uint64_t i = 0; i < n; i += 3) inputs[2][i] = -0.0f;
  inputs[3][77] = -5.5f;  // x = levels exactly for it, 0 for the rest
  for (const auto& x : inputs) {
    const float divisor = compressors::qsgd::normDivisor(compressors::qsgd::bucketNorm(x.data(), n));
    std::vector<uint64_t> want(groups * W), got(groups * W);
    host::quantizeGroupsScalar<W, B>(x.data(), divisor, levels, bits.data(), groups, want.data());
    for (const auto& [name, loop] : loops) {
      std::fill(got.begin(), got.end(), ~uint64_t{0});
      loop(x.data(), divisor, levels, bits.data(), groups, got.data());
      for (uint64_t k = 0; k < got.size(); ++k) {
        if (got[k] != want[k]) {
          ADD_FAILURE() << name << ", rounding_bits " << B << ", levels " << levels << ", divisor " << divisor
                        << ": word " << k << " is " << got[k] << ", the scalar loop's " << want[k];
          return static_cast<int>(loops.size());
        }
      }
    }
  }
  return static_cast<int>(loops.size());
}

TEST(Qsgd, VectorQuantizeLoopsMatchTheScalarLoop) {
  int ran = 0;
  for (const int32_t levels : {1, 2, 3, 5, 7, 100, 127, 128, 200, 255, 1000, 65535, (1 << 24) - 1}) {
    const unsigned w = 1 + bitpack::bitsFor(static_cast<uint64_t>(levels));
    TERSE_BITPACK_DISPATCH(w, ran += qsgdCheckQuantizeLoops<kW, 24>(levels);
                           ran += qsgdCheckQuantizeLoops<kW, 16>(levels); ran += qsgdCheckQuantizeLoops<kW, 8>(levels));
  }
  if (ran == 0) GTEST_SKIP() << "this host has neither AVX2 nor AVX-512F";
}

// The several-buckets norm loops against sumSquares, bucket by bucket: lengths around the 8 lanes and the 64-element
// groups, 1 to 4 buckets, subnormal, huge and infinite elements (the sum is then inf, as the scalar sum is).
TEST(Qsgd, VectorNormLoopsMatchSumSquares) {
  namespace host = compressors::qsgd::host;
  std::vector<std::pair<const char*, host::SumSquaresBuckets>> loops = {{"scalar", host::sumSquaresBucketsScalar}};
#if TERSE_QSGD_X86
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    loops.emplace_back("AVX2", host::sumSquaresBucketsAvx2);
  }
  if (__builtin_cpu_supports("avx512f")) loops.emplace_back("AVX-512", host::sumSquaresBucketsAvx512);
#endif
  for (const uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{9}, uint64_t{63}, uint64_t{64}, uint64_t{65},
                           uint64_t{511}, uint64_t{512}, uint64_t{513}}) {
    auto x = awkwardInput(4 * n, static_cast<uint32_t>(n));
    x[2 * n + n / 2] = 3e38f;  // bucket 2's sum exceeds f32 but not f64
    if (n > 1) x[3 * n + 1] = -std::numeric_limits<float>::infinity();
    for (unsigned count = 1; count <= host::kNormBuckets; ++count) {
      for (const auto& [name, loop] : loops) {
        double sums[host::kNormBuckets];
        loop(x.data(), n, count, sums);
        for (unsigned k = 0; k < count; ++k) {
          const double want = compressors::qsgd::sumSquares(x.data() + k * n, n);
          EXPECT_EQ(std::memcmp(&sums[k], &want, sizeof want), 0)
              << name << ", n " << n << ", " << count << " buckets, bucket " << k << ": " << sums[k] << " vs " << want;
        }
      }
    }
  }
}

// The payload of compress, whatever loops this host picks (vector runs of up to 16 groups, groups straddling buckets,
// short last groups, several threads), against one built here element by element from qsgd_math.h and
// PhiloxStream::bits.
TEST(Qsgd, PayloadMatchesTheElementwiseDefinition) {
  Plugin plugin("qsgd");
  struct Case {
    int32_t levels;
    uint64_t bucket, n, threads;
    unsigned rounding_bits = 24;
  };
  // rounding_bits 16 and 8: buckets and thread ranges that start inside a Philox group of the shorter draws (a bucket
  // of 96 starts at elements 96, 192, ...: stream words 48, 96, ... at 16 bits, 24, 48, ... at 8), and runs of 16
  // groups that start at odd groups.
  for (const Case k : {Case{127, 512, 100000, 1},     Case{127, 2048, 9000, 1},     Case{127, 96, 1001, 1},
                       Case{100, 512, 4096 + 17, 1},  Case{5, 16, 100, 1},          Case{1, 1, 70, 1},
                       Case{3, 64, 640, 1},           Case{65535, 200, 999, 1},     Case{(1 << 24) - 1, 1000, 3000, 1},
                       Case{127, 4097, 20000, 3},     Case{127, 512, 63, 1},        Case{255, 100000, 70000, 1},
                       Case{127, 512, 100000, 1, 16}, Case{127, 512, 100000, 1, 8}, Case{127, 96, 1001, 1, 16},
                       Case{127, 96, 1001, 1, 8},     Case{5, 16, 100, 1, 8},       Case{3, 64, 640, 1, 16},
                       Case{65535, 200, 999, 1, 16},  Case{127, 4097, 20000, 3, 8}, Case{127, 4097, 20000, 3, 16},
                       Case{127, 1088, 20000, 3, 8},  Case{127, 512, 63, 1, 8},     Case{255, 100000, 70000, 1, 16}}) {
    Instance c(plugin, {{"levels", std::to_string(k.levels)},
                        {"bucket_size", std::to_string(k.bucket)},
                        {"threads", std::to_string(k.threads)},
                        {"rounding_bits", std::to_string(k.rounding_bits)}});
    const auto info = tensorInfo(k.n, {.step = 5, .seed = 99});
    const auto x = awkwardInput(k.n, static_cast<uint32_t>(k.n), std::min(k.bucket, k.n));
    const Bytes p = c.compress(info, x);
    const uint64_t bucket = std::min(k.bucket, k.n);
    const unsigned mag = bitpack::bitsFor(static_cast<uint64_t>(k.levels));
    const sdk::PhiloxStream s(info.seed, info.step, info.tensor_id);
    std::vector<float> norms(bucketsOf(k.n, bucket));
    std::vector<uint32_t> codes(k.n);
    for (uint64_t b = 0; b < norms.size(); ++b) {
      norms[b] = compressors::qsgd::bucketNorm(x.data() + b * bucket, std::min(bucket, k.n - b * bucket));
    }
    for (uint64_t i = 0; i < k.n; ++i) {
      codes[i] = compressors::qsgd::quantizeValue(x[i], compressors::qsgd::normDivisor(norms[i / bucket]),
                                                  static_cast<float>(k.levels), k.levels, mag,
                                                  referenceDraw(s, i, k.rounding_bits));
    }
    std::vector<uint64_t> words(bitpack::wordCount(k.n, mag + 1));
    bitpack::pack(mag + 1, codes.data(), k.n, words.data());
    const std::string label = "levels " + std::to_string(k.levels) + ", bucket " + std::to_string(k.bucket) + ", n " +
                              std::to_string(k.n) + ", threads " + std::to_string(k.threads) + ", rounding_bits " +
                              std::to_string(k.rounding_bits);
    ASSERT_EQ(p.size(), qsgdCodesOffset(k.n, bucket) + 8 * words.size()) << label;
    EXPECT_EQ(std::memcmp(p.data() + 32, norms.data(), 4 * norms.size()), 0) << label << ": the norms differ";
    const auto* got = p.data() + qsgdCodesOffset(k.n, bucket);
    for (uint64_t w = 0; w < words.size(); ++w) {
      uint64_t word = 0;
      std::memcpy(&word, got + 8 * w, 8);
      ASSERT_EQ(word, words[w]) << label << ": word " << w << " (elements from " << w * 64 / (mag + 1) << ")";
    }
  }
}

TEST(Qsgd, EmptyAndHugeOddTensors) {
  Plugin plugin("qsgd");
  Instance c(plugin);
  const Bytes empty = c.compress(tensorInfo(0), std::vector<float>{});
  EXPECT_EQ(empty.size(), 32u);
  EXPECT_TRUE(c.decode(tensorInfo(0), empty).empty());
  const uint64_t n = (uint64_t{1} << 20) + 3;
  const auto g = gaussian(n, 12);
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, g);
  EXPECT_EQ(p.size(), qsgdExpectedBytes(n, 127, 512));
  std::vector<float> out(n, 1.0f);
  ASSERT_EQ(c.decompress(info, p, out, /*accumulate=*/true), TERSE_OK);
  const auto plain = c.decode(info, p);
  for (uint64_t i = 0; i < n; i += 997) ASSERT_EQ(out[i], 1.0f + plain[i]) << i;
}

TEST(Qsgd, RefusesNonFiniteGradients) {
  Plugin plugin("qsgd");
  Instance c(plugin, {{"bucket_size", "8"}});
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 3e38f}) {
    std::vector<float> g(20, 1.0f);
    g[17] = bad;
    g[18] = bad;  // 3e38 alone fits f32; two of them make a norm that does not
    Bytes out;
    EXPECT_EQ(c.tryCompress(tensorInfo(20), g, &out), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(c.lastError().find("starting at element 16"), std::string::npos) << c.lastError();
  }
}

TEST(Qsgd, RejectsMalformedPayloads) {
  Plugin plugin("qsgd");
  Instance c(plugin, {{"levels", "100"}, {"bucket_size", "32"}});  // W = 8, magnitudes 101..127 are invalid
  const uint64_t n = 77;
  const auto info = tensorInfo(n);
  const Bytes p = c.compress(info, gaussian(n, 2));
  expectRejectsStructuralDamage(c, info, p);
  expectRejectsStructuralDamage(c, tensorInfo(0), c.compress(tensorInfo(0), std::vector<float>{}));

  auto expectBad = [&](const Bytes& q, const char* what, const char* message) {
    const DecodeOutcome o = decodeOutcome(c, info, q, /*accumulate=*/true);
    EXPECT_EQ(o.status, TERSE_ERR_INVALID_PAYLOAD) << what;
    EXPECT_TRUE(o.untouched) << what;
    EXPECT_NE(c.lastError().find(message), std::string::npos) << what << ": " << c.lastError();
  };
  expectBad(patched<uint32_t>(p, 16, 99), "levels changed", "payload made with levels=99");
  expectBad(patched<uint32_t>(p, 20, 9), "code width changed", "code bits=9");
  expectBad(patched<uint64_t>(p, 24, 33), "bucket size changed", "bucket_size=33");
  expectBad(patched<float>(p, 32, std::nanf("")), "NaN norm", "bucket 0 has norm");
  expectBad(patched<float>(p, 36, -1.0f), "negative norm", "bucket 1 has norm -1");
  expectBad(patched<float>(p, 40, std::numeric_limits<float>::infinity()), "infinite norm", "bucket 2 has norm");
  expectBad(patched<uint8_t>(p, 44, 1), "padding after the norms", "after the bucket norms: nonzero padding");
  const size_t codes = qsgdCodesOffset(n, 32);
  // Element 5's code is byte 5 of the codes (W = 8): magnitude 101 > levels.
  expectBad(patched<uint8_t>(p, codes + 5, 101), "magnitude above levels", "code of element 5");
  expectBad(patched<uint8_t>(p, codes + 76, 0x80 | 127), "last element's magnitude", "code of element 76");
  // n = 77 codes of 8 bits use 616 bits of 640: the last 3 bytes are padding.
  expectBad(patched<uint8_t>(p, p.size() - 1, 1), "padding bits", "padding");
  // A different instance's payloads are refused, not misread.
  Instance other(plugin, {{"levels", "100"}, {"bucket_size", "64"}});
  EXPECT_EQ(decodeOutcome(other, info, p).status, TERSE_ERR_INVALID_PAYLOAD);
}

}  // namespace
}  // namespace terse::testing
