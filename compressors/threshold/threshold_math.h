// Elementwise parts of threshold sparsification, shared by the CPU plugin and the later CUDA kernels (DESIGN.md
// section 5). Selection compares magnitude keys (terse/kit/topk_math.hpp) as integers, so CPU and GPU agree
// bit for bit, and -0/+0 and subnormals need no special cases.
#pragma once

#include <cmath>
#include <cstdint>

#include "terse/hd.h"
#include "terse/kit/topk_math.hpp"

namespace terse::compressors::threshold {

// The least key an element must have to be kept: the key of the smallest float >= tau, so that key >= minKey(tau)
// is exactly |g| >= tau with tau compared in double (a float rounded from tau could land below it). tau > 0, finite.
// Above the largest float only inf (and NaN) would qualify: the key of +inf.
inline uint32_t minKeyFor(double tau) {
  float f = static_cast<float>(tau);  // round to nearest; inf when tau exceeds the largest float
  if (static_cast<double>(f) < tau) f = std::nextafter(f, INFINITY);
  return kit::topk::magnitudeKey(f);
}

// Whether an element with `key` is sent. NaN keys lie above inf's, so a NaN is "selected" too and compress then
// refuses the gradient rather than dropping the NaN silently.
TERSE_HD bool keep(uint32_t key, uint32_t min_key) {
  return key >= min_key;
}

}  // namespace terse::compressors::threshold
