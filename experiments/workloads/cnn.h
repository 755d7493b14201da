// A small convolutional classifier for single-channel images (LeNet-like, LeCun et al. 1998):
//   conv 5x5 1->8 (valid) -> ReLU -> max-pool 2 -> conv 5x5 8->16 (valid) -> ReLU -> max-pool 2 -> fc -> softmax CE.
// On 28x28 Fashion-MNIST: 28 -> 24 -> 12 -> 8 -> 4, fc 256 -> 10, 5,994 parameters (kept under 100k so a CPU worker
// steps fast; the constructor checks the bound). Other image sizes work when both conv outputs have even sides.
// Convolutions are im2col + GEMM (cblas_sgemm), one image at a time; backward is by hand and checked by a
// finite-difference test (tests/workloads).
//
// Layers: 0 = "conv1.weight" [8,1,5,5] + "conv1.bias", 1 = "conv2.weight" [16,8,5,5] + "conv2.bias",
// 2 = "fc.weight" [10, 16*h*w] + "fc.bias". He-normal for the convolutions, Glorot-uniform for fc, zero biases.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/train/workload.h"
#include "experiments/workloads/dataset.h"
#include "experiments/workloads/nn_ops.h"

namespace terse::workloads {

class CnnWorkload final : public train::Workload {
 public:
  static constexpr int64_t kKernel = 5;
  static constexpr int64_t kConv1Channels = 8;
  static constexpr int64_t kConv2Channels = 16;
  static constexpr std::size_t kMaxParameters = 100000;

  CnnWorkload(std::shared_ptr<const DataSplit> data, uint64_t seed);

  std::string_view name() const override { return "cnn"; }
  int64_t numTrainExamples() const override { return data_->train.num_examples; }
  double forwardBackward(std::span<const int64_t> batch, const train::LayerReadyFn& on_layer_ready) override;
  bool gatesLayers() const override { return true; }
  train::EvalResult evaluate(int64_t max_examples = 0) override;
  // A convolution applies its weights at every output position: the dense count times the positions.
  train::LayerFlops layerFlops(int layer) const override;

 private:
  void reserve(int64_t batch);
  void forward(int64_t batch);  // input in x_, logits in logits_

  std::shared_ptr<const DataSplit> data_;
  int64_t h0_, w0_, h1_, w1_, hp1_, wp1_, h2_, w2_, hp2_, wp2_, fc_in_, classes_;
  int64_t capacity_ = 0;
  // Per-batch activations, one image after another.
  std::vector<float> x_, col1_, z1_, p1_, col2_, z2_, p2_, logits_;
  std::vector<int32_t> arg1_, arg2_, labels_;
  // Backward scratch.
  std::vector<float> dlogits_, dp2_, dz2_, dcol2_, dp1_, dz1_;
};

// The CNN's image and feature-map sides on a data set: input h0 x w0, conv1 output h1 x w1, pool1 hp1 x wp1, conv2
// h2 x w2, pool2 hp2 x wp2, fc_in = kConv2Channels * hp2 * wp2 inputs to the classifier of `classes` outputs.
struct CnnGeometry {
  int64_t h0, w0, h1, w1, hp1, wp1, h2, w2, hp2, wp2, fc_in, classes;
};
// Validates the data set (single-channel images, train and test alike, even-sided conv outputs) and computes the
// sides; throws InvalidArgument. CnnWorkload and CnnCudaWorkload share it.
CnnGeometry cnnGeometry(const std::shared_ptr<const DataSplit>& data);
// The CNN's parameters in params() order with their initial values for `seed` (see the top of this file): one
// definition, so the host and device models start from the same weights. Throws InvalidArgument when the count
// reaches CnnWorkload::kMaxParameters.
std::vector<ParamSpec> cnnParams(const CnnGeometry& g, uint64_t seed);

}  // namespace terse::workloads
