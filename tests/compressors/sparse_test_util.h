// Helpers shared by the tests of the sparsifiers (topk, randomk, threshold, dgc) and powersgd: deterministic test data
// of several shapes of distribution, the (value, index) wire layout read back, and reference selections computed the
// slow, obvious way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "terse/sdk/params.hpp"
#include "tests/compressors/plugin_harness.h"

namespace terse::testing::sparse {

// A parameter value as text: 0.01, 1e-05 (what a config would say).
inline std::string numberText(double v) {
  return terse::sdk::formatNumber(v);
}

// The distributions the selection tests run over. Names show up in test failure messages.
enum class Dist { kNormal, kUniform, kHeavyTailed, kConstant, kManyZeros, kTies, kTiny };

inline const char* distName(Dist d) {
  switch (d) {
    case Dist::kNormal:
      return "normal";
    case Dist::kUniform:
      return "uniform";
    case Dist::kHeavyTailed:
      return "heavy-tailed (Cauchy)";
    case Dist::kConstant:
      return "constant";
    case Dist::kManyZeros:
      return "99% zeros";
    case Dist::kTies:
      return "few distinct magnitudes";
    case Dist::kTiny:
      return "subnormal and tiny";
  }
  return "?";
}

inline std::vector<float> makeData(Dist d, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::cauchy_distribution<float> cauchy(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_int_distribution<int> hundred(0, 99);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    switch (d) {
      case Dist::kNormal:
        g[i] = normal(rng);
        break;
      case Dist::kUniform:
        g[i] = uniform(rng);
        break;
      case Dist::kHeavyTailed: {
        const float x = cauchy(rng);
        g[i] = std::isfinite(x) ? std::clamp(x, -1e30f, 1e30f) : 0.0f;
        break;
      }
      case Dist::kConstant:
        g[i] = (i % 2 == 0) ? 0.25f : -0.25f;
        break;
      case Dist::kManyZeros:
        g[i] = hundred(rng) == 0 ? normal(rng) : ((i % 3 == 0) ? -0.0f : 0.0f);
        break;
      case Dist::kTies:
        g[i] = 0.5f * static_cast<float>(small(rng));
        break;
      case Dist::kTiny:
        g[i] = normal(rng) * 1e-39f;  // mostly subnormal
        break;
    }
  }
  return g;
}

// The (value, index) payload of topk/threshold/dgc: header (16) | u64 count | f32 values | u32 indices.
struct SparsePayload {
  uint64_t count = 0;
  std::vector<float> values;
  std::vector<uint32_t> indices;
};

inline constexpr size_t kCountOffset = 16;
inline constexpr size_t kValuesOffset = 24;

inline SparsePayload parseSparse(const Bytes& p) {
  SparsePayload s;
  if (p.size() < kValuesOffset) {
    ADD_FAILURE() << "sparse payload of " << p.size() << " bytes is shorter than its fixed part";
    return s;
  }
  std::memcpy(&s.count, p.data() + kCountOffset, sizeof s.count);
  if (p.size() != kValuesOffset + 8 * s.count) {
    ADD_FAILURE() << "sparse payload of " << p.size() << " bytes for count " << s.count;
    return s;
  }
  s.values.resize(s.count);
  s.indices.resize(s.count);
  if (s.count > 0) {
    std::memcpy(s.values.data(), p.data() + kValuesOffset, 4 * s.count);
    std::memcpy(s.indices.data(), p.data() + kValuesOffset + 4 * s.count, 4 * s.count);
  }
  return s;
}

// Offsets of entry j's value and index in a payload with `count` entries.
inline size_t valueOffset(size_t j) {
  return kValuesOffset + 4 * j;
}
inline size_t indexOffset(uint64_t count, size_t j) {
  return kValuesOffset + 4 * static_cast<size_t>(count) + 4 * j;
}

// Reference top-k: order by |g| descending, then index ascending; the first k, sorted by index.
inline std::vector<uint32_t> referenceTopK(const std::vector<float>& g, size_t k) {
  std::vector<uint32_t> order(g.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// Whether `selected` (sorted indices) is a magnitude cut of g: every selected |g| >= every unselected |g|.
inline bool isMagnitudeCut(const std::vector<float>& g, const std::vector<uint32_t>& selected) {
  std::vector<char> in(g.size(), 0);
  for (uint32_t i : selected) in[i] = 1;
  float min_in = INFINITY, max_out = -1.0f;
  for (size_t i = 0; i < g.size(); ++i) {
    if (in[i]) {
      min_in = std::min(min_in, std::fabs(g[i]));
    } else {
      max_out = std::max(max_out, std::fabs(g[i]));
    }
  }
  return selected.empty() || min_in >= max_out;
}

inline bool strictlyIncreasing(const std::vector<uint32_t>& v) {
  for (size_t j = 1; j < v.size(); ++j) {
    if (v[j] <= v[j - 1]) return false;
  }
  return true;
}

}  // namespace terse::testing::sparse
