// dgc: the selected count stays in [0.8k, 1.3k] on every distribution (the guarantee), the selection is a magnitude cut
// (nothing left out is larger than anything sent), the refinement is bounded, and payloads are validated.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/dgc/dgc_math.h"
#include "compressors/dgc/dgc_select.h"
#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_select.hpp"
#include "tests/compressors/plugin_harness.h"
#include "tests/compressors/sparse_test_util.h"

namespace {

using terse::testing::Bytes;
using terse::testing::Instance;
using terse::testing::patched;
using terse::testing::Plugin;
using terse::testing::tensorInfo;
using terse::testing::truncated;
using namespace terse::testing::sparse;
namespace dg = terse::compressors::dgc;
namespace tk = terse::kit::topk;

Plugin& dgcPlugin() {
  static Plugin plugin("dgc");
  return plugin;
}

const Dist kAllDists[] = {Dist::kNormal,    Dist::kUniform, Dist::kHeavyTailed, Dist::kConstant,
                          Dist::kManyZeros, Dist::kTies,    Dist::kTiny};

TEST(Dgc, Band) {
  EXPECT_EQ(dg::minCount(0), 0u);
  EXPECT_EQ(dg::maxCount(0), 0u);
  EXPECT_EQ(dg::minCount(1), 1u);
  EXPECT_EQ(dg::maxCount(1), 1u);
  EXPECT_EQ(dg::minCount(10), 8u);
  EXPECT_EQ(dg::maxCount(10), 13u);
  EXPECT_EQ(dg::minCount(11), 9u);   // ceil(8.8)
  EXPECT_EQ(dg::maxCount(11), 14u);  // floor(14.3)
  for (uint64_t k = 1; k < 2000; ++k) {
    ASSERT_LE(dg::minCount(k), k);
    ASSERT_GE(dg::maxCount(k), k);
    ASSERT_GE(static_cast<double>(dg::minCount(k)), 0.8 * static_cast<double>(k) - 1e-9);
    ASSERT_LE(static_cast<double>(dg::maxCount(k)), 1.3 * static_cast<double>(k) + 1e-9);
  }
  EXPECT_EQ(dg::mulHi64(~0ull, ~0ull), ~0ull - 1);
  EXPECT_EQ(dg::mulHi64(1ull << 63, 6), 3u);
}

TEST(Dgc, CapsAndSizes) {
  Instance c(dgcPlugin(), {{"ratio", "0.01"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  const terse_compressor_caps_v1 caps = c.caps();
  EXPECT_EQ(caps.aggregation, TERSE_AGG_ALLGATHER);
  EXPECT_EQ(caps.flags, 0u);
  EXPECT_EQ(caps.num_rounds, 1);
  // 2^20 at 1%: k = 10486, at most floor(1.3k) = 13631 entries.
  EXPECT_EQ(c.sizes(tensorInfo(1u << 20)).max_output_bytes, 24u + 8u * 13631u);
  for (const auto& bad : std::vector<std::pair<std::string, std::string>>{
           {"ratio", "0"}, {"sample_ratio", "0"}, {"sample_ratio", "2"}, {"max_passes", "0"}, {"max_passes", "33"}}) {
    Instance b(dgcPlugin(), {bad});
    EXPECT_EQ(b.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << bad.first << " = " << bad.second;
  }
}

// The guarantee, through the plugin, over distributions, sizes, ratios and steps.
TEST(Dgc, CountWithinBandOnEveryDistribution) {
  for (double ratio : {0.001, 0.01, 0.1}) {
    Instance c(dgcPlugin(), {{"ratio", numberText(ratio)}});
    for (Dist d : kAllDists) {
      for (size_t n : {size_t{1}, size_t{100}, size_t{5000}, size_t{300007}}) {
        const std::vector<float> g = makeData(d, n, static_cast<uint32_t>(3 * n + 1));
        const uint64_t k = tk::targetCount(ratio, n);
        for (uint64_t step = 0; step < 3; ++step) {
          const auto info = tensorInfo(n, {.step = step, .seed = 11 + step});
          const Bytes p = c.compress(info, g);
          const SparsePayload s = parseSparse(p);
          const std::string what = std::string(distName(d)) + ", n = " + std::to_string(n) +
                                   ", ratio = " + numberText(ratio) + ", step " + std::to_string(step);
          EXPECT_GE(s.count, dg::minCount(k)) << what;
          EXPECT_LE(s.count, dg::maxCount(k)) << what;
          EXPECT_LE(p.size(), c.sizes(info).max_output_bytes) << what;
          EXPECT_TRUE(strictlyIncreasing(s.indices)) << what;
          EXPECT_TRUE(isMagnitudeCut(g, s.indices)) << what;
          for (size_t j = 0; j < s.count; ++j) ASSERT_EQ(s.values[j], g[s.indices[j]]) << what;
          std::vector<float> dense(n, 0.0f);
          for (uint32_t i : s.indices) dense[i] = g[i];
          ASSERT_EQ(c.decode(info, p), dense) << what;
        }
      }
    }
  }
}

// The refinement through dgc_select.h directly: passes never exceed max_passes, and with at least 2 passes allowed
// smooth data never needs the exact fallback and mostly lands in one pass (a 1% sample of 1% of 2^20 sees about 100
// elements above the threshold, so its estimate is about 10% off: within the band's 25% most of the time).
TEST(Dgc, RefinementIsBounded) {
  const size_t n = 1u << 20;
  const uint64_t k = tk::targetCount(0.01, n);
  std::vector<uint32_t> hist(tk::kHistogramBytes / sizeof(uint32_t));
  std::vector<uint32_t> sample(dg::sampleCount(0.01, n));
  for (Dist d : kAllDists) {
    const std::vector<float> g = makeData(d, n, 21);
    const bool smooth = d == Dist::kNormal || d == Dist::kUniform || d == Dist::kConstant || d == Dist::kManyZeros ||
                        d == Dist::kHeavyTailed;
    for (int max_passes : {1, 2, 4}) {
      int first_pass = 0;
      const int steps = 20;
      for (uint64_t step = 0; step < steps; ++step) {
        const terse::sdk::PhiloxStream stream(5, step, 1);
        const dg::Plan p = dg::plan(g, k, 0.01, max_passes, stream, sample, hist.data());
        const std::string what =
            std::string(distName(d)) + ", max_passes " + std::to_string(max_passes) + ", step " + std::to_string(step);
        EXPECT_FALSE(p.nonfinite) << what;
        EXPECT_LE(p.passes, max_passes) << what;
        EXPECT_GE(p.passes, 1) << what;
        EXPECT_GE(p.count, dg::minCount(k)) << what;
        EXPECT_LE(p.count, dg::maxCount(k)) << what;
        if (p.exact) {
          EXPECT_EQ(p.count, k) << what;
        }
        if (smooth && max_passes >= 2) {
          EXPECT_FALSE(p.exact) << what;
          EXPECT_LE(p.passes, 2) << what;
        }
        first_pass += !p.exact && p.passes == 1 ? 1 : 0;
      }
      if (smooth) {
        EXPECT_GE(first_pass, steps * 8 / 10) << distName(d) << ": the sampled threshold rarely lands at once";
      }
    }
  }
}

// A sample that cannot see the threshold: the top k are a tight cluster of 100 huge values among 200000 small ones, so
// the 1024-element sample holds about one of them and its estimate is far too low. Refinement must still land: by
// bisection when passes allow, by the exact fallback when they run out.
TEST(Dgc, HostileDistributionStillLandsInBand) {
  const size_t n = 200000;
  std::vector<float> g = makeData(Dist::kUniform, n, 31);
  for (float& x : g) x *= 1e-3f;
  for (size_t i = 0; i < n; i += 2000) g[i] = 1000.0f + static_cast<float>(i % 7);
  const uint64_t k = tk::targetCount(0.0005, n);
  ASSERT_EQ(k, 100u);
  std::vector<uint32_t> hist(tk::kHistogramBytes / sizeof(uint32_t));
  std::vector<uint32_t> sample(dg::sampleCount(0.0001, n));
  int fallbacks = 0, bisections = 0;
  for (int max_passes : {1, 2, 4, 32}) {
    Instance c(dgcPlugin(),
               {{"ratio", "0.0005"}, {"sample_ratio", "0.0001"}, {"max_passes", std::to_string(max_passes)}});
    for (uint64_t step = 0; step < 5; ++step) {
      const auto info = tensorInfo(n, {.step = step});
      const SparsePayload s = parseSparse(c.compress(info, g));
      EXPECT_GE(s.count, dg::minCount(k)) << "max_passes " << max_passes;
      EXPECT_LE(s.count, dg::maxCount(k)) << "max_passes " << max_passes;
      EXPECT_TRUE(isMagnitudeCut(g, s.indices));
      const dg::Plan p = dg::plan(g, k, 0.0001, max_passes, terse::sdk::PhiloxStream(info.seed, step, info.tensor_id),
                                  sample, hist.data());
      EXPECT_LE(p.passes, max_passes);
      fallbacks += p.exact ? 1 : 0;
      bisections += !p.exact && p.passes > 1 ? 1 : 0;
    }
  }
  EXPECT_GT(fallbacks, 0) << "the exact fallback never ran: the test data is not hostile";
  EXPECT_GT(bisections, 0) << "refinement never landed after the first pass";
}

TEST(Dgc, DeterministicPerSeed) {
  Instance c(dgcPlugin(), {{"ratio", "0.01"}});
  const std::vector<float> g = makeData(Dist::kHeavyTailed, 100000, 8);
  const auto info = tensorInfo(g.size(), {.step = 4, .seed = 3});
  EXPECT_EQ(c.compress(info, g), c.compress(info, g));
}

TEST(Dgc, EmptyAndTinyTensors) {
  Instance c(dgcPlugin(), {{"ratio", "0.5"}});
  const Bytes e = c.compress(tensorInfo(0), {});
  EXPECT_EQ(e.size(), 24u);
  EXPECT_EQ(c.decompress(tensorInfo(0), e, {}), TERSE_OK);
  const std::vector<float> one = {2.0f};
  EXPECT_EQ(c.decode(tensorInfo(1), c.compress(tensorInfo(1), one)), one);
}

TEST(Dgc, RefusesNonFiniteGradient) {
  Instance c(dgcPlugin(), {{"ratio", "0.01"}});
  for (size_t n : {size_t{500}, size_t{200000}}) {  // exact path and sampled path
    for (float bad : {INFINITY, NAN}) {
      std::vector<float> g = makeData(Dist::kNormal, n, 1);
      g[n / 2] = bad;
      Bytes out;
      EXPECT_EQ(c.tryCompress(tensorInfo(n), g, &out), TERSE_ERR_INVALID_ARGUMENT) << n;
    }
  }
}

TEST(Dgc, RejectsMalformedPayloads) {
  Instance c(dgcPlugin(), {{"ratio", "0.1"}});
  const std::vector<float> g = makeData(Dist::kNormal, 100, 6);
  const auto info = tensorInfo(g.size());
  const Bytes good = c.compress(info, g);
  const uint64_t n = parseSparse(good).count;  // k = 10: count in [8, 13]
  ASSERT_GE(n, 8u);
  // A well-formed payload whose count lies outside the band.
  const auto withCount = [&](uint64_t count) {
    Bytes b(24 + 8 * count);
    std::memcpy(b.data(), good.data(), 16);
    std::memcpy(b.data() + 16, &count, 8);
    for (uint64_t j = 0; j < count; ++j) {
      const float v = 1.0f;
      const auto idx = static_cast<uint32_t>(j);
      std::memcpy(b.data() + 24 + 4 * j, &v, 4);
      std::memcpy(b.data() + 24 + 4 * count + 4 * j, &idx, 4);
    }
    return b;
  };
  std::vector<float> ok(g.size());
  EXPECT_EQ(c.decompress(info, withCount(8), ok), TERSE_OK) << c.lastError();
  EXPECT_EQ(c.decompress(info, withCount(13), ok), TERSE_OK) << c.lastError();
  for (const auto& [what, payload] : std::vector<std::pair<std::string, Bytes>>{
           {"count below 0.8k", withCount(7)},
           {"count above 1.3k", withCount(14)},
           {"truncated", truncated(good, 3)},
           {"wrong magic", patched<uint32_t>(good, 0, 1)},
           {"index out of range", patched<uint32_t>(good, indexOffset(n, n - 1), 100)},
           {"indices not increasing", patched<uint32_t>(good, indexOffset(n, 0), 99)},
           {"inf value", patched<float>(good, valueOffset(1), INFINITY)}}) {
    std::vector<float> out(g.size(), 5.0f);
    EXPECT_EQ(c.decompress(info, payload, out), TERSE_ERR_INVALID_PAYLOAD) << what;
    for (float x : out) ASSERT_EQ(x, 5.0f) << what;
  }
}

// DGC's warm-up (dgc_math.h): stage s of S keeps ratio^((s + 1) / (S + 1)), the paper's densities for ratio 0.001 and
// four stages, computed from one root found with multiplications alone.
TEST(Dgc, WarmupRatiosArePowersOfOneRoot) {
  const std::vector<double> r = dg::warmupRatios(0.001, 4);
  ASSERT_EQ(r.size(), 4u);
  const double paper[] = {0.25, 0.0625, 0.015625, 0.004};  // 75%, 93.75%, 98.4375%, 99.6% sparsity
  for (size_t s = 0; s < r.size(); ++s) {
    EXPECT_NEAR(r[s], std::pow(0.001, static_cast<double>(s + 1) / 5), 1e-15) << "stage " << s;
    EXPECT_NEAR(r[s], paper[s], 0.0013) << "stage " << s;
    if (s > 0) {
      EXPECT_LT(r[s], r[s - 1]);
    }
  }
  EXPECT_GT(r.back(), 0.001);
  // The root is the largest double whose fifth power (multiplied out) does not pass the ratio.
  const double root = dg::multipliedRoot(0.001, 5);
  EXPECT_EQ(r[0], root);
  EXPECT_LE(dg::multipliedPower(root, 5), 0.001);
  EXPECT_GT(dg::multipliedPower(std::nextafter(root, 2.0), 5), 0.001);
  EXPECT_EQ(dg::warmupRatios(1.0, 3), (std::vector<double>{1.0, 1.0, 1.0}));
  EXPECT_EQ(dg::multipliedRoot(0.25, 2), 0.5);  // exact where the root is a double
  EXPECT_EQ(dg::warmupRatios(0.0625, 1), std::vector<double>{0.25});
  // Tiny ratios end too (the bisection walks down to adjacent doubles).
  EXPECT_LE(dg::multipliedPower(dg::multipliedRoot(1e-300, 2), 2), 1e-300);
  // Stages of equal length: 10 steps in 4 stages are 3, 2, 3, 2 steps (floor(step x 4 / 10)).
  std::vector<int> stages;
  for (uint64_t step = 0; step < 10; ++step) stages.push_back(dg::warmupStage(step, 10, 4));
  EXPECT_EQ(stages, (std::vector<int>{0, 0, 0, 1, 1, 2, 2, 2, 3, 3}));
}

// Through the plugin: each step's count lies in the band of its own stage's k, sizes cover the first stage, and from
// step warmup_steps on the payload is the one a plugin without a warm-up writes, bit for bit.
TEST(Dgc, WarmupTakesEachStepsKFromItsStage) {
  const double ratio = 0.01;
  Instance c(dgcPlugin(), {{"ratio", "0.01"}, {"warmup_steps", "8"}, {"warmup_stages", "4"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  Instance plain(dgcPlugin(), {{"ratio", "0.01"}});
  const std::vector<double> ratios = dg::warmupRatios(ratio, 4);
  for (size_t n : {size_t{1000}, size_t{300007}}) {  // exact from the start, and sampled
    const std::vector<float> g = makeData(Dist::kNormal, n, 21);
    const uint64_t k0 = tk::targetCount(ratios[0], n);
    EXPECT_EQ(c.sizes(tensorInfo(n)).max_output_bytes, 24u + 8u * dg::maxCount(k0)) << n;
    uint64_t last = ~uint64_t{0};
    for (uint64_t step = 0; step < 12; ++step) {
      const auto info = tensorInfo(n, {.step = step, .seed = 5});
      const Bytes p = c.compress(info, g);
      const uint64_t count = parseSparse(p).count;
      const double r = step < 8 ? ratios[step / 2] : ratio;
      const uint64_t k = tk::targetCount(r, n);
      EXPECT_GE(count, dg::minCount(k)) << "n " << n << ", step " << step;
      EXPECT_LE(count, dg::maxCount(k)) << "n " << n << ", step " << step;
      if (step % 2 == 0 && step <= 8) {
        EXPECT_LT(k, last) << "n " << n << ": the stage of step " << step << " keeps no fewer than the one before";
        last = k;
      }
      std::vector<float> out(n);
      EXPECT_EQ(c.decompress(info, p, out), TERSE_OK) << c.lastError();
      if (step >= 8) {
        EXPECT_EQ(p, plain.compress(info, g)) << "n " << n << ", step " << step;
      }
    }
  }
}

// A decompress checks the count against its own step's band: a first-stage payload is refused at a later step.
TEST(Dgc, WarmupDecompressHoldsEachStepToItsBand) {
  Instance c(dgcPlugin(), {{"ratio", "0.01"}, {"warmup_steps", "4"}});
  const std::vector<float> g = makeData(Dist::kNormal, 5000, 4);
  const Bytes early = c.compress(tensorInfo(g.size(), {.step = 0}), g);
  std::vector<float> out(g.size(), 5.0f);
  EXPECT_EQ(c.decompress(tensorInfo(g.size(), {.step = 0}), early, out), TERSE_OK) << c.lastError();
  std::fill(out.begin(), out.end(), 5.0f);
  EXPECT_EQ(c.decompress(tensorInfo(g.size(), {.step = 4}), early, out), TERSE_ERR_INVALID_PAYLOAD);
  for (float x : out) ASSERT_EQ(x, 5.0f);
  EXPECT_NE(c.lastError().find("count"), std::string::npos) << c.lastError();
}

TEST(Dgc, WarmupParametersAreChecked) {
  for (const auto& bad : std::vector<Instance::ParamList>{{{"warmup_steps", "-1"}},
                                                          {{"warmup_steps", "1099511627777"}},  // 2^40 + 1
                                                          {{"warmup_steps", "10"}, {"warmup_stages", "0"}},
                                                          {{"warmup_steps", "10"}, {"warmup_stages", "33"}}}) {
    Instance b(dgcPlugin(), bad);
    EXPECT_EQ(b.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << bad.begin()->second;
  }
  Instance lone(dgcPlugin(), {{"warmup_stages", "4"}});
  EXPECT_EQ(lone.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(lone.lastError().find("'warmup_stages' is set but 'warmup_steps' is 0"), std::string::npos)
      << lone.lastError();
  Instance edge(dgcPlugin(), {{"warmup_steps", "1099511627776"}, {"warmup_stages", "32"}});
  EXPECT_TRUE(edge.ok()) << edge.lastError();
  // More stages than steps would leave a stage empty: refused when given; the default of 4 shrinks to the steps.
  Instance crowded(dgcPlugin(), {{"warmup_steps", "3"}, {"warmup_stages", "4"}});
  EXPECT_EQ(crowded.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(crowded.lastError().find("'warmup_stages' 4 is above 'warmup_steps' 3: a stage would have no step"),
            std::string::npos)
      << crowded.lastError();
  Instance shrunk(dgcPlugin(), {{"ratio", "0.01"}, {"warmup_steps", "2"}});
  ASSERT_TRUE(shrunk.ok()) << shrunk.lastError();
  const std::vector<float> g = makeData(Dist::kNormal, 5000, 9);
  for (uint64_t step = 0; step < 2; ++step) {  // two stages of one step: 0.01^(1/3) and 0.01^(2/3)
    const uint64_t k = tk::targetCount(dg::warmupRatios(0.01, 2)[step], g.size());
    const uint64_t count = parseSparse(shrunk.compress(tensorInfo(g.size(), {.step = step}), g)).count;
    EXPECT_GE(count, dg::minCount(k)) << step;
    EXPECT_LE(count, dg::maxCount(k)) << step;
  }
}

}  // namespace
