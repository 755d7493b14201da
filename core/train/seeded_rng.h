// A small seeded generator whose streams are the same on every platform and standard library: std::shuffle and the
// std:: distributions are implementation-defined, so a run's data order and initial weights would change with the
// toolchain. SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014) is
// enough here: these streams pick orders and initial weights, they are not a statistical experiment.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace terse::train {

class SeededRng {
 public:
  // Distinct (seed, stream) pairs give independent-looking sequences; stream separates e.g. tensors or epochs.
  explicit SeededRng(uint64_t seed, uint64_t stream = 0) : state_(mix(seed ^ mix(stream + 0x632BE59BD9B4E019ull))) {}

  uint64_t nextU64() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix(state_);
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(nextU64() >> 11) * 0x1.0p-53; }

  // Uniform in [0, bound) without modulo bias: draws below 2^64 mod bound are rejected, so the rest split evenly
  // (the arc4random_uniform method; ISO C++ has no 128-bit multiply for Lemire's).
  uint64_t below(uint64_t bound) {
    if (bound <= 1) return 0;
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = nextU64();
      if (r >= threshold) return r % bound;
    }
  }

  // Standard normal by Box-Muller (one value per call; the pair's second half is dropped to keep no hidden state).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  static constexpr uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  uint64_t state_;
};

}  // namespace terse::train
