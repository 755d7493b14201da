// Elementwise and scalar parts of DGC's sampled-threshold selection, shared by the CPU plugin and the later CUDA
// kernels (DESIGN.md section 5). Keys are the magnitude keys of compressors/topk/topk_math.h.
#pragma once

#include <cstdint>

#include "compressors/topk/topk_math.h"
#include "terse/hd.h"
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

}  // namespace terse::compressors::dgc
