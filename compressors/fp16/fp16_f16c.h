// fp16: the host's f32 <-> binary16 loops with the F16C instructions (vcvtps2ph / vcvtph2ps, 8 values at a time),
// which the plugin picks at run time where the CPU has them; fp16_math.h's select forms run elsewhere and on the GPU.
//
// F16C gives the select forms' bits for every input: vcvtps2ph with an immediate round-to-nearest-even rounds,
// overflows to infinity and makes subnormal halves exactly like encodeValue, and quiets a NaN keeping its sign and the
// top 10 payload bits (0x7E00 | payload >> 13); vcvtph2ps is exact and sets the quiet bit of a NaN like decodeValue.
// MXCSR's rounding mode is not consulted; its DAZ can only turn an f32 subnormal input into zero, whose half (+-0) is
// the same. fp16_test checks both loops against the select forms on every float whose half varies and on all 65536
// halves. The plain loops vectorize too (AVX2 clones), but F16C is 1.6x their throughput on an AVX2 EPYC.
#pragma once

#include <cstdint>

#include "fp16_math.h"
#include "terse/sdk/cpu.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_FP16_F16C 1
#include <immintrin.h>

namespace terse::compressors::fp16 {

// F16C with AVX's registers (sdk::cpu reads cpuid itself: GCC's __builtin_cpu_supports has no name for F16C).
inline bool hasF16c() {
  return terse::sdk::cpu::has(terse::sdk::cpu::Feature::kF16c);
}

__attribute__((target("avx,f16c"))) inline void encodeF16c(const float* __restrict in, uint16_t* __restrict out,
                                                           uint64_t n) {
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i lo = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    const __m128i hi = _mm256_cvtps_ph(_mm256_loadu_ps(in + i + 8), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_set_m128i(hi, lo));
  }
  for (; i < n; ++i) out[i] = encodeValue(in[i]);
}

__attribute__((target("avx,f16c"))) inline void decodeF16c(const uint16_t* __restrict in, float* __restrict out,
                                                           uint64_t n, bool accumulate) {
  uint64_t i = 0;
  if (accumulate) {
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
      _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), v));
    }
    for (; i < n; ++i) out[i] += decodeValue(in[i]);
  } else {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    }
    for (; i < n; ++i) out[i] = decodeValue(in[i]);
  }
}

}  // namespace terse::compressors::fp16
#else
#define TERSE_FP16_F16C 0
#endif
