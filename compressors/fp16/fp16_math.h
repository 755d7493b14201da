// fp16: float <-> IEEE binary16 as elementwise functions shared by the CPU loops and the CUDA kernels (fp16.cu).
//
// encodeValue returns exactly the bits of sdk::floatToHalf (round to nearest even, subnormals, overflow to infinity,
// infinities kept, NaN kept quiet with its sign and top payload bits; fp16_test checks every one of the 2^32 floats),
// but is written as straight-line selects with no branch and no variable shift. That is what lets GCC vectorize the
// compress loop even for the baseline x86-64 ISA: the SDK's branchy form runs about 8x slower per thread.
//
// How it rounds, for |x| = a (the f32 bits without the sign):
//   normal half (a >= 2^-14):   rebias the exponent (127 -> 15, i.e. subtract 112 << 23), add 0xFFF plus the lowest
//                               kept mantissa bit and drop 13 bits: round to nearest even, a carry bumping the exponent
//   subnormal half (a < 2^-14): add 0.5f in f32: the sum's ulp is 2^-24, the half subnormal step, so the FPU's own
//                               round-to-nearest-even does the rounding, and the sum's low mantissa bits are the result
//   a >= 65520 (rounds past the largest half, 65504): infinity; NaN: quiet NaN with the payload's top 10 bits
// The f32 addition relies on the default rounding mode; subnormal f32 inputs become half zero either way, so
// flush-to-zero (CUDA's -ftz) does not change the result.
#pragma once

#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/half.hpp"

namespace terse::compressors::fp16 {

TERSE_HD uint16_t encodeValue(float g) {
  const uint32_t u = sdk::floatBits(g);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t a = static_cast<int32_t>(u & 0x7FFFFFFFu);  // signed: SSE2 has only signed 32-bit compares
  const uint32_t au = static_cast<uint32_t>(a);
  const uint32_t subnormal = sdk::floatBits(sdk::bitsFloat(au) + 0.5f) - 0x3F000000u;
  const uint32_t normal = (au + 0xC8000FFFu + ((au >> 13) & 1u)) >> 13;  // 0xC8000000 = -(112 << 23) mod 2^32
  const uint32_t nan = 0x7E00u | ((au >> 13) & 0x03FFu);
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < 0x38800000);   // below 2^-14
  const uint32_t is_inf = 0u - static_cast<uint32_t>(a >= 0x477FF000);  // rounds to >= 65520, or inf, or NaN
  const uint32_t is_nan = 0u - static_cast<uint32_t>(a > 0x7F800000);
  uint32_t r = (subnormal & is_sub) | (normal & ~is_sub);
  r = (0x7C00u & is_inf) | (r & ~is_inf);
  r = (nan & is_nan) | (r & ~is_nan);
  return static_cast<uint16_t>(sign | r);
}

// The exact f32 value of a half: the bits of sdk::halfToFloat (NaN made quiet with its payload kept; fp16_test checks
// all 65536 halves), as selects so the decompress loop vectorizes too (the SDK's branches run it at ~4 GB/s).
//   normal:     exponent rebiased (15 -> 127: add 112 << 23) with the mantissa shifted into place
//   subnormal:  mantissa * 2^-24, exact in f32 (an int -> float conversion, which vectorizes)
//   inf / NaN:  exponent all ones, mantissa shifted, the quiet bit set for a NaN
TERSE_HD float decodeValue(uint16_t wire) {
  const uint32_t h = wire;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7FFFu;
  const uint32_t exponent = magnitude >> 10;
  const uint32_t mantissa = magnitude & 0x03FFu;
  const uint32_t normal = (magnitude << 13) + 0x38000000u;
  const uint32_t subnormal = sdk::floatBits(static_cast<float>(static_cast<int32_t>(mantissa)) * 0x1p-24f);
  const uint32_t special = 0x7F800000u | (mantissa << 13) | ((0u - static_cast<uint32_t>(mantissa != 0)) & 0x00400000u);
  const uint32_t is_sub = 0u - static_cast<uint32_t>(exponent == 0);
  const uint32_t is_special = 0u - static_cast<uint32_t>(exponent == 0x1Fu);
  uint32_t r = (subnormal & is_sub) | (normal & ~is_sub);
  r = (special & is_special) | (r & ~is_special);
  return sdk::bitsFloat(sign | r);
}

}  // namespace terse::compressors::fp16
