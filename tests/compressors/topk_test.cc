// topk: exact top-k by magnitude. The plugin's selection is checked element for element against a sorted reference
// (ties to the lower index) on data with and without ties, at the edges of k, through both paths of the radix select
// (candidate buffer and full tensor), and its payloads are checked for full validation.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_select.hpp"
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
namespace tk = terse::kit::topk;

Plugin& topkPlugin() {
  static Plugin plugin("topk");
  return plugin;
}

TEST(TopK, CapsAndSizes) {
  Instance c(topkPlugin(), {{"ratio", "0.01"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  const terse_compressor_caps_v1 caps = c.caps();
  EXPECT_EQ(caps.aggregation, TERSE_AGG_ALLGATHER);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE);
  EXPECT_EQ(caps.num_rounds, 1);
  EXPECT_EQ(caps.devices, terse::testing::kCudaPluginDevices);
  terse_compressor_caps_v1 f16{};
  EXPECT_EQ(c.getCaps(TERSE_DTYPE_F16, &f16), TERSE_ERR_UNSUPPORTED);

  // 2^20 elements at 1%: k = round(10485.76) = 10486, 24 + 8k bytes.
  const terse_compressor_sizes_v1 s = c.sizes(tensorInfo(1u << 20));
  EXPECT_EQ(s.max_output_bytes, 24u + 8u * 10486u);
  EXPECT_EQ(s.state_bytes, 0u);
  EXPECT_GT(s.workspace_bytes, 0u);
  EXPECT_EQ(c.sizes(tensorInfo(0)).max_output_bytes, 24u);
}

// sparse::requireDevice: an unknown device is refused in every build, a CUDA tensor exactly when the plugin was built
// without its kernels (with them, sizing a CUDA tensor asks cub for its scan storage and so needs a GPU: the cuda tests
// cover that).
TEST(TopK, RefusesDevicesItHasNoKernelsFor) {
  Instance c(topkPlugin(), {{"ratio", "0.01"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  terse_compressor_sizes_v1 s{};
  terse_tensor_info_v1 info = tensorInfo(100);
  info.device = static_cast<terse_device_v1>(4);
  EXPECT_EQ(c.getSizes(info, &s), TERSE_ERR_UNSUPPORTED);
  EXPECT_NE(c.lastError().find("topk: unknown device 4"), std::string::npos) << c.lastError();
  if (!TERSE_TEST_CUDA_PLUGINS) {
    info.device = TERSE_DEVICE_CUDA;
    info.device_index = 0;
    EXPECT_EQ(c.getSizes(info, &s), TERSE_ERR_UNSUPPORTED);
    EXPECT_NE(c.lastError().find("topk: only host memory is supported (this build of the plugin has no CUDA kernels)"),
              std::string::npos)
        << c.lastError();
  }
}

TEST(TopK, RejectsBadParameters) {
  for (const char* bad : {"0", "-0.5", "1.5", "abc", "nan"}) {
    Instance c(topkPlugin(), {{"ratio", bad}});
    EXPECT_EQ(c.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << bad;
  }
  Instance typo(topkPlugin(), {{"ration", "0.1"}});
  EXPECT_EQ(typo.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(typo.lastError().find("ration"), std::string::npos) << typo.lastError();
}

TEST(TopK, TargetCountRule) {
  EXPECT_EQ(tk::targetCount(0.01, 0), 0u);
  EXPECT_EQ(tk::targetCount(0.01, 1), 1u);  // never fewer than 1
  EXPECT_EQ(tk::targetCount(1e-9, 1000), 1u);
  EXPECT_EQ(tk::targetCount(1.0, 12345), 12345u);  // never more than numel
  EXPECT_EQ(tk::targetCount(0.07, 100), 7u);       // 0.07 * 100 = 7.000000000000001: rounded, not ceiled
  EXPECT_EQ(tk::targetCount(0.5, 3), 2u);          // 1.5 rounds half up
  EXPECT_EQ(tk::targetCount(0.01, 1u << 20), 10486u);
}

// The plugin's payload for g against the reference, values and indices exactly.
void expectExactTopK(Instance& c, const std::vector<float>& g, double ratio, const std::string& what) {
  const auto info = tensorInfo(g.size());
  const Bytes p = c.compress(info, g);
  const uint64_t k = tk::targetCount(ratio, g.size());
  EXPECT_EQ(p.size(), c.sizes(info).max_output_bytes) << what;
  const SparsePayload s = parseSparse(p);
  ASSERT_EQ(s.count, k) << what;
  const std::vector<uint32_t> want = referenceTopK(g, static_cast<size_t>(k));
  ASSERT_EQ(s.indices, want) << what;
  for (size_t j = 0; j < s.count; ++j) {
    ASSERT_EQ(tk::floatBits(s.values[j]), tk::floatBits(g[s.indices[j]])) << what << " entry " << j;
  }
}

TEST(TopK, MatchesSortedReference) {
  for (double ratio : {0.001, 0.01, 0.1, 0.5, 1.0}) {
    Instance c(topkPlugin(), {{"ratio", numberText(ratio)}});
    ASSERT_TRUE(c.ok()) << c.lastError();
    for (Dist d : {Dist::kNormal, Dist::kUniform, Dist::kHeavyTailed, Dist::kConstant, Dist::kManyZeros, Dist::kTies,
                   Dist::kTiny}) {
      for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}, size_t{4097}, size_t{100003}}) {
        expectExactTopK(c, makeData(d, n, static_cast<uint32_t>(n)), ratio,
                        std::string(distName(d)) + ", n = " + std::to_string(n) + ", ratio = " + numberText(ratio));
      }
    }
  }
}

TEST(TopK, LargeOddTensor) {
  Instance c(topkPlugin(), {{"ratio", "0.01"}});
  const size_t n = (size_t{1} << 20) + 3;
  expectExactTopK(c, makeData(Dist::kNormal, n, 99), 0.01, "normal, n = 2^20 + 3");
  expectExactTopK(c, makeData(Dist::kTies, n, 98), 0.01, "ties, n = 2^20 + 3");
}

// Ties straddling the k-th magnitude: the lowest indices win, whatever their sign.
TEST(TopK, TiesGoToLowerIndex) {
  Instance c(topkPlugin(), {{"ratio", "0.5"}});
  const std::vector<float> g = {1.0f, -2.0f, 2.0f, -1.0f, 1.0f, 0.5f, -1.0f, 1.0f};  // k = 4
  const SparsePayload s = parseSparse(c.compress(tensorInfo(g.size()), g));
  EXPECT_EQ(s.indices, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.values, (std::vector<float>{1.0f, -2.0f, 2.0f, -1.0f}));
}

// -0 and +0 are the same magnitude; subnormals order correctly by their bits.
TEST(TopK, SignedZerosAndSubnormals) {
  Instance c(topkPlugin(), {{"ratio", "0.5"}});
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> g = {-0.0f, 0.0f, tiny, -2 * tiny, 0.0f, -0.0f};  // k = 3
  const SparsePayload s = parseSparse(c.compress(tensorInfo(g.size()), g));
  EXPECT_EQ(s.indices, (std::vector<uint32_t>{0, 2, 3}));
}

TEST(TopK, EmptyTensor) {
  Instance c(topkPlugin(), {{"ratio", "0.3"}});
  const auto info = tensorInfo(0);
  const Bytes p = c.compress(info, {});
  ASSERT_EQ(p.size(), 24u);
  EXPECT_EQ(parseSparse(p).count, 0u);
  EXPECT_EQ(c.decompress(info, p, {}), TERSE_OK) << c.lastError();
}

TEST(TopK, DecompressScattersAndAccumulates) {
  Instance c(topkPlugin(), {{"ratio", "0.1"}});
  const std::vector<float> g = makeData(Dist::kNormal, 1001, 5);
  const auto info = tensorInfo(g.size());
  const Bytes p = c.compress(info, g);
  const std::vector<uint32_t> sel = referenceTopK(g, tk::targetCount(0.1, g.size()));
  std::vector<float> want(g.size(), 0.0f);
  for (uint32_t i : sel) want[i] = g[i];
  EXPECT_EQ(c.decode(info, p), want);

  std::vector<float> out(g.size(), 1.0f);
  ASSERT_EQ(c.decompress(info, p, out, /*accumulate=*/true), TERSE_OK);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(out[i], 1.0f + want[i]) << i;
}

TEST(TopK, RefusesNonFiniteGradient) {
  Instance c(topkPlugin(), {{"ratio", "0.01"}});
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    std::vector<float> g = makeData(Dist::kNormal, 5000, 3);
    g[1234] = bad;
    Bytes out;
    EXPECT_EQ(c.tryCompress(tensorInfo(g.size()), g, &out), TERSE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(c.lastError().find("non-finite"), std::string::npos) << c.lastError();
  }
}

TEST(TopK, RejectsMalformedPayloads) {
  Instance c(topkPlugin(), {{"ratio", "0.1"}});
  const std::vector<float> g = makeData(Dist::kNormal, 100, 11);
  const auto info = tensorInfo(g.size());
  const Bytes good = c.compress(info, g);
  const uint64_t k = 10;
  ASSERT_EQ(parseSparse(good).count, k);
  const auto idx = [&](size_t j) { return readAt<uint32_t>(good, indexOffset(k, j)); };

  const std::vector<std::pair<std::string, Bytes>> bad = {
      {"empty", Bytes{}},
      {"header only", truncated(good, good.size() - 16)},
      {"truncated by one byte", truncated(good, 1)},
      {"trailing byte",
       [&] {
         Bytes b = good;
         b.push_back(std::byte{0});
         return b;
       }()},
      {"wrong magic", patched<uint32_t>(good, 0, 0x12345678u)},
      {"wrong version", patched<uint16_t>(good, 4, 99)},
      {"wrong dtype", patched<uint16_t>(good, 6, TERSE_DTYPE_F16)},
      {"wrong numel", patched<uint64_t>(good, 8, 101)},
      {"count k - 1", patched<uint64_t>(good, 16, k - 1)},
      {"count above numel", patched<uint64_t>(good, 16, 1000)},
      {"count huge", patched<uint64_t>(good, 16, ~uint64_t{0} / 4)},
      {"index out of range", patched<uint32_t>(good, indexOffset(k, 9), 100)},
      {"index far out of range", patched<uint32_t>(good, indexOffset(k, 0), 0xffffffffu)},
      {"duplicate index", patched<uint32_t>(good, indexOffset(k, 1), idx(0))},
      {"decreasing indices",
       patched<uint32_t>(patched<uint32_t>(good, indexOffset(k, 0), idx(1)), indexOffset(k, 1), idx(0))},
      {"NaN value", patched<float>(good, valueOffset(3), NAN)},
      {"inf value", patched<float>(good, valueOffset(0), -INFINITY)},
  };
  for (const auto& [what, payload] : bad) {
    std::vector<float> out(g.size(), 7.0f);
    EXPECT_EQ(c.decompress(info, payload, out), TERSE_ERR_INVALID_PAYLOAD) << what;
    // Validation comes before any write.
    for (float x : out) ASSERT_EQ(x, 7.0f) << what;
  }
  // A payload of another ratio is the wrong size for this one.
  Instance other(topkPlugin(), {{"ratio", "0.2"}});
  std::vector<float> out(g.size());
  EXPECT_EQ(other.decompress(info, good, out), TERSE_ERR_INVALID_PAYLOAD);
}

// The radix select's two paths (candidate buffer, full tensor) select the same elements.
TEST(TopKSelect, CandidatePathAndFullPathAgree) {
  for (Dist d : {Dist::kNormal, Dist::kUniform, Dist::kTies, Dist::kManyZeros}) {
    const std::vector<float> g = makeData(d, 200003, 17);
    for (uint64_t k : {uint64_t{1}, uint64_t{2000}, uint64_t{100000}, uint64_t{200002}}) {
      const uint64_t cap = tk::candidateCapacity(g.size(), k);
      std::vector<std::byte, terse::testing::AlignedAllocator<std::byte>> ws(tk::selectWorkspaceBytes(cap));
      std::vector<float> v1(k), v2(k);
      std::vector<uint32_t> i1(k), i2(k);
      EXPECT_FALSE(tk::selectTopK(g, k, tk::SelectScratch::carve(ws.data(), cap), v1.data(), i1.data()));
      EXPECT_FALSE(tk::selectTopK(g, k, tk::SelectScratch::carve(ws.data(), 0), v2.data(), i2.data()));
      EXPECT_EQ(i1, i2) << distName(d) << " k = " << k;
      EXPECT_EQ(i1, referenceTopK(g, k)) << distName(d) << " k = " << k;
    }
  }
}

}  // namespace
