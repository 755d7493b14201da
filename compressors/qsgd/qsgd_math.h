// qsgd: the elementwise math of QSGD (see qsgd.cc for the paper and the payload), as small TERSE_HD functions called
// by the CPU loops and by the CUDA kernels (qsgd.cu), so the CPU tests check the math the GPU runs.
//
// Per bucket v (bucket_size consecutive elements) with norm ||v||_2 and s = levels:
//   x_i  = s |v_i| / ||v||                      in [0, s]
//   xi_i = floor(x_i) + [u_i < x_i - floor(x_i)]   u_i = r_i 2^-b, element i's own b-bit draw (b = rounding_bits:
//                                                  uniform01 of sdk::drawAt's word; see qsgd.cc for the bias)
//   Q(v)_i = sign(v_i) ||v|| xi_i / s
// E[xi_i] = x_i (up to the resolution of u: below 2^-b, qsgd.cc), so E[Q(v)] = v; |Q(v)_i - v_i| <= ||v|| / s.
// A code is xi_i in the low `mag_bits` bits (mag_bits = bitsFor(s)) and the sign (1 = negative) just above.
#pragma once

#include <cmath>
#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/half.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::qsgd {

// Codes are produced, packed and unpacked 64 at a time (one bitpack group, 16 Philox blocks).
inline constexpr unsigned kGroup = sdk::bitpack::kGroup;
// Interleaved partial sums of the norm: element k of a bucket goes to lane k % kLanes. A fixed order makes the norm
// reproducible; 8 doubles are one AVX-512 register or four SSE2 ones.
inline constexpr unsigned kLanes = 8;

// The pairwise tree over the kLanes partial sums that closes sumSquares (overwrites acc).
TERSE_HD double combineLanes(double* acc) {
  for (unsigned width = kLanes / 2; width > 0; width /= 2) {
    for (unsigned l = 0; l < width; ++l) acc[l] += acc[l + width];
  }
  return acc[0];
}

// One lane of sumSquares on its own: x[lane]^2 + x[lane + kLanes]^2 + ... in that order, the partial sum sumSquares
// keeps in acc[lane]. A GPU bucket runs its kLanes lanes on kLanes threads and hands the sums to combineLanes, which
// reproduces sumSquares bit for bit (qsgd_test checks it on the CPU).
TERSE_HD double laneSumSquares(const float* x, uint64_t n, unsigned lane) {
  double acc = 0;
  for (uint64_t i = lane; i < n; i += kLanes) {
    const double v = x[i];
    acc += v * v;
  }
  return acc;
}

// sum_k x_k^2 in double (no overflow or precision loss for any f32 input), in a fixed order: kLanes interleaved
// partial sums, then a pairwise tree over the lanes.
TERSE_HD double sumSquares(const float* x, uint64_t n) {
  double acc[kLanes] = {};
  uint64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (unsigned l = 0; l < kLanes; ++l) {
      const double v = x[i + l];
      acc[l] += v * v;
    }
  }
  for (unsigned l = 0; i + l < n; ++l) {
    const double v = x[i + l];
    acc[l] += v * v;
  }
  return combineLanes(acc);
}

// The bucket norm as it travels: the f32 nearest to sqrt(sum of squares). Infinite when it exceeds the f32 range (or
// the input holds inf), NaN when the input holds NaN; the plugin refuses both.
TERSE_HD float normOf(double sum_squares) {
  return static_cast<float>(std::sqrt(sum_squares));
}
TERSE_HD float bucketNorm(const float* x, uint64_t n) {
  return normOf(sumSquares(x, n));
}

// What |v_i| is divided by: the norm, or 1 for an all-zero bucket (every x_i is then 0, not 0/0).
TERSE_HD float normDivisor(float norm) {
  return norm > 0.0f ? norm : 1.0f;
}

TERSE_HD float absValue(float v) {
  return sdk::bitsFloat(sdk::floatBits(v) & 0x7FFFFFFFu);
}

// Element i's code from its 32 random bits. `levels` is s (1 <= s < 2^24, so x_i and xi_i are exact in f32/int32).
// x_i is computed as (|v_i| / ||v||) * s: the ratio is at most 1 even for a subnormal norm, where s / ||v|| would
// overflow. With IEEE division x_i cannot exceed s (the norm rounds to nearest, so it is >= |v_i|); the clamp keeps
// xi_i <= s anyway under approximate division (a CUDA build with fast math), where it costs nothing to be sure.
// quantizeRatio is the same past the division, given ratio = |v_i| / divisor however computed
// (terse-bench-quantize-cuda times a reciprocal form of the division against IEEE's and counts the codes that differ).
TERSE_HD uint32_t quantizeRatio(float ratio, float v, float levels_f, int32_t levels, unsigned mag_bits,
                                uint32_t random_bits) {
  const float x = ratio * levels_f;
  const int32_t lower = static_cast<int32_t>(x);  // x >= 0: truncation is floor
  const float frac = x - static_cast<float>(lower);
  int32_t xi = lower + (sdk::uniform01(random_bits) < frac ? 1 : 0);
  xi = xi < levels ? xi : levels;
  const uint32_t negative = v < 0.0f ? 1u : 0u;
  return static_cast<uint32_t>(xi) | (negative << mag_bits);
}
TERSE_HD uint32_t quantizeValue(float v, float divisor, float levels_f, int32_t levels, unsigned mag_bits,
                                uint32_t random_bits) {
  return quantizeRatio(absValue(v) / divisor, v, levels_f, levels, mag_bits, random_bits);
}

// The value a code stands for, given unit = ||v|| / s of its bucket: sign * xi * unit.
TERSE_HD float decodeValue(uint32_t code, float unit, unsigned mag_bits) {
  // xi < 2^24 (mag_bits <= 24): as int32 it converts exactly, and with a signed conversion, which vectorizes.
  const auto xi = static_cast<int32_t>(code & sdk::bitpack::lowMask(mag_bits));
  const float magnitude = static_cast<float>(xi) * unit;
  return sdk::bitsFloat(sdk::floatBits(magnitude) | ((code >> mag_bits) << 31));
}

// Whether a code from an untrusted payload is one quantizeValue can produce (magnitude <= s, nothing above the sign).
TERSE_HD bool codeIsValid(uint32_t code, uint32_t levels, unsigned mag_bits) {
  return (code & sdk::bitpack::lowMask(mag_bits)) <= levels && (code >> mag_bits) <= 1u;
}

}  // namespace terse::compressors::qsgd
