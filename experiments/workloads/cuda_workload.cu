// experiments/workloads/cuda_workload.h.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "experiments/workloads/cublas_check.h"
#include "experiments/workloads/cuda_workload.h"
#include "experiments/workloads/device_ops.h"

namespace terse::workloads {

CudaWorkload::CudaWorkload(int device) : device_(device) {
  const cuda::DeviceGuard guard(device_);
  stream_.emplace(cuda::Stream::Priority::kLow);
  staged_.emplace(cuda::Event::Timing::kDisabled);
  cublasHandle_t handle = nullptr;
  TERSE_CUBLAS_CHECK(cublasCreate(&handle));
  cublas_ = handle;  // owned from here on: the destructor frees it, and a throw below leaves no destructor to run
  try {
    // Every GEMM of the instance on its own stream, ordered with its kernels.
    TERSE_CUBLAS_CHECK(cublasSetStream(handle, stream()));
    // FP32 GEMMs in FP32. CUBLAS_DEFAULT_MATH never rounds SGEMM inputs to TF32 (that takes
    // CUBLAS_TF32_TENSOR_OP_MATH), so the device models agree with the CPU's OpenBLAS within float rounding, which is
    // what the comparison tests (tests/cuda/workloads_device_test.cu) hold them to; TF32's 10-bit mantissa would not.
    TERSE_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  } catch (...) {
    cublasDestroy(handle);
    cublas_ = nullptr;
    throw;
  }
}

CudaWorkload::~CudaWorkload() {
  releaseOnDevice([&] {
    // Nothing may still run when the shared data set's reference goes (see DeviceDataSplit's destructor), nor when the
    // handle's resources do.
    const cudaError_t err = cudaStreamSynchronize(stream_->get());
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      // (Not name(): the derived part is gone by now.)
      TERSE_LOG(LogLevel::kError, "CUDA workload on device "
                                      << device_ << ": cudaStreamSynchronize failed at teardown: "
                                      << cudaGetErrorName(err) << ": " << cudaGetErrorString(err));
    }
    if (cublas_ != nullptr) {
      const cublasStatus_t status = cublasDestroy(cublas_);
      if (status != CUBLAS_STATUS_SUCCESS)
        TERSE_LOG(LogLevel::kError, "cublasDestroy failed: " << cublasGetStatusName(status));
      cublas_ = nullptr;
    }
    values_ = {};
    grads_ = {};
    example_loss_ = {};
    example_correct_ = {};
    totals_ = {};
    indices_ = {};
    host_totals_ = {};
    staging_ = {};
    layer_done_.clear();
    staged_.reset();
    stream_.reset();
    data_.reset();
  });
}

void CudaWorkload::releaseOnDevice(const std::function<void()>& release) noexcept {
  // cuda::DeviceGuard throws, which a destructor must not; this is its quiet twin.
  int previous = -1;
  const bool switched =
      cudaGetDevice(&previous) == cudaSuccess && previous != device_ && cudaSetDevice(device_) == cudaSuccess;
  (void)cudaGetLastError();
  try {
    release();
  } catch (const std::exception& e) {
    TERSE_LOG(LogLevel::kError, "releasing a CUDA workload's memory on device " << device_ << ": " << e.what());
  }
  if (switched && cudaSetDevice(previous) != cudaSuccess) (void)cudaGetLastError();
}

void CudaWorkload::attachData(const std::shared_ptr<const DataSplit>& data) {
  data_ = deviceDataSplit(data, device_);
}

void CudaWorkload::registerParams(std::vector<ParamSpec> specs) {
  for (ParamSpec& spec : specs) {
    // Two statements: params() must be read after addParam, which may move the tensors.
    const std::size_t t = addParam(std::move(spec.name), std::move(spec.shape), spec.layer);
    params()[t].value = std::move(spec.value);
  }
  const std::size_t bytes = numParameters() * sizeof(float);
  values_ = cuda::DeviceBuffer(bytes, stream());
  grads_ = cuda::DeviceBuffer(bytes, stream());
  grads_.fill(0, stream());  // a reader before the first step sees zeros, not whatever the pool held
  std::size_t offset = 0;
  for (train::ParamTensor& p : params()) {
    p.device_value = values_.as<float>() + offset;
    p.device_grad = grads_.as<float>() + offset;
    offset += p.numel();
  }
  for (int l = 0; l < numLayers(); ++l) layer_done_.emplace_back(cuda::Event::Timing::kDisabled);
  host_totals_ = cuda::PinnedBuffer(sizeof(device::LossTotals));
  totals_ = cuda::DeviceBuffer(sizeof(device::LossTotals), stream());
  copyValuesToDevice();
}

