#include "experiments/workloads/linear_regression.h"

#include <algorithm>

#include "core/common/error.h"
#include "core/train/seeded_rng.h"
#include "experiments/workloads/nn_ops.h"

namespace terse::workloads {

LinearRegressionWorkload::LinearRegressionWorkload(const LinearRegressionOptions& options) : options_(options) {
  TERSE_CHECK(options.dims >= 1, InvalidArgument, "linear_regression: dims must be >= 1, got " << options.dims);
  TERSE_CHECK(options.noise >= 0.0, InvalidArgument, "linear_regression: noise must be >= 0, got " << options.noise);
  TERSE_CHECK(options.num_train >= 1 && options.num_test >= 1, InvalidArgument,
              "linear_regression: num_train and num_test must be >= 1, got " << options.num_train << " and "
                                                                             << options.num_test);
  addParam("weight", {1, options.dims}, 0);
  addParam("bias", {1}, 0);
  // Separate streams for the ground truth and each split, so changing num_train does not change m, n or the test set.
  train::SeededRng truth(options.seed, 0);
  true_m_.resize(static_cast<std::size_t>(options.dims));
  for (float& v : true_m_) v = static_cast<float>(truth.normal());
  true_n_ = static_cast<float>(truth.normal());
  auto generate = [&](uint64_t stream, int64_t count, std::vector<float>& x, std::vector<float>& y) {
    train::SeededRng rng(options.seed, stream);
    x.resize(static_cast<std::size_t>(count * options.dims));
    y.resize(static_cast<std::size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      double target = true_n_;
      for (int64_t d = 0; d < options.dims; ++d) {
        const auto v = static_cast<float>(rng.normal());
        x[static_cast<std::size_t>(i * options.dims + d)] = v;
        target += static_cast<double>(true_m_[static_cast<std::size_t>(d)]) * v;
      }
      y[static_cast<std::size_t>(i)] = static_cast<float>(target + options.noise * rng.normal());
    }
  };
  generate(1, options.num_train, train_x_, train_y_);
  generate(2, options.num_test, test_x_, test_y_);
}

double LinearRegressionWorkload::predict(const float* x) const {
  const std::vector<float>& m = params()[0].value;
  double s = params()[1].value[0];
  for (std::size_t d = 0; d < m.size(); ++d) s += static_cast<double>(m[d]) * x[d];
  return s;
}

double LinearRegressionWorkload::forwardBackward(std::span<const int64_t> batch,
                                                 const train::LayerReadyFn& on_layer_ready) {
  checkBatch(batch, options_.num_train);
  const auto dims = static_cast<std::size_t>(options_.dims);
  // Accumulate in double: the gradient is a sum over the batch and the tests compare it with finite differences.
  std::vector<double>& gw = grad_acc_;
  gw.assign(dims + 1, 0.0);
  double loss = 0.0;
  for (int64_t i : batch) {
    const float* x = train_x_.data() + static_cast<std::size_t>(i) * dims;
    const double r = predict(x) - train_y_[static_cast<std::size_t>(i)];
    loss += r * r;
    for (std::size_t d = 0; d < dims; ++d) gw[d] += r * x[d];
    gw[dims] += r;
  }
  const double scale = 2.0 / static_cast<double>(batch.size());
  auto p = params();
  for (std::size_t d = 0; d < dims; ++d) p[0].grad[d] = static_cast<float>(gw[d] * scale);
  p[1].grad[0] = static_cast<float>(gw[dims] * scale);
  reportLayer(on_layer_ready, 0);
  return loss / static_cast<double>(batch.size());
}

train::EvalResult LinearRegressionWorkload::evaluate(int64_t max_examples) {
  const int64_t n = max_examples > 0 ? std::min(max_examples, options_.num_test) : options_.num_test;
  const auto dims = static_cast<std::size_t>(options_.dims);
  double mean = 0.0;
  for (int64_t i = 0; i < n; ++i) mean += test_y_[static_cast<std::size_t>(i)];
  mean /= static_cast<double>(n);
  double sse = 0.0, sst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double y = test_y_[static_cast<std::size_t>(i)];
    const double r = predict(test_x_.data() + static_cast<std::size_t>(i) * dims) - y;
    sse += r * r;
    sst += (y - mean) * (y - mean);
  }
  return {sse / static_cast<double>(n), sst > 0.0 ? 1.0 - sse / sst : 0.0, n};
}

}  // namespace terse::workloads
