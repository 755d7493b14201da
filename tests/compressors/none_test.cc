// none: the identity baseline through the plugin ABI: caps, exact sizes, bit-exact round trips (NaN and infinities
// included), the core's SUM path over several ranks, and payload validation.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "tests/compressors/plugin_harness.h"

namespace terse::testing {
namespace {

TEST(None, CapsAndSizes) {
  Plugin plugin("none");
  Instance c(plugin);
  ASSERT_TRUE(c.ok()) << c.lastError();
  const auto caps = c.caps();
  EXPECT_EQ(caps.devices, kCudaPluginDevices);
  EXPECT_EQ(caps.aggregation, TERSE_AGG_SUM);
  EXPECT_EQ(caps.wire_dtype, TERSE_DTYPE_F32);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE | TERSE_CAP_IDENTITY);
  EXPECT_EQ(caps.num_rounds, 1);
  terse_compressor_caps_v1 other{};
  EXPECT_EQ(c.getCaps(TERSE_DTYPE_F16, &other), TERSE_ERR_UNSUPPORTED);
  EXPECT_NE(c.lastError().find("only f32"), std::string::npos) << c.lastError();

  for (uint64_t n : {0ull, 1ull, 1000ull, 1ull << 20}) {
    const auto s = c.sizes(tensorInfo(n));
    EXPECT_EQ(s.max_output_bytes, 16 + 4 * n);
    EXPECT_EQ(s.sum_header_bytes, 16u);
    EXPECT_EQ(s.workspace_bytes, 0u);
    EXPECT_EQ(s.state_bytes, 0u);
    EXPECT_EQ(s.max_reduced_bytes, 0u);
  }
  terse_compressor_sizes_v1 s{};
  EXPECT_EQ(c.getSizes(tensorInfo(10, {.dtype = TERSE_DTYPE_BF16}), &s), TERSE_ERR_UNSUPPORTED);
  terse_tensor_info_v1 cuda = tensorInfo(10);
  cuda.device = TERSE_DEVICE_CUDA;
  cuda.device_index = 0;
  // Sizing touches no memory, so it answers for CUDA tensors exactly when the plugin has its kernels.
  EXPECT_EQ(c.getSizes(cuda, &s), TERSE_TEST_CUDA_PLUGINS ? TERSE_OK : TERSE_ERR_UNSUPPORTED) << c.lastError();
}

TEST(None, RejectsUnknownParameters) {
  Plugin plugin("none");
  Instance c(plugin, {{"levels", "3"}});
  EXPECT_EQ(c.initStatus(), TERSE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(c.lastError().find("unknown parameter 'levels'"), std::string::npos) << c.lastError();
}

TEST(None, RoundTripIsBitExactForAnySize) {
  Plugin plugin("none");
  Instance c(plugin);
  for (uint64_t n : {0ull, 1ull, 2ull, 7ull, 1001ull, (1ull << 20) + 3}) {
    std::vector<float> g = gaussian(n, static_cast<uint32_t>(n));
    if (n > 3) {
      g[0] = std::numeric_limits<float>::quiet_NaN();
      g[1] = std::numeric_limits<float>::infinity();
      g[2] = -0.0f;
      g[3] = 0x1p-149f;
    }
    const auto info = tensorInfo(n);
    const Bytes p = c.compress(info, g);
    ASSERT_EQ(p.size(), 16 + 4 * n);
    const std::vector<float> out = c.decode(info, p);
    ASSERT_EQ(out.size(), g.size());
    if (n > 0) {  // memcmp on the null data() of an empty vector is undefined
      EXPECT_EQ(std::memcmp(out.data(), g.data(), 4 * n), 0) << "n = " << n;
    }
  }
}

TEST(None, AccumulateAdds) {
  Plugin plugin("none");
  Instance c(plugin);
  const auto info = tensorInfo(5);
  const std::vector<float> g = {1, -2, 3.5f, 0, 1e-3f};
  const Bytes p = c.compress(info, g);
  std::vector<float> out = {10, 20, 30, 40, 50};
  std::vector<float> want = out;
  for (size_t i = 0; i < want.size(); ++i) want[i] += g[i];
  ASSERT_EQ(c.decompress(info, p, out, /*accumulate=*/true), TERSE_OK);
  EXPECT_EQ(out, want);
}

TEST(None, SumOverRanksDecodesToTheSum) {
  Plugin plugin("none");
  Instance c(plugin);
  const int world = 3;
  const uint64_t n = 777;
  std::vector<Bytes> payloads;
  std::vector<float> want(n, 0.0f);
  for (int r = 0; r < world; ++r) {
    const auto g = gaussian(n, 100 + static_cast<uint32_t>(r));
    for (uint64_t i = 0; i < n; ++i) want[i] += g[i];
    payloads.push_back(c.compress(tensorInfo(n, {.rank = r, .world_size = world}), g));
  }
  const Bytes sum = sumPayloads(payloads, c.sizes(tensorInfo(n)).sum_header_bytes, TERSE_DTYPE_F32);
  const auto agg = aggregateInfo(tensorInfo(n, {.world_size = world}));
  EXPECT_EQ(c.decode(agg, sum), want);
}

TEST(None, RejectsMalformedPayloads) {
  Plugin plugin("none");
  Instance c(plugin);
  for (uint64_t n : {0ull, 1ull, 33ull}) {
    const auto info = tensorInfo(n);
    expectRejectsStructuralDamage(c, info, c.compress(info, gaussian(n, 3)));
  }
}

}  // namespace
}  // namespace terse::testing
