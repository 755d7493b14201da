// onebit: the host's vector loop for compress. It makes onebit_math.h's bucketSums bit for bit (the same f32 lane
// sums per chunk, in the same order, added in double in the same order, closed by the same pairwise tree) and, in the
// same pass, the bucket's sign words of bitpack width 1, so the data is read once rather than twice (the sums, then
// the signs). Host only (x86 intrinsics); tests/compressors/onebit_test.cc runs it against the scalar math on the same
// inputs, and compress falls back to the scalar loops (onebit.cc's binarizeAll) on hosts without AVX2.
#pragma once

#include <cstdint>

#include "onebit_math.h"
#include "terse/sdk/cpu.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_ONEBIT_X86 1
#include <immintrin.h>
#else
#define TERSE_ONEBIT_X86 0
#endif

namespace terse::compressors::onebit::host {

// bucketSums of x[0, n) and, where words is not null, the sign words of x[0, n): ceil(n / 64) words, bit j of word i
// the sign bit of x[64 i + j], the bits past n zero. So the words are the payload's when x starts a 64-element group
// and n is a multiple of 64 or reaches the tensor's end.
using SumsAndSigns = BucketSums (*)(const float* x, uint64_t n, uint64_t* words);

#if TERSE_ONEBIT_X86
// GCC 12's AVX-512 intrinsics trip -Wuninitialized where they are inlined (see sdk/philox.hpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// One row of 16 elements (one per lane) added to a chunk's f32 lane sums with addElement's operations: magnitude,
// negative (1 or 0, here from the sign mask), magnitude * negative to the negative side, magnitude minus it to the
// positive side. The product stays a product (not a masked add) so that inf and NaN make the scalar loop's NaN.
// Returns the row's sign mask. Lanes of a masked-off load are +0, which adds nothing: a lane sum starts at +0 and
// only ever adds values >= +0 or NaN, so it is never -0, and s + (+0) == s.
__attribute__((target("avx512f"), always_inline)) inline __mmask16 addRowAvx512(__m512i v, __m512& pos, __m512& neg) {
  const __mmask16 sign = _mm512_test_epi32_mask(v, _mm512_set1_epi32(static_cast<int32_t>(0x80000000u)));
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(0x7FFFFFFF)));
  const __m512 negative = _mm512_maskz_mov_ps(sign, _mm512_set1_ps(1.0f));
  const __m512 neg_part = _mm512_mul_ps(magnitude, negative);
  neg = _mm512_add_ps(neg, neg_part);
  pos = _mm512_add_ps(pos, _mm512_sub_ps(magnitude, neg_part));
  return sign;
}

// A chunk's 16 f32 lane sums added into the 16 double lanes (lanes 0-7 in lo, 8-15 in hi), as bucketSums does.
__attribute__((target("avx512f"), always_inline)) inline void addChunkAvx512(__m512 f, __m512d& lo, __m512d& hi) {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(f)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))));
}

// combineLanes' tree over the lanes 0-15 (lo, hi): width 8 is lo + hi, then the halves of what is left.
__attribute__((target("avx512f"), always_inline)) inline double combineAvx512(__m512d lo, __m512d hi) {
  const __m512d w8 = _mm512_add_pd(lo, hi);
  const __m256d w4 = _mm256_add_pd(_mm512_castpd512_pd256(w8), _mm512_extractf64x4_pd(w8, 1));
  const __m128d w2 = _mm_add_pd(_mm256_castpd256_pd128(w4), _mm256_extractf128_pd(w4, 1));
  return _mm_cvtsd_f64(w2) + _mm_cvtsd_f64(_mm_unpackhi_pd(w2, w2));
}

