// qsgd: the host's vector loops for the codes of whole groups inside one bucket, the common case of compress. Each
// makes the bits of qsgd_math.h's quantizeValue + bitpack::packGroup<W> (the scalar loop below, which the CUDA
// kernels share): the same IEEE operations in the same order (|v| / divisor * levels, truncation, the compare with
// uniform01, the clamp: the AVX-512 loop leaves it out where it cannot bind, see quantize16Avx512), lane by lane. Each
// loop is made for a draw width B (the rounding_bits parameter, sdk/philox.hpp's drawAt): B = 24 reads one Philox word
// per element, B = 16 (8) zero-extends the stream's u16 (u8) lanes, r 2^-B being uniform01 of drawAt's word exactly.
// Host only (x86 intrinsics); tests/compressors/qsgd_test.cc runs every path this host can run against the scalar one
// on the same inputs.
#pragma once

#include <cstdint>

#include "qsgd_math.h"
#include "terse/kit/draws_x86.hpp"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/cpu.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_QSGD_X86 1
#include <immintrin.h>
#else
#define TERSE_QSGD_X86 0
#endif

namespace terse::compressors::qsgd::host {

// Codes of `groups` consecutive 64-element groups of one bucket (divisor: normDivisor of its norm, which the AVX-512
// loop relies on: see quantize16Avx512) from their draws into W words each, W = mag_bits + 1. `bits` is the Philox
// stream from the first element's word on (PhiloxStream::drawGroups), read at the loop's draw width.
using QuantizeGroups = void (*)(const float* x, float divisor, int32_t levels, const uint32_t* bits, uint64_t groups,
                                uint64_t* words);

// sumSquares of `count` consecutive buckets of n elements each (x, x + n, ...), count <= kNormBuckets.
inline constexpr unsigned kNormBuckets = 4;
using SumSquaresBuckets = void (*)(const float* x, uint64_t n, unsigned count, double* sums);

inline void sumSquaresBucketsScalar(const float* x, uint64_t n, unsigned count, double* sums) {
  for (unsigned k = 0; k < count; ++k) sums[k] = sumSquares(x + k * n, n);
}

// sumSquares's last steps from the kLanes partial sums of the whole chunks: the elements past them (each into its
// lane, in order) and the tree over the lanes.
inline double finishSumSquares(double* acc, const float* x, uint64_t n) {
  for (uint64_t i = n / kLanes * kLanes, l = 0; i < n; ++i, ++l) {
    const double v = x[i];
    acc[l] += v * v;
  }
  return combineLanes(acc);
}

template <unsigned W, unsigned B = sdk::kDrawBitsFull>
void quantizeGroupsScalar(const float* x, float divisor, int32_t levels, const uint32_t* bits, uint64_t groups,
                          uint64_t* words) {
  const auto levels_f = static_cast<float>(levels);
  uint32_t codes[kGroup];
  for (uint64_t q = 0; q < groups; ++q) {
    for (unsigned j = 0; j < kGroup; ++j) {
      codes[j] =
          quantizeValue(x[kGroup * q + j], divisor, levels_f, levels, W - 1, sdk::drawAt<B>(bits, kGroup * q + j));
    }
    sdk::bitpack::packGroup<W>(codes, words + W * q);
  }
}

#if TERSE_QSGD_X86
// Lanes 0..3 and 4..7 of sumSquares's partial sums plus the squares of p[0..8). The square of an f32 is exact in f64
// (24-bit significands, exponents in range), so a fused multiply-add rounds once where sumSquares's multiply and add
// round once, at the add: the same sums, one instruction fewer.
__attribute__((target("avx2,fma"), always_inline)) inline void squareStepAvx2(__m256d& lo, __m256d& hi,
                                                                              const float* p) {
  const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(p));
  const __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(p + 4));
  lo = _mm256_fmadd_pd(a, a, lo);
  hi = _mm256_fmadd_pd(b, b, hi);
}

