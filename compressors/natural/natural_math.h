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
// A code is 9 bits: the exponent after rounding in the low 8, the sign above them. Exponent 0 is zero and carries no
// sign (code 0). Exponent 255 is no power of two: an input that is inf or NaN, or one at or above 2^127 that rounds
// up past the largest f32 power of two, makes it, and it marks a payload decompress refuses.
#pragma once

#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/half.hpp"

namespace terse::compressors::natural {

inline constexpr unsigned kGroup = sdk::bitpack::kGroup;  // codes handled 64 at a time (16 Philox blocks at 24 bits)
inline constexpr unsigned kCodeBits = 9;
inline constexpr uint32_t kBadExponent = 0xFFu;  // the exponent field of a code no power of two has

// Element g's code from its 32 random bits (sdk::drawAt: the draw at the top of the word).
TERSE_HD uint32_t encodeValue(float g, uint32_t random_bits) {
  const uint32_t bits = sdk::floatBits(g);
  const uint32_t exponent = (bits >> 23) & 0xFFu;
  const uint32_t mantissa = bits & 0x7FFFFFu;
  // inf and NaN keep exponent 255 whatever the draw (+0 would make a NaN's 255 + 1 wrap into a valid code).
  const uint32_t up = exponent != 0xFFu && (random_bits >> 8) < 2 * mantissa ? 1u : 0u;
  const uint32_t e = exponent + up;
  // Zero has no sign: code 0 for +0, -0 and every subnormal that rounded down.
  const uint32_t sign = e != 0 ? bits >> 31 : 0u;
  return e | (sign << 8);
}

// The value a code stands for: sign * 2^(e - 127), or 0 for e = 0. Exact.
TERSE_HD float decodeValue(uint32_t code) {
  return sdk::bitsFloat(((code >> 8) << 31) | ((code & 0xFFu) << 23));
}

// Whether a code from an untrusted payload is one encodeValue makes for a finite input: its exponent is not 255, and
// a zero has no sign. (Nothing above bit 8 exists: codes are read 9 bits at a time.)
TERSE_HD bool codeIsValid(uint32_t code) {
  return (code & 0xFFu) != kBadExponent && code != 0x100u;
}

}  // namespace terse::compressors::natural
