// The stochastic quantizers' draws (sdk/philox.hpp's drawAt at width B = 24, 16 or 8: the rounding_bits parameter of
// qsgd and terngrad) as float vectors for their x86 loops: r 2^-B lane by lane, exactly uniform01 of drawAt's word
// (r < 2^24 converts exactly and the scale is a power of two). B = 24 reads one Philox word per element and keeps its
// top 24 bits; B = 16 (8) zero-extends the stream's u16 (u8) lanes, which on little-endian x86 are the stream's draws
// in element order, so no shuffle is needed. Host only.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_KIT_DRAWS_X86 1
#include <immintrin.h>
#else
#define TERSE_KIT_DRAWS_X86 0
#endif

namespace terse::kit {

#if TERSE_KIT_DRAWS_X86

// Where element j's draw starts in the stream `bits` (element 0 at its start), in bytes.
template <unsigned B>
inline const unsigned char* drawsOf(const uint32_t* bits, uint64_t j) {
  return reinterpret_cast<const unsigned char*>(bits) + j * (B == 24 ? 4 : B / 8);
}

// Elements 0..7 of `draws` (the stream at element 0, read at width B) as floats r 2^-B.
template <unsigned B>
__attribute__((target("avx2"), always_inline)) inline __m256 uniform8Avx2(const void* draws) {
  if constexpr (B == 24) {
    const __m256i r = _mm256_loadu_si256(static_cast<const __m256i*>(draws));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(1.0f / 16777216.0f));
  } else if constexpr (B == 16) {
    const __m256i r = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(draws)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps(1.0f / 65536.0f));
  } else {
    static_assert(B == 8, "draw widths are 8, 16 and 24 bits");
    const __m256i r = _mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(draws)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps(1.0f / 256.0f));
  }
}

// Elements 0..15 of `draws` as floats r 2^-B (uniform8Avx2 on 16 lanes).
template <unsigned B>
__attribute__((target("avx512f"), always_inline)) inline __m512 uniform16Avx512(const void* draws) {
  if constexpr (B == 24) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(_mm512_loadu_si512(draws), 8)),
                         _mm512_set1_ps(1.0f / 16777216.0f));
  } else if constexpr (B == 16) {
    const __m512i r = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(draws)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(r), _mm512_set1_ps(1.0f / 65536.0f));
  } else {
    static_assert(B == 8, "draw widths are 8, 16 and 24 bits");
    const __m512i r = _mm512_cvtepu8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(draws)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(r), _mm512_set1_ps(1.0f / 256.0f));
  }
}

#endif  // TERSE_KIT_DRAWS_X86

}  // namespace terse::kit
