// randomk: the shared index choice (same on every rank, fresh per step and tensor, exactly k distinct indices), the
// SUM path end to end, the unbiased scaling in expectation, and payload validation.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/randomk/randomk_math.h"
#include "tests/compressors/plugin_harness.h"
#include "tests/compressors/sparse_test_util.h"

namespace {

using terse::testing::aggregateInfo;
using terse::testing::Bytes;
using terse::testing::Instance;
using terse::testing::patched;
using terse::testing::Plugin;
using terse::testing::sumPayloads;
using terse::testing::tensorInfo;
using terse::testing::truncated;
namespace rk = terse::compressors::randomk;

Plugin& randomkPlugin() {
  static Plugin plugin("randomk");
  return plugin;
}

// Inputs with no zero anywhere, distinct per rank, so a decoded coordinate is nonzero exactly when it was selected.
std::vector<float> rankInput(size_t n, int rank) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = 1.0f + static_cast<float>(i % 97) + 0.25f * static_cast<float>(rank);
  return g;
}

std::set<uint32_t> support(const std::vector<float>& v) {
  std::set<uint32_t> s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != 0.0f) s.insert(static_cast<uint32_t>(i));
  }
  return s;
}

TEST(RandomK, CapsAndSizes) {
  Instance c(randomkPlugin(), {{"ratio", "0.01"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  const terse_compressor_caps_v1 caps = c.caps();
  EXPECT_EQ(caps.aggregation, TERSE_AGG_SUM);
  EXPECT_EQ(caps.wire_dtype, TERSE_DTYPE_F32);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE | TERSE_CAP_SHARED_SEED);
  EXPECT_EQ(caps.num_rounds, 1);
  const terse_compressor_sizes_v1 s = c.sizes(tensorInfo(1u << 20));
  EXPECT_EQ(s.max_output_bytes, 16u + 4u * 10486u);
  EXPECT_EQ(s.sum_header_bytes, 16u);
  EXPECT_EQ(s.workspace_bytes, 0u);
  EXPECT_EQ(s.state_bytes, 0u);
  Instance bad(randomkPlugin(), {{"unbiased", "maybe"}});
  EXPECT_EQ(bad.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
}

// The permutation behind the choice: k distinct in-range indices for awkward n, all of [0, n) when k = n.
TEST(RandomK, PermutationIsABijection) {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 64ull, 65ull, 1000ull, 4097ull}) {
    const rk::Permutation p = rk::makePermutation(42, 3, 9, n);
    std::set<uint64_t> seen;
    for (uint64_t j = 0; j < n; ++j) {
      const uint64_t i = rk::selectedIndex(p, j);
      ASSERT_LT(i, n);
      seen.insert(i);
    }
    EXPECT_EQ(seen.size(), n) << "n = " << n;
  }
  const uint64_t n = (1ull << 20) + 3;
  const rk::Permutation p = rk::makePermutation(1, 0, 0, n);
  std::set<uint64_t> seen;
  for (uint64_t j = 0; j < 10486; ++j) seen.insert(rk::selectedIndex(p, j));
  EXPECT_EQ(seen.size(), 10486u);
  EXPECT_LT(*seen.rbegin(), n);
}

TEST(RandomK, SameIndicesOnEveryRankFreshPerStepAndTensor) {
  Instance c(randomkPlugin(), {{"ratio", "0.05"}});
  const size_t n = 2001;
  const uint64_t k = rk::targetCount(0.05, n);
  std::set<uint32_t> first;
  for (int rank = 0; rank < 4; ++rank) {
    const auto info = tensorInfo(n, {.rank = rank, .world_size = 4, .step = 5, .seed = 77, .tensor_id = 3});
    const std::set<uint32_t> s = support(c.decode(info, c.compress(info, rankInput(n, rank))));
    EXPECT_EQ(s.size(), k) << "rank " << rank;
    if (rank == 0) {
      first = s;
    } else {
      EXPECT_EQ(s, first) << "rank " << rank << " picked other indices than rank 0";
    }
  }
  const auto pick = [&](uint64_t step, uint64_t tensor) {
    const auto info = tensorInfo(n, {.step = step, .seed = 77, .tensor_id = tensor});
    return support(c.decode(info, c.compress(info, rankInput(n, 0))));
  };
  EXPECT_NE(pick(6, 3), first) << "the same indices two steps running";
  EXPECT_NE(pick(5, 4), first) << "the same indices for two tensors";
  EXPECT_EQ(pick(5, 3), first) << "not deterministic";
}

TEST(RandomK, SumOfPayloadsDecodesToSumOverRanks) {
  Instance c(randomkPlugin(), {{"ratio", "0.1"}});
  const size_t n = 1003;
  const int world = 4;
  std::vector<Bytes> payloads;
  std::vector<std::vector<float>> inputs;
  std::vector<float> sum_of_decodes(n, 0.0f);
  for (int rank = 0; rank < world; ++rank) {
    const auto info = tensorInfo(n, {.rank = rank, .world_size = world, .step = 2, .seed = 5});
    inputs.push_back(rankInput(n, rank));
    payloads.push_back(c.compress(info, inputs.back()));
    ASSERT_EQ(c.decompress(info, payloads.back(), sum_of_decodes, /*accumulate=*/true), TERSE_OK);
  }
  const auto info = tensorInfo(n, {.world_size = world, .step = 2, .seed = 5});
  const Bytes total = sumPayloads(payloads, c.sizes(info).sum_header_bytes, TERSE_DTYPE_F32);
  const std::vector<float> decoded = c.decode(aggregateInfo(info), total);
  const std::set<uint32_t> sel = support(decoded);
  ASSERT_EQ(sel.size(), rk::targetCount(0.1, n));
  for (size_t i = 0; i < n; ++i) {
    float want = 0.0f;
    if (sel.count(static_cast<uint32_t>(i)) != 0) {
      for (int rank = 0; rank < world; ++rank) want += inputs[static_cast<size_t>(rank)][i];
    }
    ASSERT_EQ(decoded[i], want) << i;
    ASSERT_EQ(sum_of_decodes[i], want) << i;  // the per-rank decodes add up to the aggregate's
  }
}

// E[decoded] = g with unbiased (each coordinate is kept with probability k/n and scaled by n/k), E = (k/n) g without.
TEST(RandomK, UnbiasedScalingInExpectation) {
  const size_t n = 64;
  const uint64_t k = 8;
  const int steps = 6000;
  const std::vector<float> g = terse::testing::sparse::makeData(terse::testing::sparse::Dist::kNormal, n, 4);
  for (bool unbiased : {true, false}) {
    Instance c(randomkPlugin(), {{"ratio", "0.125"}, {"unbiased", unbiased ? "true" : "false"}});
    std::vector<double> mean(n, 0.0);
    std::vector<int> hits(n, 0);
    for (int step = 0; step < steps; ++step) {
      const auto info = tensorInfo(n, {.step = static_cast<uint64_t>(step), .seed = 9});
      const std::vector<float> d = c.decode(info, c.compress(info, g));
      for (size_t i = 0; i < n; ++i) {
        mean[i] += d[i] / steps;
        hits[i] += d[i] != 0.0f ? 1 : 0;
      }
    }
    const double p = static_cast<double>(k) / n;
    for (size_t i = 0; i < n; ++i) {
      // Inclusion frequency: binomial(steps, p), 5 standard deviations.
      EXPECT_NEAR(hits[i], steps * p, 5 * std::sqrt(steps * p * (1 - p))) << "coordinate " << i;
      // Mean: per step g_i s B with B ~ Bernoulli(p); its standard error is |g_i| s sqrt(p(1-p)/steps).
      const double s = unbiased ? 1.0 / p : 1.0;
      const double want = unbiased ? g[i] : p * g[i];
      EXPECT_NEAR(mean[i], want, 5 * std::fabs(g[i]) * s * std::sqrt(p * (1 - p) / steps) + 1e-6)
          << (unbiased ? "unbiased" : "plain") << ", coordinate " << i;
    }
  }
}

// The plugin computes the indices in prefetched batches (randomk.cc): its payload and its decode must be exactly
// the one-index-at-a-time definition, at sizes around a batch and the 64-element blocks and at a large one.
TEST(RandomK, PayloadAndDecodeMatchTheIndexDefinition) {
  Instance c(randomkPlugin(), {{"ratio", "0.3"}, {"unbiased", "true"}});
  for (const size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, size_t{200003}}) {
    const auto info = tensorInfo(n, {.step = 7, .seed = 11});
    const std::vector<float> g = terse::testing::sparse::makeData(terse::testing::sparse::Dist::kNormal, n, 2);
    const Bytes payload = c.compress(info, g);
    const uint64_t k = rk::targetCount(0.3, n);
    ASSERT_EQ(payload.size(), 16 + 4 * k) << n;
    const rk::Permutation pi = rk::makePermutation(11, 7, info.tensor_id, n);
    const float scale = rk::unbiasedScale(n, k);
    std::vector<float> base(n), want(n);
    for (size_t i = 0; i < n; ++i) base[i] = want[i] = 0.5f * static_cast<float>(i % 7);
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t i = rk::selectedIndex(pi, j);
      float v;
      std::memcpy(&v, payload.data() + 16 + 4 * j, sizeof v);
      ASSERT_EQ(v, scale * g[i]) << "n " << n << ", value " << j;
      want[i] += v;
    }
    ASSERT_EQ(c.decompress(info, payload, base, /*accumulate=*/true), TERSE_OK);
    ASSERT_EQ(base, want) << n;
  }
}

