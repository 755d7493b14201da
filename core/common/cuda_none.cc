// core/common/cuda.h for builds without CUDA (TERSE_CUDA=OFF or no nvcc found).
#include "core/common/cuda.h"

#include "core/common/device_memory.h"
#include "core/common/error.h"

namespace terse::cuda {

bool builtWithCuda() noexcept {
  return false;
}

DeviceSummary deviceSummary() noexcept {
  DeviceSummary s;
  s.reason = "this build has no CUDA (configured with TERSE_CUDA=OFF or without nvcc)";
  return s;
}

// device_memory.h: nothing here can reach a device. Zero-byte requests are fine (an empty tensor needs no memory).
namespace {
[[noreturn]] void noCuda(const char* call) {
  TERSE_THROW(Unsupported, call << ": this build has no CUDA (configured with TERSE_CUDA=OFF or without nvcc)");
}
}  // namespace

DeviceArray::DeviceArray(std::size_t bytes, void* stream) : bytes_(0), stream_(stream) {
  if (bytes != 0) noCuda("device memory");
}
DeviceArray::~DeviceArray() = default;
DeviceArray::DeviceArray(DeviceArray&&) noexcept = default;
DeviceArray& DeviceArray::operator=(DeviceArray&&) noexcept = default;
void DeviceArray::reset() noexcept {}

MappedWords::MappedWords(std::size_t count) : count_(0) {
  if (count != 0) noCuda("mapped host memory");
}
MappedWords::~MappedWords() = default;
MappedWords::MappedWords(MappedWords&&) noexcept = default;
MappedWords& MappedWords::operator=(MappedWords&&) noexcept = default;
void MappedWords::reset() noexcept {}

void copyAsync(void*, const void*, std::size_t bytes, void*) {
  if (bytes != 0) noCuda("cudaMemcpyAsync");
}
void zeroAsync(void*, std::size_t bytes, void*) {
  if (bytes != 0) noCuda("cudaMemsetAsync");
}
void synchronize(void*) {
  noCuda("cudaStreamSynchronize");
}
void setDevice(int) {
  noCuda("cudaSetDevice");
}
bool isDevicePointer(const void*) {
  return false;
}

}  // namespace terse::cuda
