// A per-tensor buffer of the compression path in the tensor's memory: host (HostArray: 64-byte aligned) or CUDA device
// (cuda::DeviceArray: cudaMallocAsync's 256-byte alignment, on the tensor's stream). Zero-filled either way, so plugin
// state starts zeroed and residuals start at 0 wherever the tensor lives. The codecs and the pipeline hold every buffer
// through this type and branch on `onDevice()` only where a loop must become a kernel.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <utility>

#include "core/common/device_memory.h"
#include "core/compress/host_array.h"

namespace terse {

// Where a tensor's compression runs: host memory (stream == nullptr), or device memory ordered on `stream` (a
// cudaStream_t). Every buffer, plugin call and kernel of one tensor uses the same placement.
struct Placement {
  bool device = false;
  void* stream = nullptr;

  static Placement host() { return {}; }
  static Placement cuda(void* stream) { return {true, stream}; }
};

class TensorBuffer {
 public:
  TensorBuffer() = default;
  TensorBuffer(std::size_t bytes, const Placement& where) : device_(where.device), stream_(where.stream) {
    if (device_) {
      dev_ = cuda::DeviceArray(bytes, where.stream);
    } else {
      host_ = HostArray<std::byte>(bytes);
    }
  }

  bool onDevice() const noexcept { return device_; }
  std::byte* data() const noexcept { return device_ ? dev_.data() : const_cast<std::byte*>(host_.data()); }
  std::size_t size() const noexcept { return device_ ? dev_.size() : host_.size(); }
  bool empty() const noexcept { return size() == 0; }
  std::span<std::byte> span() const noexcept { return {data(), size()}; }
  template <class T>
  T* as() const noexcept {
    return reinterpret_cast<T*>(data());
  }
  // Elements of T that fit (the buffers hold whole elements by construction).
  template <class T>
  std::size_t count() const noexcept {
    return size() / sizeof(T);
  }

  // Back to zero bytes: memset on the host, a stream-ordered fill on the device.
  void zero() {
    if (device_) {
      cuda::zeroAsync(dev_.data(), dev_.size(), stream_);
    } else {
      host_.zero();
    }
  }

 private:
  bool device_ = false;
  void* stream_ = nullptr;
  HostArray<std::byte> host_;
  cuda::DeviceArray dev_;
};

// Grows `b` to at least `bytes` (new contents zero), keeping its placement; buffers only ever grow, so a run's steady
// state allocates nothing.
inline void growBuffer(TensorBuffer& b, std::size_t bytes, const Placement& where) {
  if (b.size() < bytes) b = TensorBuffer(bytes, where);
}

// Copies bytes between buffers of one placement (or host to host): memcpy on the host, stream-ordered on the device.
inline void copyBytes(void* dst, const void* src, std::size_t bytes, const Placement& where) {
  if (bytes == 0) return;
  if (where.device) {
    cuda::copyAsync(dst, src, bytes, where.stream);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

}  // namespace terse
