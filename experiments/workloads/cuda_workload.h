// What the CUDA workloads (MlpCudaWorkload, CnnCudaWorkload) share: a device, a non-blocking stream every kernel and
// GEMM of the instance runs on, one cuBLAS handle bound to it, the parameters' device memory, the shared device copy
// of the data set (device_data.h), the batch-index upload, the on-device loss sum, and the per-layer events that let
// backward report layer L while the GPU already computes layer L-1. Included only by CUDA builds (TERSE_HAVE_CUDA).
//
// The ordering contract with the trainer is core/train/workload.h's "Device workloads" section. Here it means:
//  - forward calls awaitLayer(l) on the host before it enqueues the first kernel that reads layer l's device_value;
//  - backward enqueues everything that reads layer l's values or writes its grads, records the layer's event, and
//    reports layer l only after that event completed (reportWhenDone), so the callee may read device_grad from any
//    stream; a step enqueues layer l-1's work before it waits for layer l, so the GPU is not idle while the callee
//    runs. Once reported, a layer's tensors are not touched again in the step;
//  - forwardBackward returns after its stream is synchronized: every device_grad is complete, and the loss (summed on
//    the device, copied back to pinned memory) has reached the host. Without a callback that final synchronize is the
//    step's only host-device wait -- the price of returning the loss as a double; with one, the per-layer waits are
//    the synchronizations and the final one finds the stream already idle.
//
// Steady-state steps allocate nothing: activation buffers grow to the largest batch seen (as the CPU models' do), the
// pinned index staging likewise, and cuBLAS uses the workspace it allocated at cublasCreate.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/common/device_buffer.h"
#include "core/train/workload.h"
#include "experiments/workloads/dataset.h"
#include "experiments/workloads/device_data.h"
#include "experiments/workloads/nn_ops.h"

struct cublasContext;  // cublas_v2.h's cublasHandle_t; users of this header need not include cuBLAS

namespace terse::workloads {

namespace device {
struct LossTotals;
}

class CudaWorkload : public train::Workload {
 public:
  ~CudaWorkload() override;

  int device() const override { return device_; }
  void copyValuesToHost() override;
  void copyValuesToDevice() override;

 protected:
  // Creates the stream and the cuBLAS handle on `device` (TF32 off, see the .cu). Derived constructors then validate
  // their data set, make the device current (cuda::DeviceGuard) and call attachData and registerParams.
  explicit CudaWorkload(int device);

  // Takes the shared device copy of `data` (uploading it if this is the first user on the device).
  void attachData(const std::shared_ptr<const DataSplit>& data);

  // Registers the model's tensors (the CPU sibling's ParamSpecs: same names, shapes, layers, initial values), points
  // device_value/device_grad into one device allocation each, uploads the values and creates one event per layer.
  // Call once, from the derived constructor, with the device current.
  void registerParams(std::vector<ParamSpec> specs);

  cudaStream_t stream() const { return stream_->get(); }
  cublasContext* cublas() const { return cublas_; }
  const DataSplit& hostData() const { return data_->host(); }
  std::span<const int32_t> trainLabels() const override { return hostData().train.labels; }
  int numClasses() const override { return hostData().train.num_classes; }
  const DeviceDataSplit& deviceData() const { return *data_; }

  // Grows `buffer` to at least `elements` of T (reallocating on the stream, contents lost); a no-op once large enough,
  // which is what keeps steady-state steps allocation-free.
  template <class T>
  void grow(cuda::DeviceBuffer& buffer, int64_t elements) {
    growBytes(buffer, static_cast<std::size_t>(elements) * sizeof(T));
  }

  // Copies the batch's indices to the device through pinned staging (grown like the buffers) and returns them there.
  // Waits for the previous copy out of the staging first (normally long done: the previous step synchronized, but a
  // step that threw may have left it pending).
  const int64_t* uploadBatch(std::span<const int64_t> batch);

  // Per-example loss (double) and correct (int32) buffers of at least n entries, for device::softmaxCrossEntropy.
  void reserveLoss(int64_t n);
  double* exampleLoss() const { return example_loss_.as<double>(); }
  int32_t* exampleCorrect() const { return example_correct_.as<int32_t>(); }
  // Enqueues the sums of the first n per-example entries and their copy to pinned host memory; lossSum() and
  // correctSum() read them after the stream is synchronized.
  void enqueueLossSum(int64_t n);
  double lossSum() const;
  int64_t correctSum() const;

  // A classifier's evaluate(): the first max_examples (0: all) of the test set in chunks of `chunk` rows, read in
  // place on the device. reserve_rows(rows) sizes the model's buffers once for the largest chunk; forward_rows(x, rows)
  // enqueues the forward pass of `rows` examples starting at x and returns the logits (rows x classes). Losses and
  // hits are summed on the device; one synchronization at the end.
  train::EvalResult evaluateInChunks(int64_t max_examples, int64_t chunk, int64_t classes,
                                     const std::function<void(int64_t rows)>& reserve_rows,
                                     const std::function<const float*(const float* x, int64_t rows)>& forward_rows);

  // Records layer l's event on the stream after its last kernel; reportWhenDone waits for it and reports the layer
  // (without a callback it neither waits nor reports: the final synchronize covers it).
  void layerDone(int layer);
  void reportWhenDone(const train::LayerReadyFn& on_layer_ready, int layer);
  void synchronize() const { stream_->synchronize(); }

  // For derived destructors: runs `release` (e.g. resetting their buffers) with the device current, so the
  // stream-ordered frees happen on the right device. Never throws; a failure is logged.
  void releaseOnDevice(const std::function<void()>& release) noexcept;

 private:
  void growBytes(cuda::DeviceBuffer& buffer, std::size_t bytes);

  const int device_;
  std::shared_ptr<const DeviceDataSplit> data_;
  std::optional<cuda::Stream> stream_;  // optional: created with the device current, and destroyed likewise
  cublasContext* cublas_ = nullptr;
  cuda::DeviceBuffer values_, grads_;  // every tensor's device_value / device_grad, back to back
  cuda::DeviceBuffer example_loss_, example_correct_, totals_;
  cuda::PinnedBuffer host_totals_;  // the LossTotals the last enqueueLossSum copies back
  cuda::PinnedBuffer staging_;      // batch indices on their way to indices_
  cuda::DeviceBuffer indices_;
  std::optional<cuda::Event> staged_;  // after the last index copy: the pinned staging may be rewritten once it is done
  std::vector<cuda::Event> layer_done_;
};

}  // namespace terse::workloads
