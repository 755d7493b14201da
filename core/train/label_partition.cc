#include "core/train/label_partition.h"

#include <algorithm>
#include <cmath>

#include "core/common/error.h"
#include "core/common/fnv.h"
#include "core/train/seeded_rng.h"

namespace terse::train {
namespace {

// log(X) for X ~ Gamma(shape, 1), Marsaglia and Tsang (2000). For shape < 1, Gamma(shape) = Gamma(shape + 1) U^(1 /
// shape), whose log stays finite where the variate itself would underflow.
double logGamma(SeededRng& rng, double shape) {
  double boost = 0;
  if (shape < 1) {
    const double u = 1.0 - rng.uniform();  // (0, 1]
    boost = std::log(u) / shape;
    shape += 1;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = rng.normal();
    const double t = 1.0 + c * x;
    if (t <= 0) continue;
    const double v = t * t * t;
    const double u = 1.0 - rng.uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d * v) + boost;
  }
}

// Dirichlet(alpha, ..., alpha) over `k` components, normalized from the log-Gammas (log-sum-exp).
std::vector<double> dirichlet(SeededRng& rng, int k, double alpha) {
  std::vector<double> logs(static_cast<std::size_t>(k));
  for (double& l : logs) l = logGamma(rng, alpha);
  const double top = *std::max_element(logs.begin(), logs.end());
  double sum = 0;
  for (double& l : logs) {
    l = std::exp(l - top);
    sum += l;
  }
  for (double& l : logs) l /= sum;
  return logs;
}

}  // namespace

std::vector<std::vector<int64_t>> dirichletPartition(std::span<const int32_t> labels, int num_classes, int workers,
                                                     double alpha, uint64_t seed) {
  const auto n = static_cast<int64_t>(labels.size());
  TERSE_CHECK(workers >= 1, InvalidArgument, "data partition: workers must be >= 1, got " << workers);
  TERSE_CHECK(n >= workers, InvalidArgument,
              "data partition: " << n << " examples cannot give each of " << workers << " workers one");
  TERSE_CHECK(num_classes >= 1, InvalidArgument, "data partition: num_classes must be >= 1, got " << num_classes);
  TERSE_CHECK(std::isfinite(alpha) && alpha > 0, InvalidArgument,
              "data partition: the Dirichlet alpha must be finite and > 0, got " << alpha);
  const auto classes = static_cast<std::size_t>(num_classes);
  // Each class's examples, shuffled: a worker takes from the back.
  std::vector<std::vector<int64_t>> pool(classes);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t c = labels[static_cast<std::size_t>(i)];
    TERSE_CHECK(c >= 0 && c < num_classes, InvalidArgument,
                "data partition: example " << i << " has label " << c << ", outside [0, " << num_classes << ")");
    pool[static_cast<std::size_t>(c)].push_back(i);
  }
  SeededRng order(seed, 0x70617274ull);  // "part"
  for (auto& p : pool) {
    for (std::size_t i = p.size(); i > 1; --i) std::swap(p[i - 1], p[static_cast<std::size_t>(order.below(i))]);
  }
  std::vector<std::vector<double>> mix;
  for (int w = 0; w < workers; ++w) {
    SeededRng rng(seed, 0x6d69780000000000ull + static_cast<uint64_t>(w));  // "mix" + worker
    mix.push_back(dirichlet(rng, num_classes, alpha));
  }
  const int64_t shard = n / workers;
  std::vector<std::vector<int64_t>> shards(static_cast<std::size_t>(workers));
  for (auto& s : shards) s.reserve(static_cast<std::size_t>(shard));
  SeededRng draw(seed, 0x64726177ull);  // "draw"
  for (int64_t slot = 0; slot < shard; ++slot) {
    for (int w = 0; w < workers; ++w) {
      const std::vector<double>& q = mix[static_cast<std::size_t>(w)];
      // Among the classes left: by the worker's mix, or, once its classes are gone, by what is left.
      double total = 0;
      for (std::size_t c = 0; c < classes; ++c) total += pool[c].empty() ? 0 : q[c];
      const bool by_mix = total > 0;
      if (!by_mix)
        for (const auto& p : pool) total += static_cast<double>(p.size());
      double u = draw.uniform() * total;
      std::size_t pick = classes;
      for (std::size_t c = 0; c < classes; ++c) {
        if (pool[c].empty()) continue;
        pick = c;  // the last class left catches rounding at the end of the walk
        u -= by_mix ? q[c] : static_cast<double>(pool[c].size());
        if (u < 0) break;
      }
      shards[static_cast<std::size_t>(w)].push_back(pool[pick].back());
      pool[pick].pop_back();
    }
  }
  return shards;
}

uint64_t partitionChecksum(const std::vector<std::vector<int64_t>>* shards) {
  if (shards == nullptr) return 0;
  uint64_t h = kFnv1aBasis;
  for (const auto& s : *shards) {
    const uint64_t size = s.size();
    h = fnv1a(h, &size, sizeof size);
    h = fnv1a(h, s.data(), s.size() * sizeof(int64_t));
  }
  return h;
}

std::vector<std::vector<int64_t>> labelHistograms(const std::vector<std::vector<int64_t>>& shards,
                                                  std::span<const int32_t> labels, int num_classes) {
  std::vector<std::vector<int64_t>> h(shards.size(), std::vector<int64_t>(static_cast<std::size_t>(num_classes)));
  for (std::size_t w = 0; w < shards.size(); ++w)
    for (int64_t i : shards[w]) ++h[w][static_cast<std::size_t>(labels[static_cast<std::size_t>(i)])];
  return h;
}

double meanLabelDistance(const std::vector<std::vector<int64_t>>& histograms, std::span<const int32_t> labels,
                         int num_classes) {
  if (histograms.empty() || labels.empty()) return 0;
  std::vector<double> global(static_cast<std::size_t>(num_classes));
  for (int32_t c : labels) global[static_cast<std::size_t>(c)] += 1.0 / static_cast<double>(labels.size());
  double sum = 0;
  for (const auto& h : histograms) {
    double size = 0;
    for (int64_t k : h) size += static_cast<double>(k);
    double tv = 0;
    for (std::size_t c = 0; c < global.size(); ++c)
      tv += std::abs((size > 0 ? static_cast<double>(h[c]) / size : 0) - global[c]);
    sum += tv / 2;
  }
  return sum / static_cast<double>(histograms.size());
}

}  // namespace terse::train
