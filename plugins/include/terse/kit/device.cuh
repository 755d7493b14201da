// Kernel-side helpers for a compressor's .cu files, the ones every built-in uses (see device.hpp for how a device call
// goes).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"
#include "terse/sdk/cuda.hpp"

// Every kit kernel is compiled into every plugin that uses it, and CUDA's runtime finds a kernel by its mangled name:
// when two loaded plugins register one name it warns "Duplicate entry kernels named ..." and launches the copy
// registered first, also after that plugin was unloaded (cudaErrorInvalidKernelImage, a hang or a crash; seen on an
// H200 when the conformance suite opened every plugin before testing one). So the kit's kernels live in an inline
// namespace named per plugin, and cub and thrust are wrapped in one (THRUST_CUB_WRAPPED_NAMESPACE):
// terse_compressor_cuda_sources() defines both. A plugin's own kernels belong in the plugin's own namespace.
#ifndef TERSE_KIT_KERNEL_NS
#error \
    "TERSE_KIT_KERNEL_NS is not defined: build CUDA sources with terse_compressor_cuda_sources() (terseHelpers.cmake)"
#endif

namespace terse::kit::device {

// Threads per block for every built-in kernel: a multiple of the warp, small enough for several blocks per SM.
inline constexpr unsigned kThreads = 256;
// Grids are capped and kernels loop (grid-stride): 2^40 elements at one per thread would pass the 2^31 - 1 blocks a
// grid may have. 2^16 blocks of 256 threads still fill any current GPU many times over.
inline constexpr uint64_t kMaxBlocks = uint64_t{1} << 16;

inline unsigned gridFor(uint64_t items, uint64_t items_per_block) {
  const uint64_t blocks = (items + items_per_block - 1) / items_per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

inline cudaStream_t streamOf(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

// Launch errors (bad configuration, no kernel image for this GPU) surface only through cudaGetLastError.
#define TERSE_COMPRESSOR_CHECK_LAUNCH() TERSE_SDK_CUDA_CHECK(cudaGetLastError())

// Raises a status word (see StatusWords). Racing writers all store 1, so no atomic is needed; the host reads it only
// after the kernel has completed.
__device__ __forceinline__ void raiseStatus(uint32_t* status) {
  *reinterpret_cast<volatile uint32_t*>(status) = 1u;
}

// Whether a deferred verdict's gate is raised (device.hpp, checkedDecompress: a decode queued behind its validation
// without a wait, which must write nothing for a refused payload). One thread a block reads the word, device memory of
// the core's, and the block shares it: block-uniform. Call it from every thread of the block, before any thread
// returns; a null gate (the verdict was read on the host, or the payload is trusted) is never raised.
__device__ __forceinline__ bool gateRaised(const uint32_t* gate) {
  if (gate == nullptr) return false;  // a kernel argument: uniform, so the barrier below is reached by all or none
  __shared__ uint32_t raised;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
    raised = *reinterpret_cast<const volatile uint32_t*>(gate);
  __syncthreads();
  return raised != 0;
}

// out[0..n) = +0.0f unless `gate` is raised. A template in the plugin's own kernel namespace, as every kit kernel is
// (see the top of this file), so that several translation units of one plugin may include it.
inline namespace TERSE_KIT_KERNEL_NS {
template <class = void>
__global__ void zeroUnlessRaisedKernel(float* __restrict__ out, uint64_t n, const uint32_t* gate) {
  if (gateRaised(gate)) return;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    out[i] = 0.0f;
  }
}
}  // namespace TERSE_KIT_KERNEL_NS

// The clearing a non-accumulating scatter makes first: out[0..n) = +0.0f (a cudaMemsetAsync's zero bytes, as the host
// writes), or with a `gate` (a deferred verdict, device.hpp) a kernel that reads it and clears nothing when it is
// raised, where a memset would clear the output of a payload its validation refuses.
inline void clearOutput(float* out, uint64_t n, const uint32_t* gate, void* stream) {
  if (n == 0) return;
  if (gate == nullptr) {
    TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(out, 0, n * sizeof(float), streamOf(stream)));
    return;
  }
  zeroUnlessRaisedKernel<><<<gridFor(n, kThreads), kThreads, 0, streamOf(stream)>>>(out, n, gate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

// Byte `i` of a prefix that a kernel received by value. Indexing the parameter with a run-time index makes the
// compiler copy the whole Prefix into every thread's local memory (an 80-byte stack frame per thread; in a decode of
// 256 MiB that was 1.3 GB of local stores, and the dense decoders ran at a seventh of a device copy on an H200). The
// unrolled select reads the constant bank at fixed offsets instead: no stack, a few dozen predicated moves in the
// threads that check a byte.
__device__ __forceinline__ std::byte prefixByte(const Prefix& p, uint64_t i) {
  std::byte b{};
#pragma unroll
  for (unsigned k = 0; k < sizeof(Prefix::bytes); ++k) {
    if (k == i) b = p.bytes[k];
  }
  return b;
}

// Part of a validation kernel: raises `status` unless the payload's first prefix.size bytes are the expected prefix.
// Thread-strided over the calling grid's global thread index.
__device__ __forceinline__ void checkPrefix(const std::byte* payload, const Prefix& expected, uint64_t thread,
                                            uint32_t* status) {
  if (thread < expected.size && payload[thread] != prefixByte(expected, thread)) raiseStatus(status);
}

// Whether `p` is aligned for an access of `bytes` (a power of two): wide loads need it, and a kernel falls back to
// element accesses when a pointer is not (the ABI promises 16 bytes for whole buffers, not for every section).
__device__ __forceinline__ bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

}  // namespace terse::kit::device
