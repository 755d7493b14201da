// threshold: exact selection of |g| >= tau (tau compared in double, also when it is not a float), the empty payload,
// the variable size, tau being required, and payload validation.
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/threshold/threshold_math.h"
#include "terse/kit/sparse_payload.hpp"
#include "tests/compressors/plugin_harness.h"
#include "tests/compressors/sparse_test_util.h"

namespace {

using terse::testing::Bytes;
using terse::testing::Instance;
using terse::testing::patched;
using terse::testing::Plugin;
using terse::testing::readAt;
using terse::testing::tensorInfo;
using terse::testing::truncated;
using namespace terse::testing::sparse;

Plugin& thresholdPlugin() {
  static Plugin plugin("threshold");
  return plugin;
}

// The device decoders of threshold and dgc take a payload's count from its size (no read back of the count field): the
// inverse of payloadBytes, and no count for a size between two payloads' or below the fixed part.
TEST(SparsePayload, CountForSizeInvertsPayloadBytes) {
  namespace sparse = terse::kit::sparse;
  for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1} << 31, (uint64_t{1} << 32) - 1}) {
    uint64_t got = ~uint64_t{0};
    ASSERT_TRUE(sparse::countForSize(sparse::payloadBytes(count), &got)) << count;
    EXPECT_EQ(got, count);
  }
  uint64_t got = 0;
  for (uint64_t bytes : {uint64_t{0}, sparse::kFixedBytes - 1, sparse::kFixedBytes + 1, sparse::kFixedBytes + 4,
                         sparse::payloadBytes(5) + 7}) {
    EXPECT_FALSE(sparse::countForSize(bytes, &got)) << bytes;
  }
}

