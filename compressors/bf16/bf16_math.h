// bf16: float <-> bfloat16 as elementwise functions shared by the CPU loops and the CUDA kernels (bf16.cu).
//
// encodeValue returns exactly the bits of sdk::floatToBf16 (the upper 16 bits of the f32, rounded to nearest even;
// overflow to infinity; NaN kept quiet with its sign; bf16_test checks every one of the 2^32 floats), written as a
// select instead of the SDK's early return so GCC vectorizes the compress loop.
#pragma once

#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/half.hpp"

namespace terse::compressors::bf16 {

TERSE_HD uint16_t encodeValue(float g) {
  const uint32_t u = sdk::floatBits(g);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  // Quiet the NaN: truncating a signalling NaN's payload could otherwise leave an infinity.
  const uint32_t nan = (u >> 16) | 0x0040u;
  const uint32_t is_nan = 0u - static_cast<uint32_t>(static_cast<int32_t>(u & 0x7FFFFFFFu) > 0x7F800000);
  return static_cast<uint16_t>((nan & is_nan) | (rounded & ~is_nan));
}

TERSE_HD float decodeValue(uint16_t wire) {
  return sdk::bf16ToFloat(wire);
}

}  // namespace terse::compressors::bf16
