// terngrad: the host's vector loops for the codes of whole groups inside one bucket, the common case of compress.
// Each makes the bits of terngrad_math.h's quantizeValue + bitpack::packGroup<2> (the scalar loop below, which the
// CUDA kernels share), only with SIMD compares whose masks are the code bits: keep_i & !negative_i is the code's low
// bit, keep_i & negative_i its high bit. Each loop is made for a draw width B (the rounding_bits parameter,
// sdk/philox.hpp's drawAt): B = 24 reads one Philox word per element, B = 16 (8) zero-extends the stream's u16 (u8)
// lanes, r 2^-B being uniform01 of drawAt's word exactly. Host only (x86 intrinsics);
// tests/compressors/terngrad_test.cc runs every path this host can run against the scalar one on the same inputs.
#pragma once

#include <cstdint>

#include "terngrad_math.h"
#include "terse/kit/draws_x86.hpp"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/cpu.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_TERNGRAD_X86 1
#include <immintrin.h>
#else
#define TERSE_TERNGRAD_X86 0
#endif

namespace terse::compressors::terngrad::host {

// Codes of `groups` consecutive 64-element groups of one bucket (scale s) from their draws into 2 words each. `bits`
// is the Philox stream from the first element's word on (PhiloxStream::drawGroups), read at the loop's draw width.
using TernarizeGroups = void (*)(const float* x, float scale, const uint32_t* bits, uint64_t groups, uint64_t* words);

// bucketMaxAbs of x[0, n): a max of magnitudeBits, exact in any order, so a vector loop may take it in any order.
using BucketMaxAbs = float (*)(const float* x, uint64_t n);

inline float bucketMaxAbsScalar(const float* x, uint64_t n) {
  return bucketMaxAbs(x, n);
}

template <unsigned B = sdk::kDrawBitsFull>
void ternarizeGroupsScalar(const float* x, float scale, const uint32_t* bits, uint64_t groups, uint64_t* words) {
  uint32_t codes[kGroup];
  for (uint64_t q = 0; q < groups; ++q) {
    for (unsigned j = 0; j < kGroup; ++j) {
      codes[j] = quantizeValue(x[kGroup * q + j], scale, sdk::drawAt<B>(bits, kGroup * q + j));
    }
    sdk::bitpack::packGroup<kCodeBits>(codes, words + kCodeBits * q);
  }
}

#if TERSE_TERNGRAD_X86
// Bit k of the low 32 bits of x moved to bit 2k (the other bits zero). Shifts and masks rather than BMI2's pdep,
// which AMD CPUs before Zen 3 run in microcode (hundreds of cycles), and some of them have AVX2.
inline uint64_t spreadBits32(uint64_t x) {
  x &= 0xFFFFFFFFull;
  x = (x | (x << 16)) & 0x0000FFFF0000FFFFull;
  x = (x | (x << 8)) & 0x00FF00FF00FF00FFull;
  x = (x | (x << 4)) & 0x0F0F0F0F0F0F0F0Full;
  x = (x | (x << 2)) & 0x3333333333333333ull;
  x = (x | (x << 1)) & 0x5555555555555555ull;
  return x;
}

// The 64 codes of a group as two 64-element masks, `plus` (code 1) and `minus` (code 2): codes 0..31 make word 0, bit
// 2j the low bit of code j, 2j + 1 its high bit.
inline void storeTernaryWords(uint64_t plus, uint64_t minus, uint64_t* words) {
  words[0] = spreadBits32(plus) | spreadBits32(minus) << 1;
  words[1] = spreadBits32(plus >> 32) | spreadBits32(minus >> 32) << 1;
}

__attribute__((target("avx2"))) inline float bucketMaxAbsAvx2(const float* x, uint64_t n) {
  // Four independent maxima per step of 32 elements (bucketMaxAbs's one chain of 16 lanes ran at a cycle per step).
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_epi32(m0, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask));
    m1 = _mm256_max_epi32(m1,
                          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), abs_mask));
    m2 = _mm256_max_epi32(m2,
                          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16)), abs_mask));
    m3 = _mm256_max_epi32(m3,
                          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 24)), abs_mask));
  }
  m0 = _mm256_max_epi32(_mm256_max_epi32(m0, m1), _mm256_max_epi32(m2, m3));
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m0);
  int32_t best = 0;
  for (const int32_t l : lanes) best = l > best ? l : best;
  for (; i < n; ++i) {
    const auto a = static_cast<int32_t>(magnitudeBits(x[i]));
    best = a > best ? a : best;
  }
  return sdk::bitsFloat(static_cast<uint32_t>(best));
}

