// bf16: the host's f32 -> bfloat16 loop with AVX2 intrinsics, which the plugin picks at run time where the CPU has
// AVX2; bf16_math.h's select form runs elsewhere and on the GPU.
//
// encodeValue's integer steps on 16 floats at a time (the same operations, so the same bits: bf16_test runs this loop
// and encodeValue over the same 88 million floats), narrowed with packus (the rounded values and the quieted NaNs fit
// 16 bits, so its saturation never applies) and a lane fix-up. GCC's own vectorization of the select form narrows
// with a two-table word permute per 32 values, and ran at 0.68x torch's preallocated cast on an AVX-512 EPYC.
#pragma once

#include <cstdint>

#include "bf16_math.h"
#include "terse/sdk/cpu.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_BF16_AVX2 1
#include <immintrin.h>

namespace terse::compressors::bf16 {

inline bool hasAvx2() {
  static const bool has = terse::sdk::cpu::has(terse::sdk::cpu::Feature::kAvx2);
  return has;
}

// By reference: a 32-byte vector by value has another calling convention without AVX (-Wpsabi); inlined anyway.
__attribute__((target("avx2"), always_inline)) inline void encode8(__m256i& u) {
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)),
                                         _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))),
                        16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  u = _mm256_blendv_epi8(rounded, nan, is_nan);
}

__attribute__((target("avx2"))) inline void encodeAvx2(const float* __restrict in, uint16_t* __restrict out,
                                                       uint64_t n) {
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8));
    encode8(a);
    encode8(b);
    // packus interleaves 128-bit lanes: a0 b0 a1 b1 as 64-bit quarters; the permute restores a0 a1 b0 b1.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8));
  }
  for (; i < n; ++i) out[i] = encodeValue(in[i]);
}

// decodeValue (the bf16 as the upper half of an f32: exact, no rounding) for outputs beyond the caches, written with
// non-temporal stores: an ordinary store first reads the line it writes (read for ownership), so a 64 MiB decode moved
// 32 MiB in, 64 MiB of those reads and 64 MiB out; streaming skips the reads. The output is then not in cache, which
// is why the plugin keeps the cached loop for smaller tensors (see kAvx2MinFloats in bf16.cc).
__attribute__((target("avx2"))) inline void decodeStreamAvx2(const uint16_t* __restrict in, float* __restrict out,
                                                             uint64_t n) {
  uint64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(out + i) & 31) != 0; ++i) out[i] = decodeValue(in[i]);
  for (; i + 16 <= n; i += 16) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(w)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(w, 1)), 16);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), lo);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i + 8), hi);
  }
  _mm_sfence();  // streaming stores are weakly ordered: make them visible before the caller reads or publishes out
  for (; i < n; ++i) out[i] = decodeValue(in[i]);
}

}  // namespace terse::compressors::bf16
#else
#define TERSE_BF16_AVX2 0
#endif
