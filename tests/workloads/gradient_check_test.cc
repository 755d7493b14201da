// The hand-written backward passes against central finite differences, the layer-ready callback contract, seeded
// initialization, and the models' parameter counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/train/workload.h"
#include "experiments/workloads/cnn.h"
#include "experiments/workloads/workloads.h"
#include "tests/workloads/workloads_test_util.h"

namespace terse::workloads {
namespace {

using testing::randomSplit;

struct GradCase {
  std::string name;
  int64_t rows, cols;
  std::vector<int64_t> hidden;
  std::vector<int64_t> channels = {};  // cnn: conv_channels (empty: the defaults)
};

std::unique_ptr<train::Workload> makeTiny(const GradCase& c, uint64_t seed = 3) {
  WorkloadOptions o;
  o.seed = seed;
  o.hidden = c.hidden;
  o.cnn.hidden = c.hidden;
  if (!c.channels.empty()) {
    o.cnn.conv1_channels = c.channels[0];
    o.cnn.conv2_channels = c.channels[1];
  }
  o.dims = 6;
  o.num_train = 50;
  o.num_test = 20;
  return makeWorkload(c.name, o, c.name == "linear_regression" ? nullptr : randomSplit(40, c.rows, c.cols, 5, 11));
}

class GradientCheck : public ::testing::TestWithParam<GradCase> {};

void checkGradients(const GradCase& c, uint64_t seed);

// Central differences on f32 parameters: the loss is accumulated in double but the activations are f32, so eps
// cannot be tiny (rounding in the logits, ~1e-7 relative, is divided by 2 eps), and a large eps lets a ReLU or a
// max-pool winner switch inside [x - eps, x + eps] (a kink: with random inputs the CNN has thousands of them near
// any point). So each element is tried at a few eps and passes when the central difference, or one of the one-sided
// differences, agrees within 2% relative + 2e-4 absolute: a kink at distance d spoils the central difference for
// eps > d, and for a kink closer than the smallest eps the analytic gradient is one of the one-sided derivatives
// (which one depends on the tie-break). A wrong gradient (a missing factor, a transposed index) is off everywhere.
TEST_P(GradientCheck, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  for (uint64_t seed : {3, 4, 5, 6}) checkGradients(c, seed);
}

void checkGradients(const GradCase& c, uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto w = makeTiny(c, seed);
  const std::vector<int64_t> batch = {0, 7, 13};
  const double loss = w->forwardBackward(batch, nullptr);
  std::vector<std::vector<float>> analytic;
  for (const auto& p : w->params()) analytic.push_back(p.grad);

  int checked = 0, nonzero = 0;
  for (std::size_t t = 0; t < w->params().size(); ++t) {
    train::ParamTensor& p = w->params()[t];
    // Up to 40 elements per tensor, spread over it, so every tensor's indexing is exercised.
    const std::size_t stride = std::max<std::size_t>(1, p.numel() / 40);
    for (std::size_t i = 0; i < p.numel(); i += stride) {
      const double a = analytic[t][i];
      std::string tried;
      bool ok = false;
      for (float eps : {3e-3f, 1e-3f, 3e-4f}) {
        const float saved = p.value[i];
        p.value[i] = saved + eps;
        const double up = w->forwardBackward(batch, nullptr);
        p.value[i] = saved - eps;
        const double down = w->forwardBackward(batch, nullptr);
        p.value[i] = saved;
        const double e = eps;
        for (double numeric : {(up - down) / (2.0 * e), (up - loss) / e, (loss - down) / e}) {
          ok = ok || std::abs(a - numeric) <= 2e-4 + 2e-2 * std::max(std::abs(a), std::abs(numeric));
        }
        tried += " " + std::to_string((up - down) / (2.0 * e));
        if (ok) break;
      }
      EXPECT_TRUE(ok) << c.name << " " << p.name << "[" << i << "]: analytic " << a
                      << ", numeric at eps 3e-3, 1e-3, 3e-4:" << tried;
      ++checked;
      if (std::abs(a) > 1e-6) ++nonzero;
    }
  }
  EXPECT_GT(checked, 0);
  EXPECT_GT(nonzero, checked / 4) << "almost all gradients are zero: the check would prove nothing";
}

// The callback fires once per layer, last layer first, with every tensor exactly once, and what it sees is final.
TEST_P(GradientCheck, LayerReadyCallbackOrder) {
  auto w = makeTiny(GetParam());
  std::vector<int> layers;
  std::multiset<std::size_t> tensors;
  std::vector<std::vector<float>> seen(w->params().size());
  const std::vector<int64_t> batch = {1, 2, 3, 4};
  w->forwardBackward(batch, [&](int layer, std::span<const std::size_t> ts) {
    layers.push_back(layer);
    for (std::size_t t : ts) {
      tensors.insert(t);
      EXPECT_EQ(w->params()[t].layer, layer);
      seen[t] = w->params()[t].grad;
    }
  });
  std::vector<int> expected(static_cast<std::size_t>(w->numLayers()));
  for (int l = 0; l < w->numLayers(); ++l) expected[static_cast<std::size_t>(l)] = w->numLayers() - 1 - l;
  EXPECT_EQ(layers, expected);
  ASSERT_EQ(tensors.size(), w->params().size());
  for (std::size_t t = 0; t < w->params().size(); ++t) {
    EXPECT_EQ(tensors.count(t), 1u) << "tensor " << t;
    EXPECT_EQ(seen[t], w->params()[t].grad) << w->params()[t].name << " changed after its layer was reported";
  }
  // Layers are non-decreasing in params() order.
  for (std::size_t t = 1; t < w->params().size(); ++t) EXPECT_LE(w->params()[t - 1].layer, w->params()[t].layer);
}

// After a layer is reported the workload no longer reads it: a callback that updates the reported layer's values in
// place (as an optimizer overlapping backward would) leaves every gradient as it was.
TEST_P(GradientCheck, ReportedLayersMayBeUpdatedInPlace) {
  auto clean = makeTiny(GetParam()), scribbled = makeTiny(GetParam());
  const std::vector<int64_t> batch = {2, 3, 5};
  clean->forwardBackward(batch, nullptr);
  scribbled->forwardBackward(batch, [&](int, std::span<const std::size_t> ts) {
    for (std::size_t t : ts)
      for (float& v : scribbled->params()[t].value) v = v * -3.0f + 1.0f;
  });
  for (std::size_t t = 0; t < clean->params().size(); ++t)
    EXPECT_EQ(clean->params()[t].grad, scribbled->params()[t].grad) << clean->params()[t].name;
}

TEST_P(GradientCheck, SeededInitIsDeterministic) {
  auto a = makeTiny(GetParam(), 5), b = makeTiny(GetParam(), 5), c = makeTiny(GetParam(), 6);
  bool differs = false;
  for (std::size_t t = 0; t < a->params().size(); ++t) {
    EXPECT_EQ(a->params()[t].value, b->params()[t].value);
    differs = differs || a->params()[t].value != c->params()[t].value;
  }
  // linear_regression starts at zero; its seed changes the data instead.
  if (GetParam().name != "linear_regression") {
    EXPECT_TRUE(differs);
  }
  EXPECT_EQ(a->forwardBackward(std::vector<int64_t>{0, 1}, nullptr),
            b->forwardBackward(std::vector<int64_t>{0, 1}, nullptr));
}

TEST_P(GradientCheck, RejectsBadBatches) {
  auto w = makeTiny(GetParam());
  EXPECT_THROW(w->forwardBackward({}, nullptr), InvalidArgument);
  EXPECT_THROW(w->forwardBackward(std::vector<int64_t>{0, w->numTrainExamples()}, nullptr), InvalidArgument);
  EXPECT_THROW(w->forwardBackward(std::vector<int64_t>{-1}, nullptr), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Workloads, GradientCheck,
                         ::testing::Values(GradCase{"linear_regression", 0, 0, {}}, GradCase{"softmax", 3, 4, {}},
                                           GradCase{"mlp", 3, 4, {7, 5}}, GradCase{"cnn", 16, 16, {}},
                                           GradCase{"cnn", 16, 28, {}}, GradCase{"cnn", 16, 16, {6, 5}, {3, 5}}),
                         [](const ::testing::TestParamInfo<GradCase>& param_info) {
                           return param_info.param.name + "_" + std::to_string(param_info.index);
                         });

TEST(Workloads, ParameterCountsOnFashionMnistShapes) {
  auto data = randomSplit(4, 28, 28, 10, 1);
  WorkloadOptions o;
  EXPECT_EQ(makeWorkload("softmax", o, data)->numParameters(), 784u * 10 + 10);
  EXPECT_EQ(makeWorkload("mlp", o, data)->numParameters(), (784u * 256 + 256) + (256u * 128 + 128) + (128u * 10 + 10));
  auto cnn = makeWorkload("cnn", o, data);
  EXPECT_EQ(cnn->numParameters(), (8u * 25 + 8) + (16u * 8 * 25 + 16) + (10u * 256 + 10));
  EXPECT_LT(cnn->numParameters(), CnnWorkload::kMaxParameters);
  EXPECT_EQ(cnn->numLayers(), 3);
  EXPECT_EQ(cnn->params()[4].name, "fc.weight");
  EXPECT_EQ(cnn->params()[4].shape, (std::vector<int64_t>{10, 256}));
}

// workload.conv_channels and hidden_sizes reach the model: the count is the hand count for the shape asked for, and
// the documented Fashion-MNIST configuration (experiments/configs/cnn_fashion_mnist.textproto) stays under 100k.
TEST(Workloads, CnnChannelsAndHiddenWidthsSetTheParameterCount) {
  auto data = randomSplit(4, 28, 28, 10, 1);
  WorkloadOptions o;
  o.cnn.conv1_channels = 32;
  o.cnn.conv2_channels = 64;
  auto wide = makeWorkload("cnn", o, data);
  EXPECT_EQ(wide->numParameters(), (32u * 25 + 32) + (64u * 32 * 25 + 64) + (10u * 64 * 16 + 10));
  o.cnn.conv1_channels = 16;
  o.cnn.conv2_channels = 32;
  o.cnn.hidden = {64};
  auto hidden = makeWorkload("cnn", o, data);
  EXPECT_EQ(hidden->numParameters(), (16u * 25 + 16) + (32u * 16 * 25 + 32) + (64u * 32 * 16 + 64) + (10u * 64 + 10));
  EXPECT_EQ(hidden->numLayers(), 4);
  EXPECT_EQ(hidden->params()[4].name, "hidden0.weight");
  EXPECT_EQ(hidden->params()[6].name, "fc.weight");
  EXPECT_EQ(hidden->params()[6].shape, (std::vector<int64_t>{10, 64}));
  // Past the bound: an error naming the count, before anything is allocated.
  o.cnn.hidden = {};
  o.cnn.conv2_channels = 256;
  try {
    makeWorkload("cnn", o, data);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("conv_channels [16, 256]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("over the 100000"), std::string::npos) << e.what();
  }
  o.cnn.conv2_channels = 0;
  EXPECT_THROW(makeWorkload("cnn", o, data), InvalidArgument);
}

// Dropout draws a new mask per training pass (so two passes over one batch differ), reproducibly for a seed, and
// leaves evaluation alone.
TEST(Workloads, CnnDropoutMasksTrainingOnly) {
  auto data = randomSplit(40, 16, 16, 5, 11);
  WorkloadOptions o;
  o.cnn.hidden = {12};
  o.cnn.dropout = 0.5;
  auto a = makeWorkload("cnn", o, data), b = makeWorkload("cnn", o, data);
  const std::vector<int64_t> batch = {0, 1, 2, 3};
  const double first = a->forwardBackward(batch, nullptr);
  EXPECT_NE(first, a->forwardBackward(batch, nullptr));
  EXPECT_EQ(first, b->forwardBackward(batch, nullptr));
  const train::EvalResult e1 = a->evaluate(), e2 = a->evaluate();
  EXPECT_EQ(e1.loss, e2.loss);
  o.cnn.dropout = 1;
  EXPECT_THROW(makeWorkload("cnn", o, data), InvalidArgument);
}

TEST(Workloads, FactoryErrors) {
  WorkloadOptions o;
  try {
    makeWorkload("resnet", o, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unknown workload 'resnet' (available: linear_regression, softmax, mlp, cnn, glove)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(makeWorkload("mlp", o, nullptr), InvalidArgument);
  // 12x12 images leave no room for the second convolution.
  EXPECT_THROW(makeWorkload("cnn", o, randomSplit(4, 12, 12, 10, 1)), InvalidArgument);
  o.hidden = {0};
  EXPECT_THROW(makeWorkload("mlp", o, randomSplit(4, 3, 4, 10, 1)), InvalidArgument);
}

}  // namespace
}  // namespace terse::workloads