template <unsigned B = sdk::kDrawBitsFull>
__attribute__((target("avx2"))) void ternarizeGroupsAvx2(const float* x, float scale, const uint32_t* bits,
                                                         uint64_t groups, uint64_t* words) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 zero = _mm256_setzero_ps();
  for (uint64_t q = 0; q < groups; ++q, x += kGroup, words += kCodeBits) {
    uint64_t plus = 0, minus = 0;
    for (unsigned v = 0; v < 8; ++v) {
      const __m256 g = _mm256_loadu_ps(x + 8 * v);
      const __m256 u = kit::uniform8Avx2<B>(kit::drawsOf<B>(bits, kGroup * q + 8 * v));
      const auto keep = static_cast<uint64_t>(
          _mm256_movemask_ps(_mm256_cmp_ps(_mm256_mul_ps(u, s), _mm256_and_ps(g, abs_mask), _CMP_LT_OQ)));
      const auto negative = static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(g, zero, _CMP_LT_OQ)));
      plus |= (keep & ~negative) << (8 * v);
      minus |= (keep & negative) << (8 * v);
    }
    storeTernaryWords(plus, minus, words);
  }
}

// GCC 12's AVX-512 intrinsics trip -Wuninitialized where they are inlined (see sdk/philox.hpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) inline float bucketMaxAbsAvx512(const float* x, uint64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
  uint64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_max_epi32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask));
    m1 = _mm512_max_epi32(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs_mask));
    m2 = _mm512_max_epi32(m2, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), abs_mask));
    m3 = _mm512_max_epi32(m3, _mm512_and_si512(_mm512_loadu_si512(x + i + 48), abs_mask));
  }
  for (; i + 16 <= n; i += 16) m0 = _mm512_max_epi32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask));
  if (i < n) {  // the last n - i < 16 elements under a mask (masked-off lanes load as 0, which no max changes)
    const auto rest = static_cast<__mmask16>((1u << (n - i)) - 1u);
    m1 = _mm512_max_epi32(m1, _mm512_and_si512(_mm512_maskz_loadu_epi32(rest, x + i), abs_mask));
  }
  const int32_t best = _mm512_reduce_max_epi32(_mm512_max_epi32(_mm512_max_epi32(m0, m1), _mm512_max_epi32(m2, m3)));
  return sdk::bitsFloat(static_cast<uint32_t>(best));
}

// With AVX-512F the compares give the masks directly, and BMI2's pdep spreads them (every AVX-512 CPU runs pdep in
// hardware).
template <unsigned B = sdk::kDrawBitsFull>
__attribute__((target("avx512f,bmi2"))) void ternarizeGroupsAvx512(const float* x, float scale, const uint32_t* bits,
                                                                   uint64_t groups, uint64_t* words) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512 zero = _mm512_setzero_ps();
  constexpr uint64_t kEven = 0x5555555555555555ull;
  for (uint64_t q = 0; q < groups; ++q, x += kGroup, words += kCodeBits) {
    uint64_t plus = 0, minus = 0;
    for (unsigned v = 0; v < 4; ++v) {
      const __m512 g = _mm512_loadu_ps(x + 16 * v);
      const __m512 u = kit::uniform16Avx512<B>(kit::drawsOf<B>(bits, kGroup * q + 16 * v));
      const __m512 magnitude = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(g), abs_mask));
      const uint64_t keep = _mm512_cmp_ps_mask(_mm512_mul_ps(u, s), magnitude, _CMP_LT_OQ);
      const uint64_t negative = _mm512_cmp_ps_mask(g, zero, _CMP_LT_OQ);
      plus |= (keep & ~negative) << (16 * v);
      minus |= (keep & negative) << (16 * v);
    }
    words[0] = _pdep_u64(plus, kEven) | _pdep_u64(minus, kEven << 1);
    words[1] = _pdep_u64(plus >> 32, kEven) | _pdep_u64(minus >> 32, kEven << 1);
  }
}
#pragma GCC diagnostic pop
#endif

inline BucketMaxAbs pickBucketMaxAbs() {
#if TERSE_TERNGRAD_X86
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx512f)) return bucketMaxAbsAvx512;
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx2)) return bucketMaxAbsAvx2;
#endif
  return bucketMaxAbsScalar;
}

// The fastest of the above this host runs, for draw width B.
template <unsigned B>
TernarizeGroups pickTernarizeGroups() {
#if TERSE_TERNGRAD_X86
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx512f) && sdk::cpu::has(sdk::cpu::Feature::kBmi2))
    return ternarizeGroupsAvx512<B>;
  if (sdk::cpu::has(sdk::cpu::Feature::kAvx2)) return ternarizeGroupsAvx2<B>;
#endif
  return ternarizeGroupsScalar<B>;
}

// pickTernarizeGroups for a draw width b known at run time (8, 16 or 24).
inline TernarizeGroups pickTernarizeGroups(unsigned b) {
  return b == 8 ? pickTernarizeGroups<8>() : b == 16 ? pickTernarizeGroups<16>() : pickTernarizeGroups<24>();
}

}  // namespace terse::compressors::terngrad::host
