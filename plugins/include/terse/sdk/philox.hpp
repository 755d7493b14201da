// Counter-based random numbers for compressors (DESIGN.md section 5): Random123's Philox4x32-10 (Salmon et al.,
// "Parallel Random Numbers: As Easy as 1, 2, 3", SC 2011), keyed so that element i of tensor t at step s under seed k
// always draws the same number, on the CPU and the GPU alike, however the work is split across threads:
//
//   key     = (k mod 2^32, k div 2^32)                       the run's (or rank's) seed from terse_tensor_info_v1
//   counter = (b mod 2^32, b div 2^32, h mod 2^32, h div 2^32),  b = i div 4,  h = mix(s, t)
//   u_i     = word (i mod 4) of Philox(counter, key), as a float in [0, 1) with 24 random bits
//
// mix() is a bijective 64-bit mixer, so distinct (step, tensor) pairs collide only with probability 2^-64.
// Header-only, no allocation, every function TERSE_HD, so kernels include it unchanged.
#pragma once

#include <Random123/philox.h>

#include <cstdint>

#include "terse/hd.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_PHILOX_AVX2 1
#include <immintrin.h>

#include "terse/sdk/cpu.hpp"
#else
#define TERSE_PHILOX_AVX2 0
#endif

namespace terse::sdk {

#if TERSE_PHILOX_AVX2
namespace detail {

inline bool haveAvx2() {
  static const bool yes = cpu::has(cpu::Feature::kAvx2);
  return yes;
}

// Philox4x32-10 of the 16 blocks 16g .. 16g+15 under key (k0, k1) and counter high words (h0, h1), written as
// out[4l + w] = word w of block 16g + l. Each 64-bit lane holds one block's 32-bit word in its low half: vpmuludq
// multiplies exactly those halves into the full 64-bit product, whose high half is the next round's mulhi and whose
// low half is already in place as the mullo (the high halves of the other lanes carry junk that no multiply reads
// and the final pack drops). About 3x the throughput of block-at-a-time Philox on an AVX2 EPYC with two chains at a
// time, 4x with the four below. noinline: the compressors' loops are `flatten`ed (sdk::cpu::clones), and inlined into
// them these 16 live vectors spilled so badly that qsgd's compress got 20% slower instead of faster.
__attribute__((target("avx2"), noinline)) inline void philoxGroup64Avx2(uint32_t k0, uint32_t k1, uint32_t h0,
                                                                        uint32_t h1, uint64_t g, uint32_t* out) {
  const __m256i m0 = _mm256_set1_epi64x(PHILOX_M4x32_0), m1 = _mm256_set1_epi64x(PHILOX_M4x32_1);
  const __m256i w0 = _mm256_set1_epi32(static_cast<int>(PHILOX_W32_0));
  const __m256i w1 = _mm256_set1_epi32(static_cast<int>(PHILOX_W32_1));
  // All four vectors (16 blocks) at once: a round is a chain of multiply, shift and two xors, about 7 cycles of
  // latency per vector, so four independent chains keep the multiplier busy where two left it waiting (about 25%
  // faster on an AVX2 EPYC, though 16 words no longer fit the 16 ymm registers and a few spill).
  __m256i c0[4], c1[4], c2[4], c3[4];
  const auto first = static_cast<long long>(g * 16);
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    c0[v] = _mm256_add_epi64(_mm256_set1_epi64x(first), _mm256_setr_epi64x(4 * v, 4 * v + 1, 4 * v + 2, 4 * v + 3));
    c1[v] = _mm256_srli_epi64(c0[v], 32);
    c2[v] = _mm256_set1_epi64x(h0);
    c3[v] = _mm256_set1_epi64x(h1);
  }
  __m256i key0 = _mm256_set1_epi64x(k0), key1 = _mm256_set1_epi64x(k1);
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256i p0 = _mm256_mul_epu32(c0[v], m0);
      const __m256i p1 = _mm256_mul_epu32(c2[v], m1);
      c0[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[v]), key0);
      c2[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[v]), key1);
      c1[v] = p1;
      c3[v] = p0;
    }
    key0 = _mm256_add_epi32(key0, w0);
    key1 = _mm256_add_epi32(key1, w1);
  }
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    // Lane l: (c0, c1) and (c2, c3) as 64-bit pairs, then each block's 128 bits in order.
    const __m256i c01 = _mm256_blend_epi32(c0[v], _mm256_slli_epi64(c1[v], 32), 0xAA);
    const __m256i c23 = _mm256_blend_epi32(c2[v], _mm256_slli_epi64(c3[v], 32), 0xAA);
    const __m256i even = _mm256_unpacklo_epi64(c01, c23);  // blocks 0 and 2 of the vector
    const __m256i odd = _mm256_unpackhi_epi64(c01, c23);   // blocks 1 and 3
    auto* dst = reinterpret_cast<__m256i*>(out + 16 * v);
    _mm256_storeu_si256(dst, _mm256_permute2x128_si256(even, odd, 0x20));
    _mm256_storeu_si256(dst + 1, _mm256_permute2x128_si256(even, odd, 0x31));
  }
}