// The count of negatives needs no lanes: every lane's count is an integer (at most 8 per chunk in f32, then in double,
// exact below 2^53), so bucketSums' sum of them is the number of set sign bits whatever the order.
template <bool kWords>
__attribute__((target("avx512f,popcnt"))) BucketSums sumsAndSignsAvx512(const float* x, uint64_t n, uint64_t* words) {
  static_assert(kChunk == 128 && kLanes == 16, "a chunk is 8 rows of 16 lanes, two 64-element groups");
  __m512d pos_lo = _mm512_setzero_pd(), pos_hi = pos_lo, neg_lo = pos_lo, neg_hi = pos_lo;
  uint64_t negatives = 0;
  uint64_t c = 0;
  for (; c + kChunk <= n; c += kChunk) {
    __m512 pos = _mm512_setzero_ps(), neg = pos;
    uint64_t w0 = 0, w1 = 0;
    for (unsigned q = 0; q < 4; ++q) {
      w0 |= static_cast<uint64_t>(addRowAvx512(_mm512_loadu_si512(x + c + 16 * q), pos, neg)) << (16 * q);
    }
    for (unsigned q = 0; q < 4; ++q) {
      w1 |= static_cast<uint64_t>(addRowAvx512(_mm512_loadu_si512(x + c + 64 + 16 * q), pos, neg)) << (16 * q);
    }
    negatives += static_cast<uint64_t>(__builtin_popcountll(w0) + __builtin_popcountll(w1));
    if constexpr (kWords) {
      words[c / 64] = w0;
      words[c / 64 + 1] = w1;
    }
    addChunkAvx512(pos, pos_lo, pos_hi);
    addChunkAvx512(neg, neg_lo, neg_hi);
  }
  if (c < n) {  // the last chunk, shorter than kChunk: masked rows (bucketSums' element j to lane j % 16 alike)
    __m512 pos = _mm512_setzero_ps(), neg = pos;
    const auto len = static_cast<unsigned>(n - c);
    for (unsigned g = 0; 64 * g < len; ++g) {
      uint64_t w = 0;
      for (unsigned q = 0; q < 4; ++q) {
        const unsigned row = 64 * g + 16 * q;
        if (row >= len) break;
        const auto mask = static_cast<__mmask16>(len - row >= 16 ? 0xFFFFu : (1u << (len - row)) - 1u);
        w |= static_cast<uint64_t>(addRowAvx512(_mm512_maskz_loadu_epi32(mask, x + c + row), pos, neg)) << (16 * q);
      }
      negatives += static_cast<uint64_t>(__builtin_popcountll(w));
      if constexpr (kWords) words[c / 64 + g] = w;
    }
    addChunkAvx512(pos, pos_lo, pos_hi);
    addChunkAvx512(neg, neg_lo, neg_hi);
  }
  return BucketSums{combineAvx512(pos_lo, pos_hi), combineAvx512(neg_lo, neg_hi), static_cast<double>(negatives)};
}
#pragma GCC diagnostic pop

// ---- AVX2: the same loop with each row of 16 lanes as two 8-float vectors (lanes 0-7, 8-15).

// addRowAvx512's operations on 8 lanes; returns their 8 sign bits.
__attribute__((target("avx2"), always_inline)) inline uint64_t addHalfRowAvx2(__m256 v, __m256& pos, __m256& neg) {
  const __m256 magnitude = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
  const __m256 negative =
      _mm256_and_ps(_mm256_castsi256_ps(_mm256_srai_epi32(_mm256_castps_si256(v), 31)), _mm256_set1_ps(1.0f));
  const __m256 neg_part = _mm256_mul_ps(magnitude, negative);
  neg = _mm256_add_ps(neg, neg_part);
  pos = _mm256_add_ps(pos, _mm256_sub_ps(magnitude, neg_part));
  return static_cast<uint64_t>(_mm256_movemask_ps(v));
}

// 8 f32 lane sums into their 8 double lanes (4 + 4).
__attribute__((target("avx2"), always_inline)) inline void addHalfChunkAvx2(__m256 f, __m256d& lo, __m256d& hi) {
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
}

// combineLanes' tree over lanes 0-3 (a), 4-7 (b), 8-11 (c), 12-15 (d).
__attribute__((target("avx2"), always_inline)) inline double combineAvx2(__m256d a, __m256d b, __m256d c, __m256d d) {
  const __m256d w4 = _mm256_add_pd(_mm256_add_pd(a, c), _mm256_add_pd(b, d));
  const __m128d w2 = _mm_add_pd(_mm256_castpd256_pd128(w4), _mm256_extractf128_pd(w4, 1));
  return _mm_cvtsd_f64(w2) + _mm_cvtsd_f64(_mm_unpackhi_pd(w2, w2));
}

