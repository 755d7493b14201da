// natural: the elementwise math of natural compression (see natural.cc for the paper and the payload), as small
// TERSE_HD functions called by the CPU loops and by the CUDA kernels (natural.cu), so the CPU tests check the math the
// GPU runs.
//
// An f32 g = (-1)^s 2^(e - 127) (1 + m 2^-23) (e the biased exponent, m the 23-bit mantissa) lies between the powers
// of two a = 2^(e - 127) and 2a. C(g) is a with probability 1 - m 2^-23 and 2a with probability m 2^-23, its sign
// kept, so E[C(g)] = a + a m 2^-23 = |g| times the sign: unbiased. In the bits that is: keep the exponent, or add one
// to it, and clear the mantissa. A subnormal g (e = 0: m 2^-149) rounds the same way between 0 and 2^-126, the
// smallest normal power of two, with the same probability m 2^-23, so it too is unbiased; a zero stays zero.
//
// The draw: up iff r < 2m, r the top 24 bits of element i's own draw (sdk::drawAt's word), uniform on [0, 2^24), so
// P(up) = 2m / 2^24 = m 2^-23 exactly at rounding_bits 24. At 16 (8) bits r's low 8 (16) bits are zero and P(up) =
// ceil(m 2^-7) 2^-16 (ceil(m 2^-15) 2^-8): a bias away from zero below 2^-16 (2^-8) of the gap a (natural.cc).
//
// What travels per element is the exponent after rounding (a byte; 0 for zero) and g's own sign bit, apart: bytes
// and 64-bit sign words are what the CPU's vector loops and the GPU's stores handle whole, where a packed 9-bit code
// took 10x longer to pack on the CPU than qsgd's codes. Exponent 255 is no power of two: an input that is inf or NaN,
// or one at or above 2^127 that rounds up past the largest f32 power of two, makes it, and it marks a payload that
// decompress refuses.
#pragma once

#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/half.hpp"

namespace terse::compressors::natural {

inline constexpr uint32_t kBadExponent = 0xFFu;  // the exponent byte that no power of two has

// g's exponent after the rounding, from its 32 random bits (sdk::drawAt: the draw at the top of the word).
TERSE_HD uint32_t roundedExponent(float g, uint32_t random_bits) {
  const uint32_t bits = sdk::floatBits(g);
  const uint32_t exponent = (bits >> 23) & 0xFFu;
  const uint32_t mantissa = bits & 0x7FFFFFu;
  // A NaN's 255 plus one would wrap into a valid byte: inf and NaN keep 255 whatever the draw.
  const uint32_t up = exponent != kBadExponent && (random_bits >> 8) < 2 * mantissa ? 1u : 0u;
  return exponent + up;
}

// The value an exponent byte and a sign bit stand for: (-1)^sign 2^(exponent - 127), or a zero (of that sign) for
// exponent 0. Exact.
TERSE_HD float decodeValue(uint32_t exponent, uint32_t sign) {
  return sdk::bitsFloat((sign << 31) | (exponent << 23));
}

}  // namespace terse::compressors::natural
