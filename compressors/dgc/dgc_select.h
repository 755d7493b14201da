// DGC's sampled-threshold selection on the host (Lin et al. 2018, section 3.1 and the reference code's
// "sparsify"): estimate the magnitude threshold of the top k from a random sample, then count what the threshold
// selects over the whole tensor and refine it, a bounded number of times, until the count lies in the band
// [minCount(k), maxCount(k)] = [0.8k, 1.3k] (dgc_math.h).
//
//   1. Sample s = max(ceil(sample_ratio * n), kMinSamples) magnitude keys, one at a Philox-chosen position in each of s
//      equal strata (dgc_math.h); if s >= n, sampling saves nothing and step 4 runs directly.
//   2. t = the round(1.05 k s / n)-th largest sample key (radix select over the sample), aiming at the band's middle.
//   3. Up to max_passes times: one pass over the tensor counts gt = #(key > t) and ge = #(key >= t). If some count in
//      [gt, ge] lies in the band, stop: the selection is every key > t plus the lowest-index ties up to the count
//      nearest k (ties count, so constant data or a sea of zeros select exactly k in one pass). Otherwise t is too low
//      (gt > 1.3k) or too high (ge < 0.8k), which narrows a bracket (too_low, too_high) that always contains the exact
//      k-th largest key. The next t rescales the sample rank by what the count revealed (target rank = rank(t) * k /
//      count, the sample's local density error corrected; again aiming at 1.05k) and falls back to bisecting the
//      bracket in key space when that proposal is not strictly inside it, so every pass shrinks the bracket.
//   4. If no pass landed in the band, an exact top-k (terse/kit/topk_select.hpp on the full tensor) selects
//      exactly k: the count is guaranteed in the band, the cost bounded by max_passes counting passes plus one exact
//      selection (four passes).
//
// Deterministic given (seed, step, tensor): the sample comes from sdk::PhiloxStream, everything else from the data.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "dgc_math.h"
#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_select.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::dgc {

// Fewer samples than this make the estimated threshold too noisy to land in the band in one pass.
inline constexpr uint64_t kMinSamples = 1024;

inline uint64_t sampleCount(double sample_ratio, uint64_t n) {
  const double want = std::ceil(sample_ratio * static_cast<double>(n));
  return std::max<uint64_t>(kMinSamples, want >= static_cast<double>(n) ? n : static_cast<uint64_t>(want));
}

// Whether the tensor is sampled at all (otherwise the selection is exact top-k from the start).
inline bool samples(double sample_ratio, uint64_t n) {
  return sampleCount(sample_ratio, n) < n;
}

// What the selection decided, before anything is written.
struct Plan {
  kit::topk::Cut cut;      // when !exact: every key > cut.key plus (count - cut.greater) ties, lowest index first
  uint64_t count = 0;      // entries selected, in [minCount(k), maxCount(k)]
  bool exact = false;      // select exactly k by kit::topk::selectTopK instead (step 4)
  bool nonfinite = false;  // the tensor holds inf or NaN (found by a counting pass; compress refuses it)
  int passes = 0;          // counting passes over the tensor (<= max_passes)
};

struct Counts {
  uint64_t gt = 0, ge = 0, nonfinite = 0;
};

// One pass: keys above t, at or above t, and non-finite. Blocks of 16 with 32-bit partial sums so that GCC vectorizes
// the compares at -O2; keys are < 2^31, so signed compares are exact.
inline Counts countPass(std::span<const float> g, uint32_t t) {
  const auto ts = static_cast<int32_t>(t);
  const auto inf = static_cast<int32_t>(kit::topk::kNonFiniteKey);
  const float* data = g.data();
  const size_t n = g.size();
  Counts c;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t gt = 0, ge = 0, nf = 0;
    for (size_t j = 0; j < 16; ++j) {
      const auto key = static_cast<int32_t>(kit::topk::magnitudeKey(data[i + j]));
      gt += key > ts ? 1u : 0u;
      ge += key >= ts ? 1u : 0u;
      nf += key >= inf ? 1u : 0u;
    }
    c.gt += gt, c.ge += ge, c.nonfinite += nf;
  }
  for (; i < n; ++i) {
    const auto key = static_cast<int32_t>(kit::topk::magnitudeKey(data[i]));
    c.gt += key > ts ? 1u : 0u;
    c.ge += key >= ts ? 1u : 0u;
    c.nonfinite += key >= inf ? 1u : 0u;
  }
  return c;
}