// 8 floats from x[0, count) (count <= 8), the rest +0.
__attribute__((target("avx2"), always_inline)) inline __m256 loadPartialAvx2(const float* x, unsigned count) {
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(x, mask);
}

template <bool kWords>
__attribute__((target("avx2,popcnt"))) BucketSums sumsAndSignsAvx2(const float* x, uint64_t n, uint64_t* words) {
  static_assert(kChunk == 128 && kLanes == 16, "a chunk is 8 rows of 16 lanes, two 64-element groups");
  __m256d p0 = _mm256_setzero_pd(), p1 = p0, p2 = p0, p3 = p0, m0 = p0, m1 = p0, m2 = p0, m3 = p0;
  uint64_t negatives = 0;
  uint64_t c = 0;
  for (; c + kChunk <= n; c += kChunk) {
    __m256 pos_a = _mm256_setzero_ps(), pos_b = pos_a, neg_a = pos_a, neg_b = pos_a;
    uint64_t w[2] = {0, 0};
    for (unsigned r = 0; r < 8; ++r) {
      const float* row = x + c + 16 * r;
      const uint64_t bits = addHalfRowAvx2(_mm256_loadu_ps(row), pos_a, neg_a) |
                            addHalfRowAvx2(_mm256_loadu_ps(row + 8), pos_b, neg_b) << 8;
      w[r / 4] |= bits << (16 * (r % 4));
    }
    negatives += static_cast<uint64_t>(__builtin_popcountll(w[0]) + __builtin_popcountll(w[1]));
    if constexpr (kWords) {
      words[c / 64] = w[0];
      words[c / 64 + 1] = w[1];
    }
    addHalfChunkAvx2(pos_a, p0, p1);
    addHalfChunkAvx2(pos_b, p2, p3);
    addHalfChunkAvx2(neg_a, m0, m1);
    addHalfChunkAvx2(neg_b, m2, m3);
  }
  if (c < n) {
    __m256 pos_a = _mm256_setzero_ps(), pos_b = pos_a, neg_a = pos_a, neg_b = pos_a;
    const auto len = static_cast<unsigned>(n - c);
    for (unsigned g = 0; 64 * g < len; ++g) {
      uint64_t w = 0;
      for (unsigned q = 0; q < 4; ++q) {
        const unsigned row = 64 * g + 16 * q;
        if (row >= len) break;
        const unsigned left = len - row;
        const uint64_t lo = addHalfRowAvx2(loadPartialAvx2(x + c + row, left < 8 ? left : 8), pos_a, neg_a);
        const uint64_t hi =
            left > 8 ? addHalfRowAvx2(loadPartialAvx2(x + c + row + 8, left - 8 < 8 ? left - 8 : 8), pos_b, neg_b) : 0;
        w |= (lo | hi << 8) << (16 * q);
      }
      negatives += static_cast<uint64_t>(__builtin_popcountll(w));
      if constexpr (kWords) words[c / 64 + g] = w;
    }
    addHalfChunkAvx2(pos_a, p0, p1);
    addHalfChunkAvx2(pos_b, p2, p3);
    addHalfChunkAvx2(neg_a, m0, m1);
    addHalfChunkAvx2(neg_b, m2, m3);
  }
  return BucketSums{combineAvx2(p0, p1, p2, p3), combineAvx2(m0, m1, m2, m3), static_cast<double>(negatives)};
}
#endif

// The fastest vector loop this host runs, or null where there is none (compress then keeps its scalar loops).
// kSigns: sums and sign words in one pass; without it bucketSums alone, for buckets that do not start a 64-element
// group (the words argument is then ignored).
template <bool kSigns>
SumsAndSigns pickSumsAndSigns() {
#if TERSE_ONEBIT_X86
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx512f) && sdk::cpu::has(sdk::cpu::Feature::kPopcnt))
    return sumsAndSignsAvx512<kSigns>;
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx2) && sdk::cpu::has(sdk::cpu::Feature::kPopcnt))
    return sumsAndSignsAvx2<kSigns>;
#endif
  return nullptr;
}

}  // namespace terse::compressors::onebit::host
