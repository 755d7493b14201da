// Elementwise parts of top-k selection by magnitude, shared by the CPU paths (topk_select.hpp; the built-ins topk,
// dgc and threshold, which use the same keys and wire layout) and the CUDA kernels (topk_select_kernels.cuh, DESIGN.md
// section 5).
//
// Selection works on the IEEE-754 bit pattern of |g| as an unsigned key: for non-negative floats the integer order of
// the bits is the numeric order (subnormals included, -0 and +0 both key 0), so top-k by magnitude is "k largest
// keys", which a radix select finds with integer histograms and no float compares (cub's radix select does the same on
// the GPU). Non-finite values get the largest keys (inf = 0x7f800000, NaN above it), so a selection that contains
// every non-finite input element exposes it (see isNonFiniteKey).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "terse/hd.h"

namespace terse::kit::topk {

// Keys of |g| are 31-bit: the sign bit is dropped.
inline constexpr uint32_t kKeyMask = 0x7fffffffu;
// The key of +inf; every key >= this is inf or NaN.
inline constexpr uint32_t kNonFiniteKey = 0x7f800000u;

TERSE_HD uint32_t floatBits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

TERSE_HD float bitsToFloat(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// The selection key of g: the bits of |g|.
TERSE_HD uint32_t magnitudeKey(float g) {
  return floatBits(g) & kKeyMask;
}

TERSE_HD bool isNonFiniteKey(uint32_t key) {
  return key >= kNonFiniteKey;
}

// The radix select narrows the 31-bit key by three digits, most significant first: bits 30..18 (13 bits: the exponent
// and 5 mantissa bits, 32 bins per octave of magnitude), 17..8 (10 bits), 7..0 (8 bits). A wide top digit makes the
// bin at the k-th largest magnitude narrow (about 2% of an octave), so few elements share it with the selected ones,
// whatever the shape of the distribution; its 8192 counters (32 KiB per copy) stay in L2.
inline constexpr int kDigits = 3;
inline constexpr uint32_t kMaxBins = 8192;

// Functions rather than constant arrays, so that kernels can call them (a host array is not visible in device code).
TERSE_HD constexpr uint32_t digitShift(int level) {
  return level == 0 ? 18u : (level == 1 ? 8u : 0u);
}
TERSE_HD constexpr uint32_t digitBits(int level) {
  return level == 0 ? 13u : (level == 1 ? 10u : 8u);
}

TERSE_HD uint32_t digitOf(uint32_t key, int level) {
  return (key >> digitShift(level)) & ((1u << digitBits(level)) - 1u);
}

// The key bits above `level`'s digit (what a candidate must share with the prefix narrowed so far).
TERSE_HD uint32_t prefixOf(uint32_t key, int level) {
  return level == 0 ? 0u : key >> (digitShift(level) + digitBits(level));
}

// Number of elements top-k and dgc aim for: k = min(numel, max(1, round(ratio * numel))) for numel > 0, and 0 for an
// empty tensor. Rounding to nearest (half up) rather than ceil: ceil turns a product that lands a hair above an integer
// in floating point (0.07 * 100 = 7.000000000000001) into one element more than the user asked for.
TERSE_HD uint64_t targetCount(double ratio, uint64_t numel) {
  if (numel == 0) return 0;
  const double want = std::floor(ratio * static_cast<double>(numel) + 0.5);
  if (!(want >= 1.0)) return 1;  // also catches NaN
  if (want >= static_cast<double>(numel)) return numel;
  return static_cast<uint64_t>(want);
}

// Whether element i with `key` is selected by the cut (key > cut, or key == cut while tie quota is left). The caller
// decrements the quota for each selected tie; ties are taken in index order, so the lowest indices win.
TERSE_HD bool takeByCut(uint32_t key, uint32_t cut, uint64_t tie_quota) {
  return key > cut || (key == cut && tie_quota > 0);
}

}  // namespace terse::kit::topk