void CudaWorkload::copyValuesToHost() {
  const cuda::DeviceGuard guard(device_);
  for (train::ParamTensor& p : params())
    TERSE_CUDA_CHECK(
        cudaMemcpyAsync(p.value.data(), p.device_value, p.numel() * sizeof(float), cudaMemcpyDeviceToHost, stream()));
  synchronize();
}

void CudaWorkload::copyValuesToDevice() {
  const cuda::DeviceGuard guard(device_);
  for (const train::ParamTensor& p : params())
    TERSE_CUDA_CHECK(
        cudaMemcpyAsync(p.device_value, p.value.data(), p.numel() * sizeof(float), cudaMemcpyHostToDevice, stream()));
  synchronize();  // the host vectors may change as soon as this returns
}

void CudaWorkload::growBytes(cuda::DeviceBuffer& buffer, std::size_t bytes) {
  if (buffer.size() < bytes) buffer = cuda::DeviceBuffer(bytes, stream());
}

const int64_t* CudaWorkload::uploadBatch(std::span<const int64_t> batch) {
  const std::size_t bytes = batch.size_bytes();
  staged_->synchronize();
  if (staging_.size() < bytes) staging_ = cuda::PinnedBuffer(bytes);
  growBytes(indices_, bytes);
  std::memcpy(staging_.data(), batch.data(), bytes);
  // From pinned memory the copy is truly asynchronous: the host goes on enqueueing the forward pass.
  TERSE_CUDA_CHECK(cudaMemcpyAsync(indices_.data(), staging_.data(), bytes, cudaMemcpyHostToDevice, stream()));
  staged_->record(stream());
  return indices_.as<const int64_t>();
}

void CudaWorkload::reserveLoss(int64_t n) {
  grow<double>(example_loss_, n);
  grow<int32_t>(example_correct_, n);
}

void CudaWorkload::enqueueLossSum(int64_t n) {
  device::sumLoss(exampleLoss(), exampleCorrect(), n, totals_.as<device::LossTotals>(), stream());
  TERSE_CUDA_CHECK(cudaMemcpyAsync(host_totals_.data(), totals_.data(), sizeof(device::LossTotals),
                                   cudaMemcpyDeviceToHost, stream()));
}

train::EvalResult CudaWorkload::evaluateInChunks(
    int64_t max_examples, int64_t chunk, int64_t classes, const std::function<void(int64_t rows)>& reserve_rows,
    const std::function<const float*(const float* x, int64_t rows)>& forward_rows) {
  const cuda::DeviceGuard guard(device());
  const Dataset& test = hostData().test;
  const int64_t n = max_examples > 0 ? std::min(max_examples, test.num_examples) : test.num_examples;
  if (n == 0) return {};
  reserve_rows(std::min(n, chunk));
  reserveLoss(n);  // one entry per example over all chunks, summed once at the end
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t rows = std::min(chunk, n - start);
    // The test set is already contiguous on the device: each chunk reads its rows in place.
    const float* logits = forward_rows(deviceData().test().x() + start * test.dims, rows);
    device::softmaxCrossEntropy(logits, deviceData().test().y() + start, rows, classes, 0.0f, nullptr,
                                exampleLoss() + start, exampleCorrect() + start, stream());
  }
  enqueueLossSum(n);
  synchronize();
  return {lossSum() / static_cast<double>(n), static_cast<double>(correctSum()) / static_cast<double>(n), n};
}

double CudaWorkload::lossSum() const {
  return host_totals_.as<const device::LossTotals>()->loss;
}

int64_t CudaWorkload::correctSum() const {
  return host_totals_.as<const device::LossTotals>()->correct;
}

void CudaWorkload::layerDone(int layer) {
  layer_done_[static_cast<std::size_t>(layer)].record(stream());
}

void CudaWorkload::reportWhenDone(const train::LayerReadyFn& on_layer_ready, int layer) {
  if (!on_layer_ready) return;
  layer_done_[static_cast<std::size_t>(layer)].synchronize();
  reportLayer(on_layer_ready, layer);
}

}  // namespace terse::workloads
