// Inputs and measures of the conformance suite (vectors.h).
#include "core/conformance/vectors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/compress/seed.h"

namespace terse::conformance {

std::span<const std::byte> asBytes(const Floats& x) {
  return {reinterpret_cast<const std::byte*>(x.data()), x.size() * sizeof(float)};
}

uint64_t mixSeed(uint64_t seed, uint64_t a, uint64_t b) {
  return splitmix64(splitmix64(seed ^ splitmix64(a)) ^ b);
}

Floats normalInput(uint64_t numel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Floats x(numel);
  for (auto& v : x) v = normal(rng);
  return x;
}

double norm(std::span<const float> x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

double diffNorm(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s);
}

bool allFinite(std::span<const float> x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

int64_t firstBitDifference(std::span<const float> a, std::span<const float> b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

int64_t firstByteDifference(std::span<const std::byte> a, std::span<const std::byte> b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

}  // namespace terse::conformance
