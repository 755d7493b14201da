// The classic SGD lab: learn y = m . x + n from synthetic samples with Gaussian noise.
//   x ~ N(0, I_dims), m_i ~ N(0, 1), n ~ N(0, 1), y = m . x + n + noise * N(0, 1), all drawn from the seed.
// Loss: mean squared error over the batch, L = (1/B) sum (m'.x + n' - y)^2. Parameters (one layer): "weight" [1, dims]
// and "bias" [1], both starting at zero (the problem is convex, so no symmetry to break).
// evaluate() reports the test MSE as loss and the coefficient of determination R^2 = 1 - SSE / SST as "accuracy":
// 1 for a perfect fit, 0 for predicting the mean, about 1 - noise^2 / (|m|^2 + noise^2) at the optimum.
#pragma once

#include <vector>

#include "core/train/workload.h"

namespace terse::workloads {

struct LinearRegressionOptions {
  int64_t dims = 10;
  double noise = 0.1;
  int64_t num_train = 10000;
  int64_t num_test = 2000;
  uint64_t seed = 1;
};

class LinearRegressionWorkload final : public train::Workload {
 public:
  explicit LinearRegressionWorkload(const LinearRegressionOptions& options);

  std::string_view name() const override { return "linear_regression"; }
  int64_t numTrainExamples() const override { return options_.num_train; }
  double forwardBackward(std::span<const int64_t> batch, const train::LayerReadyFn& on_layer_ready) override;
  train::EvalResult evaluate(int64_t max_examples = 0) override;

  // The generating m and n, for tests and reports.
  const std::vector<float>& trueWeights() const { return true_m_; }
  float trueBias() const { return true_n_; }

 private:
  double predict(const float* x) const;

  LinearRegressionOptions options_;
  std::vector<float> true_m_;
  float true_n_ = 0.0f;
  std::vector<float> train_x_, train_y_, test_x_, test_y_;
  std::vector<double> grad_acc_;  // sized once, reused every step
};

}  // namespace terse::workloads
