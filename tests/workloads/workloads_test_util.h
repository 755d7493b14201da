// Small synthetic data sets for the workload tests: deterministic, tiny, and shaped like images where needed.
#pragma once

#include <memory>

#include "core/train/seeded_rng.h"
#include "experiments/workloads/dataset.h"

namespace terse::testing {

inline workloads::Dataset randomImages(int64_t n, int64_t rows, int64_t cols, int32_t classes, uint64_t seed) {
  workloads::Dataset d;
  d.num_examples = n;
  d.rows = rows;
  d.cols = cols;
  d.dims = rows * cols;
  d.num_classes = classes;
  train::SeededRng rng(seed);
  d.features.resize(static_cast<std::size_t>(n * d.dims));
  for (float& v : d.features) v = static_cast<float>(rng.uniform());
  d.labels.resize(static_cast<std::size_t>(n));
  for (int32_t& y : d.labels) y = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  return d;
}

inline std::shared_ptr<const workloads::DataSplit> randomSplit(int64_t n, int64_t rows, int64_t cols, int32_t classes,
                                                               uint64_t seed) {
  auto split = std::make_shared<workloads::DataSplit>();
  split->train = randomImages(n, rows, cols, classes, seed);
  split->test = randomImages(n, rows, cols, classes, seed + 1);
  return split;
}

}  // namespace terse::testing
