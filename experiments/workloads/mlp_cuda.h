// The MLP (and, with no hidden layers, softmax regression) on a CUDA device: mlp.h's model -- the same tensors, shapes,
// layer numbering and, for a seed, the same initial values (mlpParams) -- computed with cuBLAS GEMMs and the kernels
// of device_ops.h on the instance's stream, with the data set, activations, device_value and device_grad in device
// memory (cuda_workload.h has the ordering contract and what is shared). Built only with CUDA (TERSE_HAVE_CUDA);
// makeWorkload returns it for options.device >= 0.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/common/device_buffer.h"
#include "experiments/workloads/cuda_workload.h"
#include "experiments/workloads/dataset.h"

namespace terse::workloads {

class MlpCudaWorkload final : public CudaWorkload {
 public:
  // Throws InvalidArgument as MlpWorkload does, DeviceError when the device cannot be used.
  MlpCudaWorkload(std::shared_ptr<const DataSplit> data, std::vector<int64_t> hidden, uint64_t seed, int device,
                  std::string name = "mlp");
  ~MlpCudaWorkload() override;

  std::string_view name() const override { return name_; }
  int64_t numTrainExamples() const override { return hostData().train.num_examples; }
  double forwardBackward(std::span<const int64_t> batch, const train::LayerReadyFn& on_layer_ready) override;
  bool gatesLayers() const override { return true; }
  // On the device in chunks of kEvalChunk examples, one synchronization at the end.
  train::EvalResult evaluate(int64_t max_examples = 0) override;

  static constexpr int64_t kEvalChunk = 500;  // MlpWorkload's: bounds the activation buffers evaluation needs

 private:
  void reserve(int64_t batch);
  // Forward over `input` [batch x widths_[0]] (device memory); the logits end in acts_.back().
  void forward(const float* input, int64_t batch);
  const float* layerInput(std::size_t l, const float* input) const;

  std::string name_;
  std::vector<int64_t> widths_;  // input, hidden..., classes
  int64_t capacity_ = 0;         // rows the buffers hold
  // acts_[0]: the gathered training batch; acts_[l], l >= 1: output of layer l-1 (post-ReLU); acts_.back(): logits.
  std::vector<cuda::DeviceBuffer> acts_;
  cuda::DeviceBuffer delta_, delta_prev_;  // gradient w.r.t. the current layer's output / input
  cuda::DeviceBuffer labels_;
};

}  // namespace terse::workloads
