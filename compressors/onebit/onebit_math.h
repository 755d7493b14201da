// onebit: the elementwise math of 1-bit quantization (see onebit.cc for the papers and the payload), as small TERSE_HD
// functions called by the CPU loops and by the CUDA kernels (onebit.cu), so the CPU tests check the math the GPU runs.
//
// An element's bit is its IEEE sign bit (1 = negative; +0 counts as positive, -0 as negative, contributing 0 to the
// negative side's sum). The sign bit rather than g < 0 keeps every loop free of compares and branches. Per bucket:
//   two_means (Seide et al.):      positive elements decode to  mean{g_i : sign bit clear},
//                                  negative elements decode to  mean{g_i : sign bit set}   (each 0 for an empty side)
//   mean_abs (Karimireddy et al.): every element decodes to sign(g_i) * mean_i |g_i|  (= ||g||_1 / d)
// Scales travel as magnitudes: pos = mean of the non-negative side, neg = -mean of the negative side, both >= 0.
#pragma once

#include <cstdint>

#include "terse/hd.h"
#include "terse/sdk/half.hpp"

namespace terse::compressors::onebit {

// Sums run over chunks of kChunk elements in kLanes f32 lanes (element j of a chunk to lane j % kLanes: at most 8
// additions per lane, so within about 8 ulp), each chunk's lanes are added into kLanes double lanes, and those are
// summed in a pairwise tree once per bucket: a fixed order, accurate for buckets of any size (a whole-tensor bucket
// included), with 16 f32 lanes one AVX-512 register. Smaller chunks spend more time converting to double (64: 0.69x
// memcpy bandwidth at 64 MB; 128: 0.75x).
inline constexpr unsigned kLanes = 16;
inline constexpr unsigned kChunk = 128;

struct BucketSums {
  double positive;      // sum of g_i with the sign bit clear
  double negative_abs;  // sum of |g_i| with the sign bit set
  double negatives;     // how many have the sign bit set (exact in double up to 2^53)
};

TERSE_HD uint32_t signBit(float g) {
  return sdk::floatBits(g) >> 31;
}

// Adds one element to a lane's f32 chunk sums: |g| to the side its sign bit says, and 1 to the count if negative.
TERSE_HD void addElement(float g, float& pos, float& neg, float& cnt) {
  const uint32_t bits = sdk::floatBits(g);
  const float magnitude = sdk::bitsFloat(bits & 0x7FFFFFFFu);
  const float negative = static_cast<float>(bits >> 31);
  const float neg_part = magnitude * negative;
  neg += neg_part;
  pos += magnitude - neg_part;
  cnt += negative;
}

// The pairwise tree over the kLanes double lanes that closes bucketSums (overwrites the arrays).
TERSE_HD BucketSums combineLanes(double* pos, double* neg, double* cnt) {
  for (unsigned width = kLanes / 2; width > 0; width /= 2) {
    for (unsigned l = 0; l < width; ++l) {
      pos[l] += pos[l + width];
      neg[l] += neg[l + width];
      cnt[l] += cnt[l + width];
    }
  }
  return BucketSums{pos[0], neg[0], cnt[0]};
}

// One lane of bucketSums on its own: the double totals bucketSums keeps in lane `lane` (chunk by chunk, the lane's
// elements c + lane, c + lane + kLanes, ... of each chunk summed in f32, then added in double). A GPU bucket runs its
// kLanes lanes on kLanes threads and hands the totals to combineLanes, which reproduces bucketSums bit for bit
// (onebit_test checks it on the CPU).
TERSE_HD BucketSums laneBucketSums(const float* x, uint64_t n, unsigned lane) {
  BucketSums total{0, 0, 0};
  for (uint64_t c = 0; c < n; c += kChunk) {
    float pos = 0, neg = 0, cnt = 0;
    const uint64_t len = n - c < kChunk ? n - c : kChunk;
    for (uint64_t j = lane; j < len; j += kLanes) addElement(x[c + j], pos, neg, cnt);
    total.positive += pos;
    total.negative_abs += neg;
    total.negatives += cnt;
  }
  return total;
}

#if defined(__GNUC__) && !defined(__CUDACC__)
#define TERSE_ONEBIT_VECTOR_SUMS 1
// A full chunk's lane sums on the host: lanes 0-7 and 8-15 as two 8-float vectors (GCC vector extensions: one AVX
// register in the x86-64-v3 clone, two SSE ones in the baseline), each lane the same addElement steps in the same
// order as the scalar loop, so the same bits (LaneSumsCombineToBucketSumsBitForBit). The scalar loop kept its 48
// lane sums on the stack, a store and a reload per add: onebit's compress spent 40% of its time there.
inline void chunkSums(const float* chunk, float* pos, float* neg, float* cnt) {
  using F8 = float __attribute__((vector_size(32)));
  using U8 = uint32_t __attribute__((vector_size(32)));
  // Named variables, not arrays: GCC keeps arrays of vectors in memory, which is what this is meant to avoid.
  F8 p0 = {}, p1 = {}, m0 = {}, m1 = {}, k0 = {}, k1 = {};
  auto add = [](const float* x, F8& p, F8& m, F8& k) {
    U8 bits;
    __builtin_memcpy(&bits, x, sizeof bits);
    const U8 magnitude_bits = bits & 0x7FFFFFFFu;
    F8 magnitude;
    __builtin_memcpy(&magnitude, &magnitude_bits, sizeof magnitude);
    const F8 negative = __builtin_convertvector(bits >> 31, F8);
    const F8 neg_part = magnitude * negative;
    m += neg_part;
    p += magnitude - neg_part;
    k += negative;
  };
  for (unsigned q = 0; q < kChunk; q += kLanes) {
    add(chunk + q, p0, m0, k0);
    add(chunk + q + 8, p1, m1, k1);
  }
  __builtin_memcpy(pos, &p0, sizeof p0);
  __builtin_memcpy(pos + 8, &p1, sizeof p1);
  __builtin_memcpy(neg, &m0, sizeof m0);
  __builtin_memcpy(neg + 8, &m1, sizeof m1);
  __builtin_memcpy(cnt, &k0, sizeof k0);
  __builtin_memcpy(cnt + 8, &k1, sizeof k1);
}
#else
#define TERSE_ONEBIT_VECTOR_SUMS 0
#endif

// The sums behind both reconstructions over n elements. Infinite or NaN when the input holds inf or NaN (or a chunk's
// f32 sum overflows, which only values near the f32 limit can do). Only bit operations and exact products by 0 or 1:
// no data-dependent branch, which with random signs would mispredict every other element.
TERSE_HD BucketSums bucketSums(const float* x, uint64_t n) {
  double total_pos[kLanes] = {}, total_neg[kLanes] = {}, total_cnt[kLanes] = {};
  for (uint64_t c = 0; c < n; c += kChunk) {
    float pos[kLanes] = {}, neg[kLanes] = {}, cnt[kLanes] = {};
    auto add = [&](unsigned l, float g) { addElement(g, pos[l], neg[l], cnt[l]); };
    const float* chunk = x + c;
    if (n - c >= kChunk) {
#if TERSE_ONEBIT_VECTOR_SUMS
      chunkSums(chunk, pos, neg, cnt);
#else
      for (unsigned q = 0; q < kChunk; q += kLanes) {
        for (unsigned l = 0; l < kLanes; ++l) add(l, chunk[q + l]);
      }
#endif
    } else {
      const unsigned len = static_cast<unsigned>(n - c);
      for (unsigned j = 0; j < len; ++j) add(j % kLanes, chunk[j]);
    }
    for (unsigned l = 0; l < kLanes; ++l) {
      total_pos[l] += pos[l];
      total_neg[l] += neg[l];
      total_cnt[l] += cnt[l];
    }
  }
  return combineLanes(total_pos, total_neg, total_cnt);
}

// Seide's two reconstruction values of a bucket of n elements, as magnitudes {pos, neg}.
TERSE_HD void twoMeans(const BucketSums& s, uint64_t n, float* pos, float* neg) {
  const double positives = static_cast<double>(n) - s.negatives;
  *pos = positives > 0 ? static_cast<float>(s.positive / positives) : 0.0f;
  *neg = s.negatives > 0 ? static_cast<float>(s.negative_abs / s.negatives) : 0.0f;
}

// The scaled sign's one magnitude, ||g||_1 / n.
TERSE_HD float meanAbs(const BucketSums& s, uint64_t n) {
  return n > 0 ? static_cast<float>((s.positive + s.negative_abs) / static_cast<double>(n)) : 0.0f;
}

// The value of a bit given its bucket's magnitudes (for mean_abs, pos == neg): pos or -neg, chosen with a bit mask
// rather than a branch (random signs), exactly.
TERSE_HD float decodeValue(uint32_t bit, float pos, float neg) {
  const uint32_t take_neg = 0u - (bit & 1u);
  return sdk::bitsFloat((sdk::floatBits(pos) & ~take_neg) | ((sdk::floatBits(neg) | 0x80000000u) & take_neg));
}

}  // namespace terse::compressors::onebit
