// Short SGD runs through the Workload interface with a ShardSampler, as a trainer would drive them: linear regression
// recovers its generating m and n; the MLP learns a 2000-example slice of the real Fashion-MNIST (skipped when the
// Debian package is not installed).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/train/shard_sampler.h"
#include "core/train/workload.h"
#include "experiments/workloads/fashion_mnist.h"
#include "experiments/workloads/linear_regression.h"
#include "experiments/workloads/workloads.h"

namespace terse::workloads {
namespace {

// Plain SGD over `epochs` epochs of one worker's shard; returns the number of steps taken.
int64_t sgd(train::Workload& w, const train::ShardSampler& sampler, int64_t epochs, int64_t batch_size, float lr) {
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    for (const std::vector<int64_t>& batch : sampler.epochBatches(epoch, batch_size)) {
      w.forwardBackward(batch, [&](int, std::span<const std::size_t> tensors) {
        for (std::size_t t : tensors) {
          train::ParamTensor& p = w.params()[t];
          for (std::size_t i = 0; i < p.numel(); ++i) p.value[i] -= lr * p.grad[i];
        }
      });
      ++steps;
    }
  }
  return steps;
}

TEST(Training, LinearRegressionRecoversMAndN) {
  WorkloadOptions o;
  o.dims = 8;
  o.noise = 0.1;
  o.num_train = 4000;
  o.seed = 17;
  auto w = makeWorkload("linear_regression", o, nullptr);
  auto& lr = dynamic_cast<LinearRegressionWorkload&>(*w);
  const double r2_before = w->evaluate().accuracy;
  // Rank 1 of 2: half the data is plenty for a 9-parameter model.
  sgd(*w, train::ShardSampler(o.num_train, 1, 2, 5), 10, 16, 0.02f);
  for (std::size_t d = 0; d < lr.trueWeights().size(); ++d)
    EXPECT_NEAR(w->params()[0].value[d], lr.trueWeights()[d], 0.02) << "m[" << d << "]";
  EXPECT_NEAR(w->params()[1].value[0], lr.trueBias(), 0.02);
  const train::EvalResult after = w->evaluate();
  EXPECT_LT(r2_before, 0.1);
  EXPECT_GT(after.accuracy, 0.99);
  EXPECT_NEAR(after.loss, o.noise * o.noise, 0.005);  // the noise floor
  EXPECT_EQ(after.num_examples, o.num_test);
}

TEST(Training, MlpLearnsFashionMnistSubset) {
  if (!std::filesystem::is_directory(kDefaultFashionMnistDir))
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << kDefaultFashionMnistDir
                 << " (apt-get install dataset-fashion-mnist); skipping the real-data run";
  const auto start = std::chrono::steady_clock::now();
  FashionMnistOptions fo;
  fo.max_train = 2000;
  fo.standardize = true;
  auto data = std::make_shared<const DataSplit>(loadFashionMnist(fo));
  ASSERT_EQ(data->train.num_examples, 2000);
  ASSERT_EQ(data->test.num_examples, 10000);
  ASSERT_EQ(data->train.dims, 784);
  const auto loaded = std::chrono::steady_clock::now();

  WorkloadOptions o;
  o.hidden = {256, 128};
  o.seed = 1;
  auto w = makeWorkload("mlp", o, data);
  const train::EvalResult before = w->evaluate();
  const int64_t steps = sgd(*w, train::ShardSampler(2000, 0, 1, 3), 6, 16, 0.05f);
  const auto trained = std::chrono::steady_clock::now();
  const train::EvalResult after = w->evaluate();
  const auto done = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf(
      "mlp on 2000 Fashion-MNIST examples: %lld steps, test accuracy %.4f -> %.4f, loss %.4f -> %.4f; "
      "load %.0f ms, train %.0f ms, evaluate 10000 %.0f ms\n",
      static_cast<long long>(steps), before.accuracy, after.accuracy, before.loss, after.loss, ms(start, loaded),
      ms(loaded, trained), ms(trained, done));
  EXPECT_EQ(steps, 6 * 125);
  EXPECT_LT(before.accuracy, 0.3);
  // About 0.80 on this machine (6 epochs of 125 steps); 0.75 leaves room for BLAS summation-order differences.
  EXPECT_GT(after.accuracy, 0.75);
  EXPECT_LT(after.loss, before.loss);
  EXPECT_EQ(after.num_examples, 10000);
  // evaluate leaves the gradients alone.
  std::vector<float> grads_after_train = w->params()[0].grad;
  w->evaluate(100);
  EXPECT_EQ(w->params()[0].grad, grads_after_train);
}

}  // namespace
}  // namespace terse::workloads
