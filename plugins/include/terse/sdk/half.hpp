// IEEE binary16 and bfloat16 conversions in plain integer arithmetic, TERSE_HD, so the CPU and the GPU produce the
// same bits (no reliance on F16C, _Float16 or cuda_fp16.h behaviour). Round to nearest, ties to even; infinities
// kept; NaN kept as a quiet NaN with the sign; overflow goes to infinity as IEEE requires.
#pragma once

#include <cstdint>
#include <cstring>

#include "terse/hd.h"

namespace terse::sdk {

TERSE_HD uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
TERSE_HD float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// float -> bfloat16: the upper 16 bits, rounded to nearest even.
TERSE_HD uint16_t floatToBf16(float f) {
  const uint32_t u = floatBits(f);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep sign, force quiet so truncation cannot make inf
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
TERSE_HD float bf16ToFloat(uint16_t h) {
  return bitsFloat(static_cast<uint32_t>(h) << 16);
}

// float -> binary16 (1 sign, 5 exponent, 10 mantissa bits), including subnormals.
TERSE_HD uint16_t floatToHalf(float f) {
  const uint32_t u = floatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x0200u | ((abs >> 13) & 0x03FFu) : 0u));
  if (abs >= 0x477FF000u)  // rounds to >= 65520: overflow to infinity
    return static_cast<uint16_t>(sign | 0x7C00u);
  if (abs < 0x38800000u) {               // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x007FFFFFu) | 0x00800000u;
    const uint32_t shift = 126u - exp;  // 14 .. 24: value = mant * 2^(exp-150), half subnormal unit is 2^-24
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    const uint32_t r = q + ((rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even; a carry out of the
  // mantissa correctly bumps the exponent.
  const uint32_t rebased = abs - 0x38000000u;
  const uint32_t rounding = 0x0FFFu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

TERSE_HD float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x03FFu;
  if (exp == 0x1Fu)  // inf, or NaN made quiet (as F16C and CUDA do) with its payload kept
    return bitsFloat(sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  if (exp != 0) return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bitsFloat(sign);
  // Subnormal: value = mant * 2^-24, exact in float.
  const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
  return sign ? -v : v;
}

}  // namespace terse::sdk
