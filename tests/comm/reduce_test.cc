// The 16-bit sums against the SDK's reference conversions (terse/sdk/half.hpp), bit for bit: sumInto may use faster
// code (F16C, a vectorizable bf16 rounding) but must round exactly like the SDK, which is what the CPU and GPU paths
// and every expected value in these tests are defined by.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/comm/reduce.h"
#include "terse/sdk/half.hpp"
#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

// Every class of 16-bit value: zeros, subnormals, normals near the top, infinities, NaNs, plus random bit patterns.
std::vector<uint16_t> interesting(std::size_t random_count) {
  std::vector<uint16_t> v = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF,
                             0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE01, 0x0080, 0x007F, 0x7F7F, 0xFF7F, 0x7F80,
                             0xFF80, 0x7FC0, 0x7F81, 0x3F80, 0xBF80, 0x4000, 0x3555, 0x0100};
  for (std::size_t i = 0; i < random_count; ++i) v.push_back(static_cast<uint16_t>(testing::mix(i) & 0xFFFF));
  return v;
}

void checkAgainstSdk(DType dtype) {
  const auto values = interesting(4000);
  std::vector<uint16_t> dst, src, want;
  for (uint16_t a : values) {
    for (std::size_t k = 0; k < 64; ++k) {
      const uint16_t b = values[static_cast<std::size_t>(testing::mix(a * 131u + k) % values.size())];
      dst.push_back(a);
      src.push_back(b);
      want.push_back(dtype == DType::kF16 ? sdk::floatToHalf(sdk::halfToFloat(a) + sdk::halfToFloat(b))
                                          : sdk::floatToBf16(sdk::bf16ToFloat(a) + sdk::bf16ToFloat(b)));
    }
  }
  sumInto(dst.data(), src.data(), dst.size(), dtype);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const float g = dtype == DType::kF16 ? sdk::halfToFloat(dst[i]) : sdk::bf16ToFloat(dst[i]);
    const float w = dtype == DType::kF16 ? sdk::halfToFloat(want[i]) : sdk::bf16ToFloat(want[i]);
    // Which NaN a NaN + NaN keeps is the hardware's operand order, not the rounding under test.
    if (std::isnan(w) && std::isnan(g)) continue;
    if (dst[i] != want[i] && ++bad < 5)
      ADD_FAILURE() << dtypeName(dtype) << " pair " << i << ": got 0x" << std::hex << dst[i] << ", want 0x" << want[i];
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Reduce, F16SumMatchesTheSdkBitForBit) {
  checkAgainstSdk(DType::kF16);
}
TEST(Reduce, Bf16SumMatchesTheSdkBitForBit) {
  checkAgainstSdk(DType::kBF16);
}
TEST(Reduce, F32AndUnsupported) {
  std::vector<float> a = {1, 2, 3}, b = {0.5f, -2, 1e30f};
  sumInto(a.data(), b.data(), 3, DType::kF32);
  EXPECT_EQ(a, (std::vector<float>{1.5f, 0, 1e30f}));
  EXPECT_TRUE(isSummable(DType::kBF16));
  EXPECT_FALSE(isSummable(DType::kF64));
  int32_t x = 0;
  EXPECT_THROW(sumInto(&x, &x, 1, DType::kI32), Unsupported);
}

}  // namespace
}  // namespace terse::comm