// Decides the selection for g (1 <= k <= n = g.size() < 2^32). Unless the answer is exact top-k from the start
// (k == n, or a tensor no larger than its sample), `sample` holds sampleCount(sample_ratio, n) keys of room and `hist`
// is topk's histogram scratch.
inline Plan plan(std::span<const float> g, uint64_t k, double sample_ratio, int max_passes,
                 const sdk::PhiloxStream& stream, std::span<uint32_t> sample, uint32_t* hist) {
  const uint64_t n = g.size();
  const uint64_t lo = minCount(k), hi = maxCount(k);
  Plan p;
  const uint64_t s = sampleCount(sample_ratio, n);
  if (k >= n || s >= n || max_passes < 1 || sample.size() < s || hist == nullptr) {
    p.exact = true;  // nothing to gain from sampling (or no room for it): exact from the start
    p.count = k;
    return p;
  }
  uint32_t* keys = sample.data();
  // Positions first, then the gather in a loop of its own: between two Philox calls only one or two loads are in
  // flight, in a bare gather loop the core overlaps many cache misses (5x faster at 16M elements).
  for (uint64_t j = 0; j < s; ++j) keys[j] = static_cast<uint32_t>(samplePosition(stream, j, s, n));
  for (uint64_t j = 0; j < s; ++j) keys[j] = kit::topk::magnitudeKey(g[keys[j]]);
  const auto sampleKey = [keys](size_t j) { return keys[j]; };
  // The rank-th largest sample key, rank rounded and clamped to [1, s].
  const auto sampleKth = [&](double rank) {
    return kit::topk::radixCut(static_cast<size_t>(s), sampleKey, sampleRank(rank, s), hist).key;
  };

  // Keys <= too_low select too many, keys >= too_high too few; the exact k-th largest key lies strictly between.
  int64_t too_low = -1;
  int64_t too_high = int64_t{1} << 31;
  // Aim at the band's middle, 1.05k, not at k: the sampled threshold's count is off by about 1/sqrt(k s / n)
  // relative, and the band reaches 25% either side of 1.05k but only 20% below k.
  uint32_t t = sampleKth(firstRank(k, s, n));
  for (int pass = 1; pass <= max_passes; ++pass) {
    const Counts c = countPass(g, t);
    p.passes = pass;
    if (c.nonfinite > 0) {
      p.nonfinite = true;
      return p;
    }
    if (acceptable(c.gt, c.ge, lo, hi)) {
      p.cut = kit::topk::Cut{t, c.gt};
      p.count = countFor(k, c.gt, c.ge);
      return p;
    }
    const bool too_many = c.gt > hi;
    if (too_many) {
      too_low = t;
    } else {
      too_high = t;
    }
    if (pass == max_passes) break;
    // The sample's view of the same threshold: what it should have said, scaled to what the tensor says.
    uint64_t sample_hits = 0;
    for (uint64_t j = 0; j < s; ++j) sample_hits += too_many ? (keys[j] > t) : (keys[j] >= t);
    const uint64_t hits = too_many ? c.gt : c.ge;
    const int64_t proposal =
        sample_hits > 0 && hits > 0 ? static_cast<int64_t>(sampleKth(nextRank(sample_hits, k, hits))) : int64_t{-1};
    t = static_cast<uint32_t>(nextThreshold(proposal, too_low, too_high));
  }
  p.exact = true;
  p.count = k;
  return p;
}

}  // namespace terse::compressors::dgc