TEST(RandomK, EdgeSizes) {
  Instance c(randomkPlugin(), {{"ratio", "0.5"}});
  const auto empty = tensorInfo(0);
  const Bytes p0 = c.compress(empty, {});
  EXPECT_EQ(p0.size(), 16u);
  EXPECT_EQ(c.decompress(empty, p0, {}), TERSE_OK);
  const std::vector<float> one = {-3.5f};
  const auto info1 = tensorInfo(1);
  EXPECT_EQ(c.decode(info1, c.compress(info1, one)), one);
  Instance all(randomkPlugin(), {{"ratio", "1"}});
  const std::vector<float> g = terse::testing::sparse::makeData(terse::testing::sparse::Dist::kNormal, 333, 1);
  EXPECT_EQ(all.decode(tensorInfo(333), all.compress(tensorInfo(333), g)), g);
}

TEST(RandomK, RejectsMalformedPayloads) {
  Instance c(randomkPlugin(), {{"ratio", "0.1"}});
  const auto info = tensorInfo(100);
  const Bytes good = c.compress(info, rankInput(100, 0));
  ASSERT_EQ(good.size(), 16u + 40u);
  Bytes longer = good;
  longer.resize(good.size() + 4);
  for (const auto& [what, payload] :
       std::vector<std::pair<std::string, Bytes>>{{"empty", Bytes{}},
                                                  {"short header", truncated(good, good.size() - 8)},
                                                  {"one value short", truncated(good, 4)},
                                                  {"one value long", longer},
                                                  {"wrong magic", patched<uint32_t>(good, 0, 0)},
                                                  {"wrong numel", patched<uint64_t>(good, 8, 99)},
                                                  {"wrong dtype", patched<uint16_t>(good, 6, TERSE_DTYPE_BF16)}}) {
    std::vector<float> out(100, 3.0f);
    EXPECT_EQ(c.decompress(info, payload, out), TERSE_ERR_INVALID_PAYLOAD) << what;
    for (float x : out) ASSERT_EQ(x, 3.0f) << what;
  }
}

}  // namespace
