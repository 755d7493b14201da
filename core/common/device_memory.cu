// core/common/device_memory.h for CUDA builds.
#include <cuda_runtime_api.h>

#include <utility>

#include "core/common/cuda.h"
#include "core/common/device_memory.h"
#include "core/common/error.h"
#include "core/common/log.h"

namespace terse::cuda {
namespace {

cudaStream_t asStream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

}  // namespace

DeviceArray::DeviceArray(std::size_t bytes, void* stream) : bytes_(bytes), stream_(stream) {
  if (bytes == 0) return;
  void* p = nullptr;
  TERSE_CUDA_CHECK(cudaMallocAsync(&p, bytes, asStream(stream)));
  data_ = static_cast<std::byte*>(p);
  // Zero-filled like HostArray: plugin state must start zeroed (compressor_v1.h), and a residual starts at 0.
  TERSE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, asStream(stream)));
}

DeviceArray::~DeviceArray() {
  reset();
}

DeviceArray::DeviceArray(DeviceArray&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(std::exchange(other.stream_, nullptr)) {}

DeviceArray& DeviceArray::operator=(DeviceArray&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void DeviceArray::reset() noexcept {
  if (data_ == nullptr) return;
  const cudaError_t err = cudaFreeAsync(data_, asStream(stream_));
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    (void)cudaGetLastError();  // see TERSE_CUDA_CHECK: a later launch check must not report this as its own
    TERSE_LOG(LogLevel::kError,
              "cudaFreeAsync(data_, stream_) failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err));
  }
  data_ = nullptr;
  bytes_ = 0;
}

void copyAsync(void* dst, const void* src, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  TERSE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, asStream(stream)));
}

void zeroAsync(void* dst, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  TERSE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, asStream(stream)));
}

void synchronize(void* stream) {
  TERSE_CUDA_CHECK(cudaStreamSynchronize(asStream(stream)));
}

void setDevice(int device) {
  TERSE_CUDA_CHECK(cudaSetDevice(device));
}

bool isDevicePointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attr{};
  TERSE_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

}  // namespace terse::cuda
