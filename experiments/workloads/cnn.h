// A small convolutional classifier for single-channel images (LeNet-like, LeCun et al. 1998):
//   conv 5x5 1->C1 (valid) -> ReLU -> max-pool 2 -> conv 5x5 C1->C2 (valid) -> ReLU -> max-pool 2
//   -> [fc -> ReLU -> dropout] per hidden width -> fc -> softmax CE.
// C1, C2 are the config's workload.conv_channels (default 8, 16), the hidden widths its workload.hidden_sizes (default
// none) and the dropout probability workload.dropout (default 0). On 28x28 Fashion-MNIST: 28 -> 24 -> 12 -> 8 -> 4;
// the default model is fc 256 -> 10, 5,994 parameters. Every shape is kept under 100k parameters (the constructor
// checks the bound) so a CPU worker steps fast. Other image sizes work when both conv outputs have even sides.
// Convolutions are im2col + GEMM (nn_ops.h's gemm), one image at a time; backward is by hand and checked by a
// finite-difference test (tests/workloads).
//
// Dropout (Srivastava et al. 2014), inverted: in training each hidden unit is kept with probability 1 - p and scaled by
// 1 / (1 - p), so evaluation uses the weights as they are. The masks come from a stream keyed by the seed and the
// number of forward passes so far, so a replica's masks are the same on every run of a seed (and the same on every
// replica: each sees other examples, and the averaged gradient is still an unbiased dropout gradient).
//
// Layers: 0 = "conv1.weight" [C1,1,5,5] + "conv1.bias", 1 = "conv2.weight" [C2,C1,5,5] + "conv2.bias", then one layer
// per hidden width, "hidden<i>.weight" [H_i, in] + "hidden<i>.bias" (i from 0), and last "fc.weight" [classes, in] +
// "fc.bias". He-normal for the convolutions and hidden layers, Glorot-uniform for fc, zero biases.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/train/workload.h"
#include "experiments/workloads/dataset.h"
#include "experiments/workloads/nn_ops.h"

namespace terse::workloads {

// What the config chooses of the CNN (experiment.proto's Workload): the two convolutions' output channels, the
// fully-connected hidden widths between them and the classifier, and the hidden layers' dropout probability.
struct CnnShape {
  int64_t conv1_channels = 8;  // the defaults give the 5,994-parameter model above
  int64_t conv2_channels = 16;
  std::vector<int64_t> hidden;
  double dropout = 0;
};

class CnnWorkload final : public train::Workload {
 public:
  static constexpr int64_t kKernel = 5;
  static constexpr std::size_t kMaxParameters = 100000;

  CnnWorkload(std::shared_ptr<const DataSplit> data, const CnnShape& shape, uint64_t seed);

  std::string_view name() const override { return "cnn"; }
  int64_t numTrainExamples() const override { return data_->train.num_examples; }
  std::span<const int32_t> trainLabels() const override { return data_->train.labels; }
  int numClasses() const override { return data_->train.num_classes; }
  double forwardBackward(std::span<const int64_t> batch, const train::LayerReadyFn& on_layer_ready) override;
  bool gatesLayers() const override { return true; }
  train::EvalResult evaluate(int64_t max_examples = 0) override;
  // A convolution applies its weights at every output position: the dense count times the positions.
  train::LayerFlops layerFlops(int layer) const override;

 private:
  void reserve(int64_t batch);
  void forward(int64_t batch, bool training);  // input in x_, logits in acts_.back(); dropout only when training

  // Fully-connected layer i (0 = the first after the convolutions) forward on acts_[i] [batch x widths_[i]] into
  // acts_[i + 1]; ReLU and dropout unless it is the classifier.
  void denseForward(std::size_t i, int64_t batch, bool training);

  std::shared_ptr<const DataSplit> data_;
  int64_t h0_, w0_, h1_, w1_, hp1_, wp1_, h2_, w2_, hp2_, wp2_, c1_, c2_, classes_;
  std::vector<int64_t> widths_;  // fully-connected widths: fc_in (C2 x pooled sides), hidden..., classes
  double dropout_ = 0;
  uint64_t seed_ = 0;
  uint64_t forward_passes_ = 0;  // training forwards so far: keys each pass's dropout masks
  int64_t capacity_ = 0;
  // Per-batch activations, one image after another. acts_[0] is the pooled conv2 output, acts_.back() the logits.
  std::vector<float> x_, col1_, z1_, p1_, col2_, z2_;
  std::vector<std::vector<float>> acts_, masks_;  // masks_[i]: hidden layer i's dropout scale per unit (0 or 1/(1-p))
  std::vector<int32_t> arg1_, arg2_, labels_;
  // Backward scratch.
  std::vector<float> delta_, delta_prev_, dz2_, dcol2_, dp1_, dz1_;
};

// The CNN's image and feature-map sides on a data set: input h0 x w0, conv1 output h1 x w1 with c1 channels, pool1
// hp1 x wp1, conv2 h2 x w2 with c2 channels, pool2 hp2 x wp2, fc_in = c2 * hp2 * wp2 inputs to the fully-connected
// layers (hidden widths, then the classifier of `classes` outputs).
struct CnnGeometry {
  int64_t h0, w0, h1, w1, hp1, wp1, h2, w2, hp2, wp2, fc_in, classes;
  int64_t c1, c2;
  std::vector<int64_t> hidden;
};
// Validates the data set (single-channel images, train and test alike, even-sided conv outputs) and the shape
// (positive channels and widths, dropout in [0, 1)) and computes the sides; throws InvalidArgument. CnnWorkload and
// CnnCudaWorkload share it.
CnnGeometry cnnGeometry(const std::shared_ptr<const DataSplit>& data, const CnnShape& shape = {});
// The CNN's parameters in params() order with their initial values for `seed` (see the top of this file): one
// definition, so the host and device models start from the same weights. Throws InvalidArgument when the count
// reaches CnnWorkload::kMaxParameters.
std::vector<ParamSpec> cnnParams(const CnnGeometry& g, uint64_t seed);

}  // namespace terse::workloads
