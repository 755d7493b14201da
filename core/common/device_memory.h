// Device memory for code that is compiled without the CUDA headers: the compression pipeline, its codecs and the
// trainer hold their device buffers through these, so the same sources build with and without CUDA. In a build
// without CUDA every call that would touch a device throws Unsupported naming the call (a CUDA tensor can only reach
// them from a CUDA build's communicator or workload, so the error is a configuration mistake, not a crash).
//
// `stream` is a cudaStream_t passed as void* (what the plugin ABI carries). Allocation, copies and fills are ordered
// on it (cudaMallocAsync / cudaMemcpyAsync / cudaMemsetAsync): none of them waits for the device, and a buffer freed
// on a stream is reused only after the work queued there before the free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace terse::cuda {

// `bytes` of zero-filled device memory on the current device, allocated and freed in the order of `stream`. Empty
// (data() == nullptr) for 0 bytes and after a move, which is the plugin ABI's "NULL when the size is 0".
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(std::size_t bytes, void* stream);
  ~DeviceArray();
  DeviceArray(DeviceArray&& other) noexcept;
  DeviceArray& operator=(DeviceArray&& other) noexcept;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }
  std::span<std::byte> span() const noexcept { return {data_, bytes_}; }

 private:
  void reset() noexcept;

  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  void* stream_ = nullptr;
};

// `count` zero-filled 32-bit words of page-locked host memory mapped into every device's address space
// (cudaHostAlloc, mapped and portable): kernels store into them through device(), the host reads them through host()
// once the stream that ran those kernels is synchronized, with no copy queued (the deferred verdicts of
// core/compress/engine.cc: a copy would be a device-to-host transfer a collective). Freeing waits for the device.
class MappedWords {
 public:
  MappedWords() = default;
  explicit MappedWords(std::size_t count);
  ~MappedWords();
  MappedWords(MappedWords&& other) noexcept;
  MappedWords& operator=(MappedWords&& other) noexcept;
  MappedWords(const MappedWords&) = delete;
  MappedWords& operator=(const MappedWords&) = delete;

  uint32_t* host() const noexcept { return host_; }
  uint32_t* device() const noexcept { return device_; }
  std::size_t size() const noexcept { return count_; }

 private:
  void reset() noexcept;

  uint32_t* host_ = nullptr;
  uint32_t* device_ = nullptr;
  std::size_t count_ = 0;
};

// Stream-ordered copy between any two of host and device memory (cudaMemcpyDefault: unified addressing tells the
// direction). A copy from pageable host memory returns once the source was staged; one to pageable host memory returns
// once it is complete.
void copyAsync(void* dst, const void* src, std::size_t bytes, void* stream);
// Stream-ordered fill of device memory with zero bytes.
void zeroAsync(void* dst, std::size_t bytes, void* stream);
// Blocks until everything queued on `stream` has run; throws DeviceError naming a failed kernel.
void synchronize(void* stream);
// Makes `device` the calling thread's current CUDA device (cudaSetDevice): a thread that launches work for a device
// other than 0 must say so once, since the current device is per host thread.
void setDevice(int device);
// Whether `p` points into device (or managed) memory, as the runtime sees it; false for host memory and null.
bool isDevicePointer(const void* p);

}  // namespace terse::cuda
