// Owning CUDA resources for the core: device memory, streams, events and the current-device scope. Each type is
// move-only and releases what it owns exactly once; every CUDA call goes through TERSE_CUDA_CHECK, so a failure names
// the call and the runtime's error string. Only builds with CUDA (TERSE_HAVE_CUDA) compile this header; code that runs
// in both kinds of build asks terse::cuda::deviceSummary() first.
//
// Streams are passed explicitly everywhere (DESIGN.md section 3): a buffer is allocated and freed in the order of the
// stream it is bound to (cudaMallocAsync / cudaFreeAsync), so freeing a buffer never waits for the device, and the
// memory is reused only after the work queued on that stream before the free has run. Allocate at setup, never on the
// hot path (the pool makes cudaMallocAsync cheap, but "cheap" is not "free" and the hot path must not fail with OOM).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace terse::cuda {

// Makes `device` current for a scope and restores the previous one (CUDA's current device is per host thread, and a
// library call must not leave it changed for its caller).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// A non-blocking stream (no implicit synchronization with the legacy default stream) at a scheduling priority. The
// core runs high-priority chunks' compression kernels and collectives on a kHigh stream and the rest on a kLow one
// (DESIGN.md section 2): the device's block scheduler then prefers pending blocks of the high-priority stream.
class Stream {
 public:
  enum class Priority { kLow, kHigh };

  // On the current device.
  explicit Stream(Priority priority = Priority::kLow);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const noexcept { return stream_; }
  // What the ABI's `void* stream` argument carries.
  void* handle() const noexcept { return stream_; }
  Priority priority() const noexcept { return priority_; }
  // The numeric CUDA priority this stream was created with (lower is more urgent).
  int cudaPriority() const;
  // Blocks the calling thread until everything queued so far has run; throws DeviceError on a failed kernel.
  void synchronize() const;

 private:
  void reset() noexcept;

  cudaStream_t stream_ = nullptr;
  Priority priority_ = Priority::kLow;
};

// An event, for ordering work across streams (record on one, wait on another) and, when made with timing, for
// measuring device time between two records.
class Event {
 public:
  enum class Timing { kDisabled, kEnabled };

  explicit Event(Timing timing = Timing::kDisabled);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const noexcept { return event_; }
  void record(cudaStream_t stream);
  // Makes `stream` wait (on the device, without blocking the host) for the work before the last record().
  void waitOn(cudaStream_t stream) const;
  void synchronize() const;
  // Milliseconds of device time from start's record to this event's record; both need Timing::kEnabled.
  float millisecondsSince(const Event& start) const;

 private:
  void reset() noexcept;

  cudaEvent_t event_ = nullptr;
};

// `bytes` of device memory on the current device, allocated and freed in the order of `stream` (see the top of the
// file). Empty (data() == nullptr) for 0 bytes and after a move. The memory is uninitialized.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t bytes, cudaStream_t stream);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t size() const noexcept { return bytes_; }
  bool empty() const noexcept { return bytes_ == 0; }
  cudaStream_t stream() const noexcept { return stream_; }

  // Stream-ordered copies and fill of the whole buffer or a prefix of it; throw InvalidArgument past the end.
  void copyFromHost(const void* src, std::size_t bytes, cudaStream_t stream);
  void copyToHost(void* dst, std::size_t bytes, cudaStream_t stream) const;
  void fill(unsigned char byte, cudaStream_t stream);

  // Frees now (stream-ordered) and leaves the buffer empty. Unlike the destructor, reports a failure by throwing.
  void release();

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Page-locked host memory: the staging side of fast, truly asynchronous host <-> device copies (a copy from pageable
// memory is staged by the driver and may block the host).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void reset() noexcept;

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace terse::cuda
