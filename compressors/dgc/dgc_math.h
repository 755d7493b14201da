// Elementwise and scalar parts of DGC's sampled-threshold selection, shared by the CPU plugin (dgc_select.h) and the
// CUDA kernels (dgc.cu), so that both draw the same sample and walk the same thresholds (DESIGN.md section 5). Keys are
// the magnitude keys of terse/kit/topk_math.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "terse/hd.h"
#include "terse/kit/topk_math.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::dgc {

// The selected count must lie in [ceil(0.8 k), floor(1.3 k)] (DGC's reference code accepts this band around the
// target; Lin et al. 2018 leave it open). Integer arithmetic, so no ratio lands a hair off the band. k itself is
// always inside, and for k >= 1 the band is never empty.
TERSE_HD uint64_t minCount(uint64_t k) {
  return (4 * k + 4) / 5;
}
TERSE_HD uint64_t maxCount(uint64_t k) {
  return 13 * k / 10;
}

// The high 64 bits of a * b, without __int128 (so the same code runs in kernels).
TERSE_HD uint64_t mulHi64(uint64_t a, uint64_t b) {
  const uint64_t a_lo = a & 0xffffffffull, a_hi = a >> 32;
  const uint64_t b_lo = b & 0xffffffffull, b_hi = b >> 32;
  const uint64_t lo_lo = a_lo * b_lo;
  const uint64_t hi_lo = a_hi * b_lo;
  const uint64_t lo_hi = a_lo * b_hi;
  const uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffull) + lo_hi;
  return a_hi * b_hi + (hi_lo >> 32) + (cross >> 32);
}

// The position of sample j of s in [0, n), s <= n < 2^32: stratified, one sample per stratum [j n / s, (j+1) n / s) at
// an offset drawn from 64 Philox bits (stream elements 2j and 2j + 1) by multiply-high (Lemire's method without the
// rejection step: the bias is below 2^-32). Stratification estimates the population's quantiles with no more variance
// than sampling with replacement, and the gathers walk memory forward instead of missing the cache at random.
TERSE_HD uint64_t samplePosition(const sdk::PhiloxStream& stream, uint64_t j, uint64_t s, uint64_t n) {
  const uint64_t begin = j * n / s;
  const uint64_t end = (j + 1) * n / s;
  const auto w = stream.block(j >> 1);
  const uint32_t lo = (j & 1) ? w.v[2] : w.v[0];
  const uint32_t hi = (j & 1) ? w.v[3] : w.v[1];
  return begin + mulHi64(static_cast<uint64_t>(hi) << 32 | lo, end - begin);
}

// A threshold key t selects every key > t and, of the keys == t, as many as needed (lowest index first). With gt keys
// above t and ge at or above it, t is acceptable if some count in [gt, ge] lies in [lo, hi]; the count taken is the
// one nearest k.
TERSE_HD bool acceptable(uint64_t gt, uint64_t ge, uint64_t lo, uint64_t hi) {
  return gt <= hi && ge >= lo;
}
TERSE_HD uint64_t countFor(uint64_t k, uint64_t gt, uint64_t ge) {
  return k < gt ? gt : (k > ge ? ge : k);
}

// The count the sampled threshold aims at, in units of k: the middle of the band [0.8, 1.3].
inline constexpr double kAim = 1.05;

// The sample rank (the rank-th largest of s sample keys) for a real-valued target: rounded half up, clamped to [1, s].
TERSE_HD uint64_t sampleRank(double rank, uint64_t s) {
  double r = std::floor(rank + 0.5);
  r = r < 1.0 ? 1.0 : r;
  r = static_cast<double>(s) < r ? static_cast<double>(s) : r;
  return static_cast<uint64_t>(r);
}

// The first threshold's target rank among s samples of n: where kAim k of n falls in the sample.
TERSE_HD double firstRank(uint64_t k, uint64_t s, uint64_t n) {
  return kAim * static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(n);
}

// A later threshold's target rank: the sample saw sample_hits keys beyond the last threshold where the tensor has
// hits, so kAim k of the tensor corresponds to kAim sample_hits k / hits of the sample (its local density error
// corrected). sample_hits, hits > 0.
TERSE_HD double nextRank(uint64_t sample_hits, uint64_t k, uint64_t hits) {
  return kAim * static_cast<double>(sample_hits) * static_cast<double>(k) / static_cast<double>(hits);
}

// The next threshold: the sample's proposal (-1: none) if it lies strictly inside the bracket (too_low, too_high) that
// holds the exact k-th largest key, else the bracket's middle in key space, so that every pass shrinks the bracket.
TERSE_HD int64_t nextThreshold(int64_t proposal, int64_t too_low, int64_t too_high) {
  return proposal > too_low && proposal < too_high ? proposal : too_low + (too_high - too_low) / 2;
}

// DGC's warm-up training (Lin et al. 2018, section 3.4): the sparsity rises exponentially over the first epochs, 75%,
// 93.75%, 98.4375%, 99.6% and then 99.9% in the paper's four. Here the ratio of stage s of `stages` is
// ratio^((s + 1) / (stages + 1)): for ratio 0.001 and four stages 25.1%, 6.3%, 1.58% and 0.398% kept, the paper's
// densities within 0.12 points, and then `ratio` itself. The stages' ratios are powers of one root, r =
// ratio^(1 / (stages + 1)), found by bisection with multiplications alone, not std::pow: glibc picks pow's code by the
// CPU (an FMA variant where the CPU has FMA) and does not promise the correctly rounded result, so two hosts could
// disagree on a ratio by an ulp, and with it on k where ratio x numel falls at a half. A product of doubles is
// correctly rounded everywhere (and has no add for a compiler to fuse), so every host gets the same ratios, the same
// k and the same payload bits. Called on the host only: the device code takes k from the host.

// x^m for m >= 1, multiplied left to right.
inline double multipliedPower(double x, int m) {
  double p = x;
  for (int i = 1; i < m; ++i) p *= x;
  return p;
}

// The largest double r in [ratio, 1] with multipliedPower(r, m) <= ratio, for ratio in (0, 1] and m >= 1.
inline double multipliedRoot(double ratio, int m) {
  double lo = ratio;  // multipliedPower(ratio, m) <= ratio for ratio <= 1
  double hi = 1.0;
  if (multipliedPower(hi, m) <= ratio) return hi;  // ratio == 1
  // Invariant: power(lo) <= ratio < power(hi). Each pass halves [lo, hi]; it ends when no double lies between them
  // (the midpoint rounds to an end), at most about 1,100 passes, under 64 for ratios above 2^-10.
  for (;;) {
    const double mid = lo + (hi - lo) / 2;
    if (mid <= lo || mid >= hi) return lo;
    (multipliedPower(mid, m) <= ratio ? lo : hi) = mid;
  }
}

// The ratios of the warm-up's stages, largest first: stage s keeps ratio^((s + 1) / (stages + 1)). stages >= 1.
inline std::vector<double> warmupRatios(double ratio, int stages) {
  const double root = multipliedRoot(ratio, stages + 1);
  std::vector<double> ratios;
  for (int s = 0; s < stages; ++s) ratios.push_back(multipliedPower(root, s + 1));
  return ratios;
}

// The stage of `step` in a warm-up of warmup_steps steps split into `stages` stages of (nearly) equal length:
// floor(step x stages / warmup_steps), for step < warmup_steps <= 2^40 and stages <= 32 (no overflow).
inline int warmupStage(uint64_t step, uint64_t warmup_steps, int stages) {
  return static_cast<int>(step * static_cast<uint64_t>(stages) / warmup_steps);
}

}  // namespace terse::compressors::dgc
