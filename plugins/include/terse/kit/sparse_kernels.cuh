// Device side of sparse_payload.hpp, for the sparsifiers' .cu files (topk, threshold and dgc send this layout): the
// select that writes a payload's two sections in index order, validation of an untrusted payload with the checks
// readSparse makes, and the scatter that decodes it. Templates, so that a plugin may include this from more than one
// translation unit.
#pragma once

#include <cuda_runtime_api.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/tuple.h>

#include <cstddef>
#include <cstdint>
#include <cub/device/device_select.cuh>

#include "terse/kit/device.cuh"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_math.hpp"

namespace terse::kit::sparse {
inline namespace TERSE_KIT_KERNEL_NS {  // unique per plugin: device.cuh

namespace cub = CUB_NS_QUALIFIER;        // wrapped in a namespace of the plugin's own (device.cuh)
namespace thrust = THRUST_NS_QUALIFIER;  // the same

// One payload entry: element i's value and index, as selectEntries writes it into the two sections at once. Only
// device code writes through the iterator that calls this (x is device memory); the host needs the body to compile.
struct EntryOf {
  const float* x;
  __host__ __device__ thrust::tuple<float, uint32_t> operator()(uint32_t i) const {
    return thrust::tuple<float, uint32_t>{x[i], i};
  }
};

// The elements of x[0..n) that keep(i) (device code, i < n) keeps, in index order: values[j] = x[i], indices[j] = i,
// and their number in *count. One cub::DeviceSelect::If over the indices (a counting iterator), each kept one written
// as its (value, index) through a zip of the two sections: a 4-byte primitive input gets cub's tuned sm_90 policy (384
// threads of 17 items), where an 8-byte pair type would get its untuned default (128 of 5). The predicate reads the
// element; the write reads it again, just read. With temp == nullptr, only sizes cub's temporary storage (launches
// nothing): the size depends on n and the Keep type, so size and run with the same ones. Queued on `st`.
template <class Keep>
void selectEntries(void* temp, size_t& temp_bytes, const float* x, uint64_t n, const Keep& keep, float* values,
                   uint32_t* indices, uint64_t* count, cudaStream_t st) {
  TERSE_SDK_CUDA_CHECK(cub::DeviceSelect::If(
      temp, temp_bytes, thrust::counting_iterator<uint32_t>(0),
      thrust::make_transform_output_iterator(thrust::make_zip_iterator(values, indices), EntryOf{x}), count,
      static_cast<int64_t>(n), keep, st));
}

// The sections of a payload of `count` entries (host code computes them for the launches, kernels to read).
TERSE_HD const float* valuesOf(const std::byte* payload) {
  return reinterpret_cast<const float*>(payload + kFixedBytes);
}
TERSE_HD const uint32_t* indicesOf(const std::byte* payload, uint64_t count) {
  return reinterpret_cast<const uint32_t*>(payload + kFixedBytes + sizeof(float) * count);
}

// One thread per entry (and per prefix byte): the prefix (header and count), every index below numel and above its
// predecessor, every value finite and (CheckMinKey, threshold's tau) with a key >= min_key. The caller has checked that
// the payload is payloadBytes(count) long, so every read is in bounds. Values sit at offset 24 and indices right after
// them: both 4-byte aligned in a 16-byte aligned payload.
template <bool CheckMinKey>
__global__ void validateSparseKernel(const std::byte* __restrict__ payload, device::Prefix expected, uint64_t count,
                                     uint64_t numel, uint32_t min_key, uint32_t* status) {
  const float* values = valuesOf(payload);
  const uint32_t* indices = indicesOf(payload, count);
  const uint64_t items = count > expected.size ? count : expected.size;
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < items; t += uint64_t{gridDim.x} * blockDim.x) {
    device::checkPrefix(payload, expected, t, status);
    if (t < count) {
      const uint32_t index = indices[t];
      if (index >= numel || (t > 0 && index <= indices[t - 1])) device::raiseStatus(status);
      const uint32_t key = topk::magnitudeKey(values[t]);
      if (topk::isNonFiniteKey(key) || (CheckMinKey && key < min_key)) device::raiseStatus(status);
    }
  }
}

// out[indices[j]] = (or +=) values[j]. Validated indices are distinct, so no two threads touch one element and no
// atomics are needed; the sum is the host's single addition per entry. Nothing is written when `gate` is raised (a
// deferred verdict: device.hpp, checkedDecompress).
template <bool Accumulate>
__global__ void scatterKernel(const float* __restrict__ values, const uint32_t* __restrict__ indices, uint64_t count,
                              float* __restrict__ out, const uint32_t* gate) {
  if (device::gateRaised(gate)) return;
  for (uint64_t j = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < count; j += uint64_t{gridDim.x} * blockDim.x) {
    if constexpr (Accumulate) {
      out[indices[j]] += values[j];
    } else {
      out[indices[j]] = values[j];
    }
  }
}

template <bool CheckMinKey>
void launchValidateSparse(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
                          uint32_t min_key, uint32_t* status, void* stream) {
  const uint64_t items = count > expected.size ? count : expected.size;
  validateSparseKernel<CheckMinKey>
      <<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
          payload, expected, count, numel, min_key, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

// The host's scatter: zeros first unless accumulating (cudaMemsetAsync's 0 bytes are +0.0f, as the host writes).
// With a `gate` (a deferred verdict, device.hpp) every write waits for it on the device: the clearing is a kernel that
// reads it, and the scatter reads it too.
inline void launchScatter(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate,
                          void* stream, const uint32_t* gate = nullptr) {
  const cudaStream_t st = device::streamOf(stream);
  if (!accumulate) device::clearOutput(out, numel, gate, stream);
  if (count == 0) return;
  const unsigned grid = device::gridFor(count, device::kThreads);
  if (accumulate) {
    scatterKernel<true>
        <<<grid, device::kThreads, 0, st>>>(valuesOf(payload), indicesOf(payload, count), count, out, gate);
  } else {
    scatterKernel<false>
        <<<grid, device::kThreads, 0, st>>>(valuesOf(payload), indicesOf(payload, count), count, out, gate);
  }
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

// Threads of validateAndScatterOneBlockKernel's one block.
inline constexpr unsigned kOneBlockThreads = 1024;

// validateSparseKernel and the scatter in one launch, for a small tensor (topk's one-block path): the block validates
// every entry first, and only when no thread found a fault (a barrier's vote) does it clear the output (unless
// accumulating) and scatter onto it. A refused payload raises `status` and leaves the output untouched, as the host
// path does, so the decode needs no launch of its own after the verdict: one launch where there were three (the
// validation, the clearing memset, the scatter). Its reads and writes are numel + 2 count elements, from L2 at the
// sizes it serves.
template <bool CheckMinKey>
__global__ void __launch_bounds__(kOneBlockThreads, 1)
    validateAndScatterOneBlockKernel(const std::byte* __restrict__ payload, device::Prefix expected, uint64_t count,
                                     uint64_t numel, uint32_t min_key, bool accumulate, float* __restrict__ out,
                                     uint32_t* status) {
  const float* values = valuesOf(payload);
  const uint32_t* indices = indicesOf(payload, count);
  const uint64_t items = count > expected.size ? count : expected.size;
  bool bad = false;
  for (uint64_t t = threadIdx.x; t < items; t += kOneBlockThreads) {
    if (t < expected.size && payload[t] != device::prefixByte(expected, t)) bad = true;
    if (t < count) {
      const uint32_t index = indices[t];
      if (index >= numel || (t > 0 && index <= indices[t - 1])) bad = true;
      const uint32_t key = topk::magnitudeKey(values[t]);
      if (topk::isNonFiniteKey(key) || (CheckMinKey && key < min_key)) bad = true;
    }
  }
  if (__syncthreads_or(bad)) {  // block-uniform: every thread returns, none has written
    if (threadIdx.x == 0) device::raiseStatus(status);
    return;
  }
  if (!accumulate) {  // the kernel argument is block-uniform, so is the barrier
    for (uint64_t i = threadIdx.x; i < numel; i += kOneBlockThreads) out[i] = 0.0f;  // +0.0f, as the host's clear
    __syncthreads();  // cleared before any thread scatters over it
  }
  for (uint64_t j = threadIdx.x; j < count; j += kOneBlockThreads) {
    if (accumulate) {
      out[indices[j]] += values[j];
    } else {
      out[indices[j]] = values[j];
    }
  }
}

// Queues validateAndScatterOneBlockKernel on `stream`: the one call of device.hpp's checkedDecompress overload for a
// kernel that validates and decodes.
template <bool CheckMinKey>
void launchValidateAndScatterOneBlock(const device::Prefix& expected, const std::byte* payload, uint64_t count,
                                      uint64_t numel, uint32_t min_key, float* out, bool accumulate, uint32_t* status,
                                      void* stream) {
  validateAndScatterOneBlockKernel<CheckMinKey><<<1, kOneBlockThreads, 0, device::streamOf(stream)>>>(
      payload, expected, count, numel, min_key, accumulate, out, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace TERSE_KIT_KERNEL_NS
}  // namespace terse::kit::sparse