// sumSquares's lanes as two 4-double vectors per bucket. One bucket's sums are a chain of dependent adds (its order is
// fixed: lane l adds x[l], x[l + 8], ... in turn), so its speed is the add latency's; up to four buckets at once are
// four independent chains.
__attribute__((target("avx2,fma"))) inline void sumSquaresBucketsAvx2(const float* x, uint64_t n, unsigned count,
                                                                      double* sums) {
  // Named variables, not arrays, so that they stay in registers (see sumSquaresBucketsAvx512).
  __m256d l0 = _mm256_setzero_pd(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;
  const uint64_t whole = n / kLanes * kLanes;
  if (count == kNormBuckets) {
    for (uint64_t i = 0; i < whole; i += kLanes) {
      squareStepAvx2(l0, h0, x + i);
      squareStepAvx2(l1, h1, x + n + i);
      squareStepAvx2(l2, h2, x + 2 * n + i);
      squareStepAvx2(l3, h3, x + 3 * n + i);
    }
  } else {
    for (uint64_t i = 0; i < whole; i += kLanes) squareStepAvx2(l0, h0, x + i);
    if (count > 1) {
      for (uint64_t i = 0; i < whole; i += kLanes) squareStepAvx2(l1, h1, x + n + i);
    }
    if (count > 2) {
      for (uint64_t i = 0; i < whole; i += kLanes) squareStepAvx2(l2, h2, x + 2 * n + i);
    }
  }
  const __m256d lo[kNormBuckets] = {l0, l1, l2, l3}, hi[kNormBuckets] = {h0, h1, h2, h3};
  for (unsigned k = 0; k < count; ++k) {
    double acc[kLanes];
    _mm256_storeu_pd(acc, lo[k]);
    _mm256_storeu_pd(acc + 4, hi[k]);
    sums[k] = finishSumSquares(acc, x + k * n, n);
  }
}

// 8 lanes of quantizeValue.
template <unsigned B>
__attribute__((target("avx2"), always_inline)) inline __m256i quantize8Avx2(const float* x, const void* draws,
                                                                            __m256 divisor, __m256 levels_f,
                                                                            __m256i levels, __m256i sign) {
  const __m256 v = _mm256_loadu_ps(x);
  const __m256 magnitude = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
  const __m256 scaled = _mm256_mul_ps(_mm256_div_ps(magnitude, divisor), levels_f);
  const __m256i lower = _mm256_cvttps_epi32(scaled);  // scaled >= 0: truncation is floor
  const __m256 frac = _mm256_sub_ps(scaled, _mm256_cvtepi32_ps(lower));
  const __m256 u = kit::uniform8Avx2<B>(draws);
  // All-ones (-1) where u < frac: subtracting it adds 1.
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(u, frac, _CMP_LT_OQ));
  const __m256i xi = _mm256_min_epi32(_mm256_sub_epi32(lower, up), levels);
  const __m256i negative = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
  return _mm256_or_si256(xi, _mm256_and_si256(negative, sign));
}

template <unsigned W, unsigned B = sdk::kDrawBitsFull>
__attribute__((target("avx2"))) void quantizeGroupsAvx2(const float* x, float divisor, int32_t levels,
                                                        const uint32_t* bits, uint64_t groups, uint64_t* words) {
  const __m256 d = _mm256_set1_ps(divisor);
  const __m256 levels_f = _mm256_set1_ps(static_cast<float>(levels));
  const __m256i levels_i = _mm256_set1_epi32(levels);
  const __m256i sign = _mm256_set1_epi32(static_cast<int32_t>(1u << (W - 1)));
  for (uint64_t q = 0; q < groups; ++q, x += kGroup, words += W) {
    if constexpr (W == 8) {
      // Codes < 256: two unsigned saturating packs keep them whole and in order, 16 bytes per pair of vectors.
      for (unsigned v = 0; v < 4; ++v) {
        const __m256i a =
            quantize8Avx2<B>(x + 16 * v, kit::drawsOf<B>(bits, kGroup * q + 16 * v), d, levels_f, levels_i, sign);
        const __m256i b = quantize8Avx2<B>(x + 16 * v + 8, kit::drawsOf<B>(bits, kGroup * q + 16 * v + 8), d, levels_f,
                                           levels_i, sign);
        const __m128i a16 = _mm_packus_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        const __m128i b16 = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(words) + v, _mm_packus_epi16(a16, b16));
      }
    } else {
      alignas(32) uint32_t codes[kGroup];
      for (unsigned v = 0; v < 8; ++v) {
        _mm256_store_si256(
            reinterpret_cast<__m256i*>(codes + 8 * v),
            quantize8Avx2<B>(x + 8 * v, kit::drawsOf<B>(bits, kGroup * q + 8 * v), d, levels_f, levels_i, sign));
      }
      sdk::bitpack::packGroup<W>(codes, words);
    }
  }
}

// GCC 12's AVX-512 intrinsics trip -Wuninitialized where they are inlined (see sdk/philox.hpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"), always_inline)) inline __m512d squareStepAvx512(__m512d acc, const float* p) {
  const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(p));
  return _mm512_fmadd_pd(v, v, acc);  // exact square, one rounding: as squareStepAvx2
}