inline bool haveAvx512() {
  static const bool yes = cpu::has(cpu::Feature::kAvx512f);
  return yes;
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_epi32 (`__m512i __Y = __Y;`), which -Wuninitialized reports
// wherever they are inlined (GCC bug 105593); the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The NV vectors' 8 blocks each in block order, out[4l + w] = word w of block l: lane l as the 64-bit pairs (word 0,
// word 1) and (word 2, word 3) of block l, then the blocks in order. Four two-source permutes per vector, 5% faster
// than shift + blend + unpack + permute (eight).
template <int NV>
__attribute__((target("avx512f"), always_inline)) inline void storeBlocksAvx512(const __m512i* c0, const __m512i* c1,
                                                                                const __m512i* c2, const __m512i* c3,
                                                                                uint32_t* out) {
  const __m512i pair = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
  const __m512i lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const __m512i c01 = _mm512_permutex2var_epi32(c0[v], pair, c1[v]);
    const __m512i c23 = _mm512_permutex2var_epi32(c2[v], pair, c3[v]);
    _mm512_storeu_si512(out + 32 * v, _mm512_permutex2var_epi64(c01, lo, c23));
    _mm512_storeu_si512(out + 32 * v + 16, _mm512_permutex2var_epi64(c01, hi, c23));
  }
}

// philoxGroup64Avx2's steps on 8-lane vectors for hosts with AVX-512F: NV vectors of 8 blocks each, blocks 16g ..
// 16g + 8 NV - 1 (NV = 2: one group; NV = 4: groups g and g + 1), written as out[4l + w] = word w of block 16g + l.
// A round is a chain of multiply, shift and xor (about 5 cycles); two vectors (four chains) leave the multipliers
// idle most of that time, four vectors (eight chains, 16 state registers of the 32) keep them busy: philoxGroupsAvx512
// makes 128 words in about the time philoxGroup64Avx512 made 64. The same bits
// (Philox.Group64IsSixteenBlocksInOrder runs whichever the host picks; Philox.Group64VectorPathsAgree and
// Philox.GroupsMatchGroup64 run both).
template <int NV>
__attribute__((target("avx512f"), always_inline)) inline void philoxVectorsAvx512(uint32_t k0, uint32_t k1, uint32_t h0,
                                                                                  uint32_t h1, uint64_t g,
                                                                                  uint32_t* out) {
  const __m512i m0 = _mm512_set1_epi64(PHILOX_M4x32_0), m1 = _mm512_set1_epi64(PHILOX_M4x32_1);
  const __m512i w0 = _mm512_set1_epi32(static_cast<int>(PHILOX_W32_0));
  const __m512i w1 = _mm512_set1_epi32(static_cast<int>(PHILOX_W32_1));
  __m512i c0[NV], c1[NV], c2[NV], c3[NV];
  const auto first = static_cast<long long>(g * 16);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    c0[v] = _mm512_add_epi64(_mm512_set1_epi64(first), _mm512_setr_epi64(8 * v, 8 * v + 1, 8 * v + 2, 8 * v + 3,
                                                                         8 * v + 4, 8 * v + 5, 8 * v + 6, 8 * v + 7));
    c1[v] = _mm512_srli_epi64(c0[v], 32);
    c2[v] = _mm512_set1_epi64(h0);
    c3[v] = _mm512_set1_epi64(h1);
  }
  __m512i key0 = _mm512_set1_epi64(k0), key1 = _mm512_set1_epi64(k1);
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m512i p0 = _mm512_mul_epu32(c0[v], m0);
      const __m512i p1 = _mm512_mul_epu32(c2[v], m1);
      c0[v] = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p1, 32), c1[v]), key0);
      c2[v] = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(p0, 32), c3[v]), key1);
      c1[v] = p1;
      c3[v] = p0;
    }
    key0 = _mm512_add_epi32(key0, w0);
    key1 = _mm512_add_epi32(key1, w1);
  }
  storeBlocksAvx512<NV>(c0, c1, c2, c3, out);
}

