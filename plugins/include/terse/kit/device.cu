// The host side of terse/kit/device.hpp (device scope, status words, prefix writes, the host verdict on a refused
// payload): compiled into every plugin that has CUDA kernels by terse_compressor_cuda_sources().
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "terse/kit/device.cuh"
#include "terse/kit/device.hpp"
#include "terse/sdk/cuda.hpp"

namespace terse::kit::device {
// Not an anonymous namespace: its mangled name is the same in every plugin built from this file (device.cuh).
inline namespace TERSE_KIT_KERNEL_NS {

__global__ void writePrefixKernel(Prefix prefix, std::byte* output, const uint32_t* gate) {
  const bool raised = gateRaised(gate);
  for (unsigned i = threadIdx.x; i < prefix.size; i += blockDim.x) output[i] = raised ? std::byte{0} : prefix.bytes[i];
}

}  // namespace TERSE_KIT_KERNEL_NS

Scope::Scope(const terse_tensor_info_v1& info) {
  TERSE_SDK_CUDA_CHECK(cudaGetDevice(&previous_));
  if (info.device_index < 0) {
    throw sdk::InvalidArgument("a CUDA tensor needs device_index >= 0, got " + std::to_string(info.device_index));
  }
  if (info.device_index != previous_) {
    TERSE_SDK_CUDA_CHECK(cudaSetDevice(info.device_index));
  } else {
    previous_ = -1;  // nothing to restore
  }
}

Scope::~Scope() {
  // Cannot throw from here. Restoring a device that was current a moment ago does not fail in practice; if it did, the
  // error is cleared so that the caller's next launch check does not report it as its own.
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

StatusWords::~StatusWords() {
  // finalize runs after every call has returned, so no kernel still writes these. cudaFreeHost's status is dropped:
  // a destructor cannot throw, and at process exit the runtime may already be unloaded.
  for (uint32_t* w : all_) {
    if (cudaFreeHost(w) != cudaSuccess) (void)cudaGetLastError();
  }
  for (const auto& [device, w] : discard_) {
    if (cudaFree(w) != cudaSuccess) (void)cudaGetLastError();
  }
}

uint32_t* StatusWords::discard() {
  int device = 0;
  TERSE_SDK_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [d, w] : discard_) {
    if (d == device) return w;
  }
  void* p = nullptr;
  TERSE_SDK_CUDA_CHECK(cudaMalloc(&p, sizeof(uint32_t)));
  discard_.emplace_back(device, static_cast<uint32_t*>(p));
  return static_cast<uint32_t*>(p);
}

StatusWords::Lease StatusWords::acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) {
    void* p = nullptr;
    // Portable: valid whichever device the lease is used on; mapped: kernels write it directly (with unified
    // addressing, the pointer kernels use is the host pointer).
    TERSE_SDK_CUDA_CHECK(cudaHostAlloc(&p, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    all_.push_back(static_cast<uint32_t*>(p));
    free_.push_back(static_cast<uint32_t*>(p));
  }
  uint32_t* w = free_.back();
  free_.pop_back();
  return Lease(this, w);
}

StatusWords::Lease::~Lease() {
  std::lock_guard<std::mutex> lock(pool_->mutex_);
  pool_->free_.push_back(word_);
}

void StatusWords::Lease::clear() const {
  *reinterpret_cast<volatile uint32_t*>(word_) = 0u;
}

uint32_t* StatusWords::Lease::device() const {
  void* d = nullptr;
  TERSE_SDK_CUDA_CHECK(cudaHostGetDevicePointer(&d, word_, 0));
  return static_cast<uint32_t*>(d);
}

bool StatusWords::Lease::raised() const {
  return *reinterpret_cast<const volatile uint32_t*>(word_) != 0u;
}

void writePrefix(const Prefix& prefix, void* output, void* stream, const uint32_t* gate) {
  if (prefix.size == 0) return;
  writePrefixKernel<<<1, 64, 0, streamOf(stream)>>>(prefix, static_cast<std::byte*>(output), gate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void synchronize(void* stream) {
  TERSE_SDK_CUDA_CHECK(cudaStreamSynchronize(streamOf(stream)));
}

void copyToHost(void* dst, const void* src, uint64_t bytes, void* stream) {
  if (bytes > 0) TERSE_SDK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, streamOf(stream)));
}

namespace {

// A host copy of device bytes, in 8-byte words so that it is aligned for every section type, as the ABI's 16-byte
// buffers are. Synchronizes `stream`.
struct HostCopy {
  HostCopy(std::span<const std::byte> device_bytes, void* stream)
      : words((device_bytes.size() + 7) / 8 + 1), size(device_bytes.size()) {
    copyToHost(words.data(), device_bytes.data(), size, stream);
    synchronize(stream);
  }
  std::span<const std::byte> bytes() const { return {reinterpret_cast<const std::byte*>(words.data()), size}; }

  std::vector<uint64_t> words;
  size_t size;
};

terse_tensor_info_v1 hostInfo(terse_tensor_info_v1 info) {
  info.device = TERSE_DEVICE_HOST;
  info.device_index = -1;
  return info;
}

[[noreturn]] void disagree(const char* call, uint64_t bytes) {
  throw sdk::Error(TERSE_ERR_INTERNAL, std::string("the device validation of ") + call + " refused " +
                                           std::to_string(bytes) +
                                           " payload bytes that the host parser accepts: the two validations disagree");
}

}  // namespace

void rethrowHostVerdict(const sdk::DecompressArgs& args,
                        const std::function<void(const sdk::DecompressArgs&)>& host_decompress) {
  const HostCopy payload(args.payload, args.stream);
  const terse_tensor_info_v1 info = hostInfo(args.info);
  std::vector<float> output(static_cast<size_t>(info.numel));
  const sdk::DecompressArgs host{
      info, payload.bytes(), {}, {}, output.empty() ? nullptr : output.data(), args.accumulate, nullptr};
  host_decompress(host);
  disagree("decompress", args.payload.size());
}

void rethrowHostReduceVerdict(const sdk::ReduceArgs& args,
                              const std::function<uint64_t(const sdk::ReduceArgs&)>& host_reduce) {
  const HostCopy a(args.a, args.stream), b(args.b, args.stream);
  const terse_tensor_info_v1 info = hostInfo(args.info);
  std::vector<uint64_t> output((args.output.size() + 7) / 8);
  const sdk::ReduceArgs host{
      info,   a.bytes(), b.bytes(),
      {},     {},        std::span<std::byte>(reinterpret_cast<std::byte*>(output.data()), args.output.size()),
      nullptr};
  host_reduce(host);
  disagree("reduce", args.a.size() + args.b.size());
}

}  // namespace terse::kit::device
