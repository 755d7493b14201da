// experiments/workloads/mlp_cuda.h: mlp.cc's forward and backward, step for step, on the device.
#include <algorithm>
#include <utility>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "experiments/workloads/device_ops.h"
#include "experiments/workloads/mlp.h"
#include "experiments/workloads/mlp_cuda.h"

namespace terse::workloads {

MlpCudaWorkload::MlpCudaWorkload(std::shared_ptr<const DataSplit> data, std::vector<int64_t> hidden, uint64_t seed,
                                 int device, std::string name)
    : CudaWorkload(device), name_(std::move(name)), widths_(mlpWidths(data, hidden, name_)) {
  const cuda::DeviceGuard guard(device);
  attachData(data);
  registerParams(mlpParams(widths_, seed));
  acts_.resize(widths_.size());
}

MlpCudaWorkload::~MlpCudaWorkload() {
  releaseOnDevice([&] {
    acts_.clear();
    delta_ = {};
    delta_prev_ = {};
    labels_ = {};
  });
}

void MlpCudaWorkload::reserve(int64_t batch) {
  reserveLoss(batch);
  if (batch <= capacity_) return;
  capacity_ = batch;
  for (std::size_t l = 0; l < acts_.size(); ++l) grow<float>(acts_[l], batch * widths_[l]);
  const int64_t widest = *std::max_element(widths_.begin() + 1, widths_.end());
  grow<float>(delta_, batch * widest);
  grow<float>(delta_prev_, batch * widest);
  grow<int32_t>(labels_, batch);
}

const float* MlpCudaWorkload::layerInput(std::size_t l, const float* input) const {
  return l == 0 ? input : acts_[l].as<const float>();
}

void MlpCudaWorkload::forward(const float* input, int64_t batch) {
  const std::size_t layers = widths_.size() - 1;
  for (std::size_t l = 0; l < layers; ++l) {
    const int64_t in = widths_[l], out = widths_[l + 1];
    // Before the first kernel that reads the layer's values is enqueued: the trainer's gate returns once the previous
    // step's update of the layer is complete on the device (gatesLayers).
    awaitLayer(static_cast<int>(l));
    const train::ParamTensor& w = params()[2 * l];
    const train::ParamTensor& b = params()[2 * l + 1];
    float* y = acts_[l + 1].as<float>();
    // Broadcast the bias first so the GEMM accumulates onto it (beta = 1), as on the CPU.
    device::broadcastBias(b.device_value, out, 1, batch * out, y, stream());
    device::gemm(cublas(), false, true, batch, out, in, 1.0f, layerInput(l, input), w.device_value, 1.0f, y);
    if (l + 1 < layers) device::relu(y, batch * out, stream());
  }
}

double MlpCudaWorkload::forwardBackward(std::span<const int64_t> batch_indices,
                                        const train::LayerReadyFn& on_layer_ready) {
  const cuda::DeviceGuard guard(device());
  const Dataset& train = hostData().train;
  checkBatch(batch_indices, train.num_examples);
  const auto batch = static_cast<int64_t>(batch_indices.size());
  reserve(batch);
  const int64_t* idx = uploadBatch(batch_indices);
  device::gatherRows(deviceData().train().x(), deviceData().train().y(), idx, batch, widths_[0], acts_[0].as<float>(),
                     labels_.as<int32_t>(), stream());
  forward(acts_[0].as<const float>(), batch);

  const int layers = static_cast<int>(widths_.size()) - 1;
  device::softmaxCrossEntropy(acts_.back().as<const float>(), labels_.as<const int32_t>(), batch, widths_.back(),
                              1.0f / static_cast<float>(batch), delta_.as<float>(), exampleLoss(), exampleCorrect(),
                              stream());
  enqueueLossSum(batch);
  for (int l = layers - 1; l >= 0; --l) {
    const auto ul = static_cast<std::size_t>(l);
    const int64_t in = widths_[ul], out = widths_[ul + 1];
    train::ParamTensor& w = params()[2 * ul];
    train::ParamTensor& b = params()[2 * ul + 1];
    // dW = delta^T x, db = column sums of delta.
    device::gemm(cublas(), true, false, out, in, batch, 1.0f, delta_.as<const float>(),
                 layerInput(ul, acts_[0].as<const float>()), 0.0f, w.device_grad);
    device::columnSums(delta_.as<const float>(), batch, out, b.device_grad, stream());
    // delta_prev = delta W, enqueued before the layer's event: once reported, W may be updated in place.
    if (l > 0)
      device::gemm(cublas(), false, false, batch, in, out, 1.0f, delta_.as<const float>(), w.device_value, 0.0f,
                   delta_prev_.as<float>());
    layerDone(l);
    // Layer l's work is queued; report layer l+1 (waiting for its event) while the GPU runs it.
    if (l + 1 < layers) reportWhenDone(on_layer_ready, l + 1);
    if (l == 0) break;
    // The ReLU of layer l-1's output (acts_[l] > 0) masks the gradient flowing into it.
    device::reluMask(acts_[ul].as<const float>(), delta_prev_.as<float>(), batch * in, stream());
    std::swap(delta_, delta_prev_);
  }
  reportWhenDone(on_layer_ready, 0);
  synchronize();  // every device_grad complete, and the loss sum on the host
  return lossSum() / static_cast<double>(batch);
}

train::EvalResult MlpCudaWorkload::evaluate(int64_t max_examples) {
  return evaluateInChunks(
      max_examples, kEvalChunk, widths_.back(), [this](int64_t rows) { reserve(rows); },
      [this](const float* x, int64_t rows) {
        forward(x, rows);
        return acts_.back().as<const float>();
      });
}

}  // namespace terse::workloads