__attribute__((target("avx512f"), noinline)) inline void philoxGroup64Avx512(uint32_t k0, uint32_t k1, uint32_t h0,
                                                                             uint32_t h1, uint64_t g, uint32_t* out) {
  philoxVectorsAvx512<2>(k0, k1, h0, h1, g, out);
}

// Groups g .. g + count - 1 into out[0 .. 64 count): two groups at a time, the odd last one alone.
__attribute__((target("avx512f"), noinline)) inline void philoxGroupsAvx512(uint32_t k0, uint32_t k1, uint32_t h0,
                                                                            uint32_t h1, uint64_t g, uint64_t count,
                                                                            uint32_t* out) {
  for (; count >= 2; count -= 2, g += 2, out += 128) philoxVectorsAvx512<4>(k0, k1, h0, h1, g, out);
  if (count != 0) philoxVectorsAvx512<2>(k0, k1, h0, h1, g, out);
}

inline bool haveAvx512Ifma() {
  static const bool yes = cpu::has(cpu::Feature::kAvx512f) && cpu::has(cpu::Feature::kAvx512ifma);
  return yes;
}

// philoxVectorsAvx512 with the high half of each product from AVX-512 IFMA instead of a shift: vpmadd52huq of c and
// M 2^20 is bits 52.. of c M 2^20, which is c M >> 32 (c M < 2^64) in the low bits of the lane, where the next
// multiply reads it. It needs c's upper 32 bits zero (IFMA reads 52), so the xors are zero-masked to the even 32-bit
// halves, which costs nothing; the low half still comes from vpmuludq. 11% faster on a Zen 5 EPYC (16.7M words in
// 2.86-2.91 ms against 3.20-3.27, best of 15): the multiply-add units take the work the shifts queued for. The same
// bits (Philox.Group64VectorPathsAgree, Philox.GroupsMatchGroup64).
template <int NV>
__attribute__((target("avx512f,avx512ifma"), always_inline)) inline void philoxVectorsIfma(uint32_t k0, uint32_t k1,
                                                                                           uint32_t h0, uint32_t h1,
                                                                                           uint64_t g, uint32_t* out) {
  const __m512i m0 = _mm512_set1_epi64(PHILOX_M4x32_0), m1 = _mm512_set1_epi64(PHILOX_M4x32_1);
  const __m512i m0_hi = _mm512_set1_epi64(static_cast<long long>(uint64_t{PHILOX_M4x32_0} << 20));
  const __m512i m1_hi = _mm512_set1_epi64(static_cast<long long>(uint64_t{PHILOX_M4x32_1} << 20));
  const __m512i w0 = _mm512_set1_epi32(static_cast<int>(PHILOX_W32_0));
  const __m512i w1 = _mm512_set1_epi32(static_cast<int>(PHILOX_W32_1));
  constexpr __mmask16 kEven = 0x5555;  // the low 32 bits of each 64-bit lane
  __m512i c0[NV], c1[NV], c2[NV], c3[NV];
  const auto first = static_cast<long long>(g * 16);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const __m512i ctr = _mm512_add_epi64(
        _mm512_set1_epi64(first),
        _mm512_setr_epi64(8 * v, 8 * v + 1, 8 * v + 2, 8 * v + 3, 8 * v + 4, 8 * v + 5, 8 * v + 6, 8 * v + 7));
    c0[v] = _mm512_maskz_mov_epi32(kEven, ctr);
    c1[v] = _mm512_srli_epi64(ctr, 32);
    c2[v] = _mm512_set1_epi64(h0);
    c3[v] = _mm512_set1_epi64(h1);
  }
  __m512i key0 = _mm512_set1_epi64(k0), key1 = _mm512_set1_epi64(k1);
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m512i zero = _mm512_setzero_si512();
      const __m512i hi0 = _mm512_madd52hi_epu64(zero, c0[v], m0_hi);
      const __m512i hi1 = _mm512_madd52hi_epu64(zero, c2[v], m1_hi);
      const __m512i p0 = _mm512_mul_epu32(c0[v], m0);
      const __m512i p1 = _mm512_mul_epu32(c2[v], m1);
      c0[v] = _mm512_maskz_ternarylogic_epi32(kEven, hi1, c1[v], key0, 0x96);  // 0x96: a ^ b ^ c
      c2[v] = _mm512_maskz_ternarylogic_epi32(kEven, hi0, c3[v], key1, 0x96);
      c1[v] = p1;
      c3[v] = p0;
    }
    key0 = _mm512_add_epi32(key0, w0);
    key1 = _mm512_add_epi32(key1, w1);
  }
  storeBlocksAvx512<NV>(c0, c1, c2, c3, out);
}

