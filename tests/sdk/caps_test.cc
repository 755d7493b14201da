// sdk/caps.hpp: each constructor gives exactly the struct a plugin would fill by hand from a zeroed one (the built-ins
// did so before the helper existed, and their caps must not change by a bit), with host memory and one round as the
// defaults.
#include "terse/sdk/caps.hpp"

#include <cstring>

#include <gtest/gtest.h>

namespace terse::sdk {
namespace {

terse_compressor_caps_v1 byHand(terse_aggregation_v1 aggregation, terse_dtype_v1 wire_dtype, uint32_t flags,
                                terse_device_v1 devices, int32_t num_rounds) {
  return terse_compressor_caps_v1{.struct_size = 0,
                                  .devices = devices,
                                  .aggregation = aggregation,
                                  .wire_dtype = wire_dtype,
                                  .flags = flags,
                                  .num_rounds = num_rounds};
}

void expectSameBytes(const terse_compressor_caps_v1& got, const terse_compressor_caps_v1& want) {
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
      << "devices " << got.devices << " aggregation " << got.aggregation << " wire_dtype " << got.wire_dtype
      << " flags " << got.flags << " rounds " << got.num_rounds;
}

TEST(SdkCaps, Defaults) {
  expectSameBytes(Caps::allgather(), byHand(TERSE_AGG_ALLGATHER, TERSE_DTYPE_F32, 0, TERSE_DEVICE_HOST, 1));
  expectSameBytes(Caps::sum(TERSE_DTYPE_F16), byHand(TERSE_AGG_SUM, TERSE_DTYPE_F16, 0, TERSE_DEVICE_HOST, 1));
  expectSameBytes(Caps::custom(), byHand(TERSE_AGG_CUSTOM, TERSE_DTYPE_F32, 0, TERSE_DEVICE_HOST, 1));
  EXPECT_EQ(Caps::allgather().struct_size, 0u);  // the export macro's job
}

TEST(SdkCaps, EveryFieldAsGiven) {
  const terse_device_v1 both = TERSE_DEVICE_HOST | TERSE_DEVICE_CUDA;
  expectSameBytes(Caps::allgather(TERSE_CAP_FIXED_SIZE, both),
                  byHand(TERSE_AGG_ALLGATHER, TERSE_DTYPE_F32, TERSE_CAP_FIXED_SIZE, both, 1));
  expectSameBytes(
      Caps::sum(TERSE_DTYPE_F32, TERSE_CAP_FIXED_SIZE | TERSE_CAP_STATEFUL | TERSE_CAP_SHARED_SEED, both, 2),
      byHand(TERSE_AGG_SUM, TERSE_DTYPE_F32, TERSE_CAP_FIXED_SIZE | TERSE_CAP_STATEFUL | TERSE_CAP_SHARED_SEED, both,
             2));
  expectSameBytes(Caps::custom(TERSE_CAP_FIXED_SIZE, TERSE_DEVICE_CUDA, 3),
                  byHand(TERSE_AGG_CUSTOM, TERSE_DTYPE_F32, TERSE_CAP_FIXED_SIZE, TERSE_DEVICE_CUDA, 3));
}

TEST(SdkCaps, UsableInConstantExpressions) {
  constexpr terse_compressor_caps_v1 caps = Caps::sum(TERSE_DTYPE_BF16, TERSE_CAP_FIXED_SIZE);
  static_assert(caps.aggregation == TERSE_AGG_SUM && caps.wire_dtype == TERSE_DTYPE_BF16 && caps.num_rounds == 1);
  SUCCEED();
}

}  // namespace
}  // namespace terse::sdk