TEST(Threshold, TauIsRequiredAndPositive) {
  Instance none(thresholdPlugin());
  EXPECT_EQ(none.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(none.lastError().find("'tau' is required"), std::string::npos) << none.lastError();
  for (const char* bad : {"0", "-1", "inf", "x"}) {
    Instance c(thresholdPlugin(), {{"tau", bad}});
    EXPECT_EQ(c.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << bad;
  }
}

TEST(Threshold, CapsAndSizes) {
  Instance c(thresholdPlugin(), {{"tau", "0.5"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  const terse_compressor_caps_v1 caps = c.caps();
  EXPECT_EQ(caps.aggregation, TERSE_AGG_ALLGATHER);
  EXPECT_EQ(caps.flags & TERSE_CAP_FIXED_SIZE, 0u);
  EXPECT_EQ(caps.num_rounds, 1);
  EXPECT_EQ(c.sizes(tensorInfo(1000)).max_output_bytes, 24u + 8u * 1000u);
  EXPECT_EQ(c.sizes(tensorInfo(1000)).workspace_bytes, 0u);
}

TEST(Threshold, SelectsExactlyTheElementsAtOrAboveTau) {
  for (double tau : {0.1, 0.5, 1.0, 2.5, 1e-3}) {
    Instance c(thresholdPlugin(), {{"tau", numberText(tau)}});
    for (Dist d : {Dist::kNormal, Dist::kHeavyTailed, Dist::kTies, Dist::kManyZeros}) {
      for (size_t n : {size_t{1}, size_t{13}, size_t{4096}, (size_t{1} << 20) + 3}) {
        const std::vector<float> g = makeData(d, n, static_cast<uint32_t>(n + 1));
        const auto info = tensorInfo(n);
        const Bytes p = c.compress(info, g);
        const SparsePayload s = parseSparse(p);
        std::vector<uint32_t> want;
        for (size_t i = 0; i < n; ++i) {
          if (std::fabs(static_cast<double>(g[i])) >= tau) want.push_back(static_cast<uint32_t>(i));
        }
        ASSERT_EQ(s.indices, want) << distName(d) << " n = " << n << " tau = " << tau;
        for (size_t j = 0; j < s.count; ++j) ASSERT_EQ(s.values[j], g[s.indices[j]]);
        std::vector<float> dense(n, 0.0f);
        for (uint32_t i : want) dense[i] = g[i];
        ASSERT_EQ(c.decode(info, p), dense);
      }
    }
  }
}

// tau = 0.1 is no float: float(0.1) lies above it and is kept, the float just below 0.1 is not; a float tau is
// inclusive.
TEST(Threshold, TauComparedExactly) {
  Instance c(thresholdPlugin(), {{"tau", "0.1"}});
  const float above = 0.1f;
  const float below = std::nextafter(0.1f, 0.0f);
  ASSERT_GT(static_cast<double>(above), 0.1);
  ASSERT_LT(static_cast<double>(below), 0.1);
  const std::vector<float> g = {below, -above, -below, above, 0.0f};
  EXPECT_EQ(parseSparse(c.compress(tensorInfo(g.size()), g)).indices, (std::vector<uint32_t>{1, 3}));
  Instance half(thresholdPlugin(), {{"tau", "0.5"}});
  const std::vector<float> h = {0.5f, -0.5f, std::nextafter(0.5f, 0.0f)};
  EXPECT_EQ(parseSparse(half.compress(tensorInfo(h.size()), h)).indices, (std::vector<uint32_t>{0, 1}));
}

TEST(Threshold, EmptySelectionIsAValidPayload) {
  Instance c(thresholdPlugin(), {{"tau", "100"}});
  const std::vector<float> g = makeData(Dist::kNormal, 777, 2);
  const auto info = tensorInfo(g.size());
  const Bytes p = c.compress(info, g);
  ASSERT_EQ(p.size(), 24u);
  EXPECT_EQ(readAt<uint64_t>(p, 16), 0u);
  EXPECT_EQ(c.decode(info, p), std::vector<float>(g.size(), 0.0f));
  std::vector<float> out(g.size(), 2.0f);
  ASSERT_EQ(c.decompress(info, p, out, /*accumulate=*/true), TERSE_OK);
  EXPECT_EQ(out, std::vector<float>(g.size(), 2.0f));
  // And an empty tensor.
  const Bytes e = c.compress(tensorInfo(0), {});
  EXPECT_EQ(e.size(), 24u);
  EXPECT_EQ(c.decompress(tensorInfo(0), e, {}), TERSE_OK);
}

TEST(Threshold, EverythingSelectedFillsTheMaximum) {
  Instance c(thresholdPlugin(), {{"tau", "1e-30"}});
  const std::vector<float> g = makeData(Dist::kUniform, 1001, 3);
  const auto info = tensorInfo(g.size());
  const Bytes p = c.compress(info, g);
  EXPECT_EQ(p.size(), c.sizes(info).max_output_bytes);
  EXPECT_EQ(c.decode(info, p), g);
}

TEST(Threshold, RefusesNonFiniteGradient) {
  Instance c(thresholdPlugin(), {{"tau", "0.5"}});
  for (float bad : {INFINITY, NAN}) {
    std::vector<float> g(100, 0.0f);
    g[50] = bad;
    Bytes out;
    EXPECT_EQ(c.tryCompress(tensorInfo(g.size()), g, &out), TERSE_ERR_INVALID_ARGUMENT);
  }
}

TEST(Threshold, RejectsMalformedPayloads) {
  Instance c(thresholdPlugin(), {{"tau", "0.5"}});
  std::vector<float> g(50, 0.0f);
  g[3] = 1.0f;
  g[10] = -2.0f;
  g[40] = 0.75f;
  const auto info = tensorInfo(g.size());
  const Bytes good = c.compress(info, g);
  const uint64_t n = 3;
  ASSERT_EQ(parseSparse(good).count, n);
  for (const auto& [what, payload] : std::vector<std::pair<std::string, Bytes>>{
           {"truncated", truncated(good, 4)},
           {"no count", truncated(good, good.size() - 16)},
           {"count above numel", patched<uint64_t>(good, 16, 51)},
           {"count disagrees with size", patched<uint64_t>(good, 16, 2)},
           {"index out of range", patched<uint32_t>(good, indexOffset(n, 2), 50)},
           {"indices not increasing", patched<uint32_t>(good, indexOffset(n, 1), 3)},
           {"value below tau", patched<float>(good, valueOffset(0), 0.25f)},
           {"zero value", patched<float>(good, valueOffset(1), 0.0f)},
           {"NaN value", patched<float>(good, valueOffset(2), NAN)},
           {"wrong magic", patched<uint32_t>(good, 0, 0x4b504f54u)}}) {  // "TOPK": another plugin's payload
    std::vector<float> out(g.size(), 1.0f);
    EXPECT_EQ(c.decompress(info, payload, out), TERSE_ERR_INVALID_PAYLOAD) << what;
    for (float x : out) ASSERT_EQ(x, 1.0f) << what;
  }
}

}  // namespace
