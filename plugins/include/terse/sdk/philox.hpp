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

namespace terse::sdk {

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

  // Element i's 32 random bits; a loop over consecutive i should call block() once per 4 elements instead.
  TERSE_HD uint32_t bits(uint64_t i) const { return block(i >> 2).v[i & 3]; }
  TERSE_HD float uniform(uint64_t i) const { return uniform01(bits(i)); }

 private:
  Rng::key_type key_;
  uint32_t hi_[2];
};

}  // namespace terse::sdk
