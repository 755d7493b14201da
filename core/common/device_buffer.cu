// core/common/device_buffer.h. Compiled by nvcc whenever CUDA is on (CI builds it without a GPU).
#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/common/error.h"
#include "core/common/log.h"

namespace terse::cuda {
namespace {

// Destructors cannot throw: a failed release is logged with the call and the error, and the handle is dropped (a
// second try would fail the same way, and a sticky error will surface at the next checked call anyway).
void logReleaseFailure(const char* call, cudaError_t err) noexcept {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;  // at process exit the runtime may be gone first
  (void)cudaGetLastError();  // logged here: a later launch check must not report it as its own (see TERSE_CUDA_CHECK)
  TERSE_LOG(LogLevel::kError, call << " failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err));
}

}  // namespace

// ---- DeviceGuard

DeviceGuard::DeviceGuard(int device) {
  TERSE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (device != previous_) {
    TERSE_CUDA_CHECK(cudaSetDevice(device));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) logReleaseFailure("cudaSetDevice(previous_)", cudaSetDevice(previous_));
}

// ---- Stream

Stream::Stream(Priority priority) : priority_(priority) {
  int least = 0, greatest = 0;  // CUDA's numbers: greatest priority is the smallest value (e.g. least 0, greatest -5)
  TERSE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TERSE_CUDA_CHECK(
      cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority == Priority::kHigh ? greatest : least));
}

Stream::~Stream() {
  reset();
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)), priority_(other.priority_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    priority_ = other.priority_;
  }
  return *this;
}

void Stream::reset() noexcept {
  // cudaStreamDestroy returns at once; work already queued still runs to completion.
  if (stream_ != nullptr) logReleaseFailure("cudaStreamDestroy(stream_)", cudaStreamDestroy(stream_));
  stream_ = nullptr;
}

int Stream::cudaPriority() const {
  int p = 0;
  TERSE_CUDA_CHECK(cudaStreamGetPriority(stream_, &p));
  return p;
}

void Stream::synchronize() const {
  TERSE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- Event

Event::Event(Timing timing) {
  TERSE_CUDA_CHECK(
      cudaEventCreateWithFlags(&event_, timing == Timing::kEnabled ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  reset();
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::reset() noexcept {
  if (event_ != nullptr) logReleaseFailure("cudaEventDestroy(event_)", cudaEventDestroy(event_));
  event_ = nullptr;
}

void Event::record(cudaStream_t stream) {
  TERSE_CUDA_CHECK(cudaEventRecord(event_, stream));
}

void Event::waitOn(cudaStream_t stream) const {
  TERSE_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

void Event::synchronize() const {
  TERSE_CUDA_CHECK(cudaEventSynchronize(event_));
}

float Event::millisecondsSince(const Event& start) const {
  float ms = 0;
  TERSE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

// ---- DeviceBuffer

DeviceBuffer::DeviceBuffer(std::size_t bytes, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
  if (bytes_ > 0) TERSE_CUDA_CHECK(cudaMallocAsync(&data_, bytes_, stream_));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) logReleaseFailure("cudaFreeAsync(data_, stream_)", cudaFreeAsync(data_, stream_));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(std::exchange(other.stream_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) logReleaseFailure("cudaFreeAsync(data_, stream_)", cudaFreeAsync(data_, stream_));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void DeviceBuffer::copyFromHost(const void* src, std::size_t bytes, cudaStream_t stream) {
  TERSE_CHECK(bytes <= bytes_, InvalidArgument, "copy of " << bytes << " bytes into a device buffer of " << bytes_);
  if (bytes > 0) TERSE_CUDA_CHECK(cudaMemcpyAsync(data_, src, bytes, cudaMemcpyHostToDevice, stream));
}

void DeviceBuffer::copyToHost(void* dst, std::size_t bytes, cudaStream_t stream) const {
  TERSE_CHECK(bytes <= bytes_, InvalidArgument, "copy of " << bytes << " bytes out of a device buffer of " << bytes_);
  if (bytes > 0) TERSE_CUDA_CHECK(cudaMemcpyAsync(dst, data_, bytes, cudaMemcpyDeviceToHost, stream));
}

void DeviceBuffer::fill(unsigned char byte, cudaStream_t stream) {
  if (bytes_ > 0) TERSE_CUDA_CHECK(cudaMemsetAsync(data_, byte, bytes_, stream));
}

void DeviceBuffer::release() {
  if (data_ != nullptr) {
    void* p = std::exchange(data_, nullptr);
    bytes_ = 0;
    TERSE_CUDA_CHECK(cudaFreeAsync(p, stream_));
  }
}

// ---- PinnedBuffer

PinnedBuffer::PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes_ > 0) TERSE_CUDA_CHECK(cudaMallocHost(&data_, bytes_));
}

PinnedBuffer::~PinnedBuffer() {
  reset();
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void PinnedBuffer::reset() noexcept {
  // cudaFreeHost waits for the device to be done with the memory (it synchronizes the context), which is what keeps a
  // pending async copy from reading freed memory.
  if (data_ != nullptr) logReleaseFailure("cudaFreeHost(data_)", cudaFreeHost(data_));
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace terse::cuda
