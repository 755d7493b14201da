// The CNN on a CUDA device: cnn.h's model -- the same tensors, shapes, layer numbering and, for a seed, the same
// initial values (cnnParams) -- computed on the instance's stream with cuBLAS and device_ops.h's kernels, the data
// set, activations, device_value and device_grad in device memory (cuda_workload.h has the ordering contract). Where
// the CPU convolves one image at a time, each convolution here is one GEMM over the whole batch (device_ops.h's CNHW
// layout), and so is each weight gradient. Built only with CUDA (TERSE_HAVE_CUDA); makeWorkload returns it for
// options.device >= 0.
#pragma once

#include <memory>

#include "core/common/device_buffer.h"
#include "experiments/workloads/cnn.h"
#include "experiments/workloads/cuda_workload.h"
#include "experiments/workloads/dataset.h"

namespace terse::workloads {

class CnnCudaWorkload final : public CudaWorkload {
 public:
  // Throws InvalidArgument as CnnWorkload does, Unsupported for hidden layers or dropout (not on the device yet),
  // DeviceError when the device cannot be used.
  CnnCudaWorkload(std::shared_ptr<const DataSplit> data, const CnnShape& shape, uint64_t seed, int device);
  ~CnnCudaWorkload() override;

  std::string_view name() const override { return "cnn"; }
  int64_t numTrainExamples() const override { return hostData().train.num_examples; }
  double forwardBackward(std::span<const int64_t> batch, const train::LayerReadyFn& on_layer_ready) override;
  bool gatesLayers() const override { return true; }
  // On the device in chunks of kEvalChunk images, one synchronization at the end.
  train::EvalResult evaluate(int64_t max_examples = 0) override;

  static constexpr int64_t kEvalChunk = 256;  // CnnWorkload's: bounds the activation buffers evaluation needs

 private:
  void reserve(int64_t batch);
  // Forward over `input` [batch x h0 w0] (device memory); logits in logits_.
  void forward(const float* input, int64_t batch);

  CnnGeometry g_;
  int64_t capacity_ = 0;
  // Activations: x_ the gathered batch, col1_/col2_ the unfolded inputs [(c k k) x (batch h w)], z1_/z2_ the conv
  // outputs after ReLU (CNHW), p1_/p2_ the pooled maps (NCHW) with their arg-max indices into z, logits_.
  cuda::DeviceBuffer x_, col1_, z1_, p1_, arg1_, col2_, z2_, p2_, arg2_, logits_, labels_;
  // Backward scratch: dcol2_ [(c1 k k) x (batch h2 w2)], the rest shaped like the activations they differentiate.
  cuda::DeviceBuffer dlogits_, dp2_, dz2_, dcol2_, dp1_, dz1_;
};

}  // namespace terse::workloads
