// core/common/device_memory.h for CUDA builds.
#include <cuda_runtime_api.h>

#include <algorithm>
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

MappedWords::MappedWords(std::size_t count) : count_(count) {
  if (count == 0) return;
  void* p = nullptr;
  TERSE_CUDA_CHECK(cudaHostAlloc(&p, count * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
  host_ = static_cast<uint32_t*>(p);
  std::fill_n(host_, count, 0u);
  void* d = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&d, p, 0);
  if (err != cudaSuccess) {
    (void)cudaFreeHost(p);
    host_ = nullptr;
    TERSE_CUDA_CHECK(err);
  }
  device_ = static_cast<uint32_t*>(d);
}

MappedWords::~MappedWords() {
  reset();
}

MappedWords::MappedWords(MappedWords&& other) noexcept
    : host_(std::exchange(other.host_, nullptr)),
      device_(std::exchange(other.device_, nullptr)),
      count_(std::exchange(other.count_, 0)) {}

MappedWords& MappedWords::operator=(MappedWords&& other) noexcept {
  if (this != &other) {
    reset();
    host_ = std::exchange(other.host_, nullptr);
    device_ = std::exchange(other.device_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void MappedWords::reset() noexcept {
  // cudaFreeHost synchronizes the context first, so no kernel still stores into the words once they are freed.
  if (host_ != nullptr) {
    const cudaError_t err = cudaFreeHost(host_);
    if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
      (void)cudaGetLastError();
      TERSE_LOG(LogLevel::kError,
                "cudaFreeHost(mapped words) failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err));
    }
  }
  host_ = nullptr;
  device_ = nullptr;
  count_ = 0;
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
