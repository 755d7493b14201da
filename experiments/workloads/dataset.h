// A labelled data set in memory: what the classification workloads train and evaluate on.
#pragma once

#include <cstdint>
#include <vector>

namespace terse::workloads {

struct Dataset {
  std::vector<float> features;  // num_examples x dims, row-major
  std::vector<int32_t> labels;  // num_examples class indices in [0, num_classes)
  int64_t num_examples = 0;
  int64_t dims = 0;            // features per example (rows * cols for images)
  int64_t rows = 0, cols = 0;  // image geometry; 0 when the features are not an image
  int32_t num_classes = 0;

  const float* example(int64_t i) const { return features.data() + i * dims; }
};

// A training set and its held-out test set; workers share one copy read-only.
struct DataSplit {
  Dataset train;
  Dataset test;
};

}  // namespace terse::workloads