// sumSquaresBucketsAvx2 with a bucket's eight lanes in one vector. The four accumulators are named variables: as an
// array GCC kept them in memory, and the store-to-load chain made this slower than one bucket at a time.
__attribute__((target("avx512f"))) inline void sumSquaresBucketsAvx512(const float* x, uint64_t n, unsigned count,
                                                                       double* sums) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  const uint64_t whole = n / kLanes * kLanes;
  if (count == kNormBuckets) {
    for (uint64_t i = 0; i < whole; i += kLanes) {
      a0 = squareStepAvx512(a0, x + i);
      a1 = squareStepAvx512(a1, x + n + i);
      a2 = squareStepAvx512(a2, x + 2 * n + i);
      a3 = squareStepAvx512(a3, x + 3 * n + i);
    }
  } else {
    for (uint64_t i = 0; i < whole; i += kLanes) a0 = squareStepAvx512(a0, x + i);
    if (count > 1) {
      for (uint64_t i = 0; i < whole; i += kLanes) a1 = squareStepAvx512(a1, x + n + i);
    }
    if (count > 2) {
      for (uint64_t i = 0; i < whole; i += kLanes) a2 = squareStepAvx512(a2, x + 2 * n + i);
    }
  }
  const __m512d acc[kNormBuckets] = {a0, a1, a2, a3};
  for (unsigned k = 0; k < count; ++k) {
    double lanes[kLanes];
    _mm512_storeu_pd(lanes, acc[k]);
    sums[k] = finishSumSquares(lanes, x + k * n, n);
  }
}

// 16 lanes of quantizeValue, with the compares' masks adding the 1 and the sign.
template <unsigned B>
__attribute__((target("avx512f"), always_inline)) inline __m512i quantize16Avx512(const float* x, const void* draws,
                                                                                  __m512 divisor, __m512 levels_f,
                                                                                  __m512i sign) {
  const __m512 v = _mm512_loadu_ps(x);
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
  const __m512 scaled = _mm512_mul_ps(_mm512_div_ps(magnitude, divisor), levels_f);
  const __m512i lower = _mm512_cvttps_epi32(scaled);
  const __m512 frac = _mm512_sub_ps(scaled, _mm512_cvtepi32_ps(lower));
  const __m512 u = kit::uniform16Avx512<B>(draws);
  const __mmask16 up = _mm512_cmp_ps_mask(u, frac, _CMP_LT_OQ);
  // No clamp to levels (11% of this loop's time): the divisor is a bucket norm (or 1 for an all-zero bucket), which
  // is >= every |v| of its bucket (the rounded sum of squares is at least each square, and sqrt and the roundings are
  // monotonic), so with IEEE division |v| / divisor <= 1 and scaled <= levels; lower = levels only where scaled =
  // levels, whose fraction 0 is never above u. quantizeValue's clamp never binds on the host (it is there for a GPU
  // build's approximate division).
  const __m512i xi = _mm512_mask_add_epi32(lower, up, lower, _mm512_set1_epi32(1));
  const __mmask16 negative = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_or_epi32(xi, negative, xi, sign);
}

template <unsigned W, unsigned B = sdk::kDrawBitsFull>
__attribute__((target("avx512f"))) void quantizeGroupsAvx512(const float* x, float divisor, int32_t levels,
                                                             const uint32_t* bits, uint64_t groups, uint64_t* words) {
  const __m512 d = _mm512_set1_ps(divisor);
  const __m512 levels_f = _mm512_set1_ps(static_cast<float>(levels));
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(1u << (W - 1)));
  for (uint64_t q = 0; q < groups; ++q, x += kGroup, words += W) {
    if constexpr (W == 8) {
      // Code j is byte j of the group's 8 words: vpmovdb keeps each lane's low byte, the whole code.
      for (unsigned v = 0; v < 4; ++v) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(words) + v,
                         _mm512_cvtepi32_epi8(quantize16Avx512<B>(
                             x + 16 * v, kit::drawsOf<B>(bits, kGroup * q + 16 * v), d, levels_f, sign)));
      }
    } else {
      alignas(64) uint32_t codes[kGroup];
      for (unsigned v = 0; v < 4; ++v) {
        _mm512_store_si512(codes + 16 * v, quantize16Avx512<B>(x + 16 * v, kit::drawsOf<B>(bits, kGroup * q + 16 * v),
                                                               d, levels_f, sign));
      }
      sdk::bitpack::packGroup<W>(codes, words);
    }
  }
}
#pragma GCC diagnostic pop
#endif

inline SumSquaresBuckets pickSumSquaresBuckets() {
#if TERSE_QSGD_X86
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx512f)) return sumSquaresBucketsAvx512;
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx2) && sdk::cpu::has(sdk::cpu::Feature::kFma)) return sumSquaresBucketsAvx2;
#endif
  return sumSquaresBucketsScalar;
}

// The fastest of the above this host runs, for code width W and draw width B.
template <unsigned W, unsigned B>
QuantizeGroups pickQuantizeGroups() {
#if TERSE_QSGD_X86
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx512f)) return quantizeGroupsAvx512<W, B>;
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx2)) return quantizeGroupsAvx2<W, B>;
#endif
  return quantizeGroupsScalar<W, B>;
}

// pickQuantizeGroups for a draw width b known at run time (8, 16 or 24).
template <unsigned W>
QuantizeGroups pickQuantizeGroups(unsigned b) {
  return b == 8 ? pickQuantizeGroups<W, 8>() : b == 16 ? pickQuantizeGroups<W, 16>() : pickQuantizeGroups<W, 24>();
}

}  // namespace terse::compressors::qsgd::host