__attribute__((target("avx512f,avx512ifma"), noinline)) inline void philoxGroup64Ifma(uint32_t k0, uint32_t k1,
                                                                                      uint32_t h0, uint32_t h1,
                                                                                      uint64_t g, uint32_t* out) {
  philoxVectorsIfma<2>(k0, k1, h0, h1, g, out);
}

__attribute__((target("avx512f,avx512ifma"), noinline)) inline void philoxGroupsIfma(uint32_t k0, uint32_t k1,
                                                                                     uint32_t h0, uint32_t h1,
                                                                                     uint64_t g, uint64_t count,
                                                                                     uint32_t* out) {
  for (; count >= 2; count -= 2, g += 2, out += 128) philoxVectorsIfma<4>(k0, k1, h0, h1, g, out);
  if (count != 0) philoxVectorsIfma<2>(k0, k1, h0, h1, g, out);
}
#pragma GCC diagnostic pop

}  // namespace detail
#endif

// splitmix64's finalizer (Steele et al. 2014): a bijection with full avalanche.
TERSE_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// 24 random bits as a float in [0, 1): exact, and never 1.0f (which rounding 32 bits to a float could give).
TERSE_HD float uniform01(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Draws of fewer bits (the `rounding_bits` parameter of qsgd, terngrad and natural): with b = 16 or 8, element e's
// draw is the e-th b-bit number of the stream of Philox words read as little-endian b-bit units, stream word w being
// word w mod 4 of block w div 4:
//
//   b = 24   r_e = bits(e) >> 8                    (one word per element: uniform01 as above)
//   b = 16   r_e = half (e mod 2) of word e div 2  (one block serves 8 elements)
//   b = 8    r_e = byte (e mod 4) of word e div 4  (one block serves 16 elements)
//
// drawAt returns r_e at the top of a 32-bit word (r_e << (32 - b); at b = 24 the whole word, whose low 8 bits
// uniform01 drops), so uniform01 of it is exactly r_e 2^-b and the quantizers' compares stay as they are. A host
// SIMD loop reads the same numbers by zero-extending the stream's u16 (u8) lanes, since x86 is little-endian.
inline constexpr unsigned kDrawBitsFull = 24;

TERSE_HD constexpr bool validDrawBits(unsigned b) {
  return b == 8 || b == 16 || b == 24;
}

// Elements served by one 32-bit stream word at draw width b.
TERSE_HD constexpr unsigned drawsPerWord(unsigned b) {
  return b == 24 ? 1u : 32u / b;
}

// Element j's draw (as above) from `stream`, the stream words from element 0's word on (element 0 at the start of a
// word: j counts from an element whose index is a multiple of drawsPerWord(B)).
template <unsigned B>
TERSE_HD uint32_t drawAt(const uint32_t* stream, uint64_t j) {
  static_assert(B == 8 || B == 16 || B == 24, "draw widths are 8, 16 and 24 bits");
  if constexpr (B == 24) {
    return stream[j];
  } else if constexpr (B == 16) {
    return (stream[j >> 1] >> (16 * (j & 1))) << 16;
  } else {
    return (stream[j >> 2] >> (8 * (j & 3))) << 24;
  }
}

TERSE_HD uint32_t drawAt(unsigned b, const uint32_t* stream, uint64_t j) {
  return b == 24 ? drawAt<24>(stream, j) : b == 16 ? drawAt<16>(stream, j) : drawAt<8>(stream, j);
}

class PhiloxStream {
 public:
  using Rng = r123::Philox4x32;

  TERSE_HD PhiloxStream(uint64_t seed, uint64_t step, uint64_t tensor_id) {
    key_.v[0] = static_cast<uint32_t>(seed);
    key_.v[1] = static_cast<uint32_t>(seed >> 32);
    const uint64_t h = mix64(step ^ mix64(tensor_id));
    hi_[0] = static_cast<uint32_t>(h);
    hi_[1] = static_cast<uint32_t>(h >> 32);
  }

  // The four 32-bit words for elements 4b .. 4b+3.
  TERSE_HD Rng::ctr_type block(uint64_t b) const {
    Rng::ctr_type ctr;
    ctr.v[0] = static_cast<uint32_t>(b);
    ctr.v[1] = static_cast<uint32_t>(b >> 32);
    ctr.v[2] = hi_[0];
    ctr.v[3] = hi_[1];
    return Rng()(ctr, key_);
  }

  // The 32 random bits of elements 64g .. 64g+63 (bits[j] = bits(64g + j)): blocks 16g .. 16g+15, the same bits
  // whoever computes them (philox_test checks it). On an x86 host the 16 blocks run as vectors: two 8-lane ones with
  // AVX-512 (with IFMA where the host has it), four 4-lane ones with AVX2 (detail:: above); elsewhere, and in device
  // code, block by block.
  TERSE_HD void group64(uint64_t g, uint32_t* bits) const {
#if TERSE_PHILOX_AVX2
    if (detail::haveAvx512Ifma()) {
      detail::philoxGroup64Ifma(key_.v[0], key_.v[1], hi_[0], hi_[1], g, bits);
      return;
    }
    if (detail::haveAvx512()) {
      detail::philoxGroup64Avx512(key_.v[0], key_.v[1], hi_[0], hi_[1], g, bits);
      return;
    }
    if (detail::haveAvx2()) {
      detail::philoxGroup64Avx2(key_.v[0], key_.v[1], hi_[0], hi_[1], g, bits);
      return;
    }
#endif
    for (unsigned k = 0; k < 16; ++k) {
      const auto r = block(g * 16 + k);
      for (unsigned w = 0; w < 4; ++w) bits[4 * k + w] = r.v[w];
    }
  }

  // The bits of groups g .. g + count - 1 (bits[64k + j] = bits(64(g + k) + j)), the same as count calls of
  // group64; on an AVX-512 host two groups at a time (philoxGroupsIfma or philoxGroupsAvx512), about 1.5x as fast
  // per group.
  TERSE_HD void groups(uint64_t g, uint64_t count, uint32_t* bits) const {
#if TERSE_PHILOX_AVX2
    if (detail::haveAvx512Ifma()) {
      detail::philoxGroupsIfma(key_.v[0], key_.v[1], hi_[0], hi_[1], g, count, bits);
      return;
    }
    if (detail::haveAvx512()) {
      detail::philoxGroupsAvx512(key_.v[0], key_.v[1], hi_[0], hi_[1], g, count, bits);
      return;
    }
#endif
    for (uint64_t k = 0; k < count; ++k) group64(g + k, bits + 64 * k);
  }

  // The stream words that hold the draws of elements 64g .. 64(g + count) - 1 at draw width b (see drawAt), made
  // with groups() into buf; returns where element 64g's word is in buf. buf holds 64 (count / k + 2) words for k =
  // drawsPerWord(b) (64 count at b = 24, where this is groups() and returns buf).
  TERSE_HD const uint32_t* drawGroups(unsigned b, uint64_t g, uint64_t count, uint32_t* buf) const {
    const unsigned k = drawsPerWord(b);
    const uint64_t first = g / k;                           // the Philox group of element 64g's word
    const uint64_t last = ((g + count) * 64 / k - 1) / 64;  // ... of the last element's word
    groups(first, last - first + 1, buf);
    return buf + (g % k) * (64 / k);
  }

  // Element i's draw at width b (drawAt's value), one block per call.
  TERSE_HD uint32_t drawBits(uint64_t i, unsigned b) const {
    const unsigned k = drawsPerWord(b);
    const uint32_t word = bits(i / k);
    return drawAt(b, &word, i % k);
  }

  // Element i's 32 random bits; a loop over consecutive i should call block() once per 4 elements instead.
  TERSE_HD uint32_t bits(uint64_t i) const {
    return block(i >> 2).v[i & 3];
  }
  TERSE_HD float uniform(uint64_t i) const {
    return uniform01(bits(i));
  }

 private:
  Rng::key_type key_;
  uint32_t hi_[2];
};

}  // namespace terse::sdk
