// terngrad: the elementwise math of TernGrad (see terngrad.cc for the paper and the payload), as small TERSE_HD
// functions called by the CPU loops and by the CUDA kernels (terngrad.cu), so the CPU tests check the math the GPU
// runs.
//
// Per bucket with scale s = max_i |g_i|:
//   b_i ~ Bernoulli(|g_i| / s), drawn as [u_i s < |g_i|] with u_i = r_i 2^-b, element i's own b-bit draw (b =
//   rounding_bits: uniform01 of sdk::drawAt's word; see terngrad.cc for the bias)
//   T(g)_i = s sign(g_i) b_i,  so E[T(g)_i] = g_i (up to the resolution of u: below s 2^-b, terngrad.cc)
// A code is 2 bits: 0 -> 0, 1 -> +1, 2 -> -1 (code = b_i << negative_i); 3 never occurs and marks a corrupt payload.
#pragma once

#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/half.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::terngrad {

inline constexpr unsigned kGroup = sdk::bitpack::kGroup;  // codes handled 64 at a time (16 Philox blocks)
inline constexpr unsigned kCodeBits = 2;
inline constexpr unsigned kLanes = 16;  // interleaved partial maxima: independent lanes the compiler can vectorize

// |g| as its bit pattern: a non-negative integer that orders like the float, with NaN (bits above 0x7F800000) above
// every number. A max over these is exact and independent of the order it is taken in, which is what lets the GPU
// take it with any reduction (terngrad.cu: cub and atomicMax) and still give bucketMaxAbs's bits.
TERSE_HD uint32_t magnitudeBits(float g) {
  return sdk::floatBits(g) & 0x7FFFFFFFu;
}

// max_i |x_i| over n elements, compared as magnitudeBits (as int32, which vectorizes on any SSE2), so a NaN input
// gives a NaN scale.
TERSE_HD float bucketMaxAbs(const float* x, uint64_t n) {
  int32_t m[kLanes] = {};
  uint64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (unsigned l = 0; l < kLanes; ++l) {
      const int32_t a = static_cast<int32_t>(magnitudeBits(x[i + l]));
      m[l] = a > m[l] ? a : m[l];
    }
  }
  for (unsigned l = 0; i + l < n; ++l) {
    const int32_t a = static_cast<int32_t>(magnitudeBits(x[i + l]));
    m[l] = a > m[l] ? a : m[l];
  }
  int32_t best = 0;
  for (unsigned l = 0; l < kLanes; ++l) best = m[l] > best ? m[l] : best;
  return sdk::bitsFloat(static_cast<uint32_t>(best));
}

// Element i's 2-bit code from its 32 random bits. u s < |g| rather than u < |g| / s: no division, and exact for the
// bucket's largest element (u s < s for every u < 1, so it is always sent); s = 0 sends nothing.
TERSE_HD uint32_t quantizeValue(float g, float scale, uint32_t random_bits) {
  const float magnitude = sdk::bitsFloat(sdk::floatBits(g) & 0x7FFFFFFFu);
  const uint32_t keep = sdk::uniform01(random_bits) * scale < magnitude ? 1u : 0u;
  const uint32_t negative = g < 0.0f ? 1u : 0u;
  return keep << negative;
}

// s * {0, +1, -1} for codes {0, 1, 2}.
TERSE_HD float decodeValue(uint32_t code, float scale) {
  const int32_t ternary = static_cast<int32_t>(code & 1u) - static_cast<int32_t>(code >> 1);
  return static_cast<float>(ternary) * scale;
}

// Whether any of the 32 codes in a word is 3 (both bits set), which quantizeValue never writes.
TERSE_HD bool wordHasInvalidCode(uint64_t word) {
  return (word & (word >> 1) & 0x5555555555555555ull) != 0;
}

}  // namespace terse::compressors::terngrad
