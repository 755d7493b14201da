// tests/bench/topk_sort_reference.h: the full-sort reference of the top-k benchmark.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/common/cuda.h"
#include "terse/kit/topk_math.hpp"
#include "tests/bench/topk_sort_reference.h"

namespace terse::bench {

// Plain cub, or a binary's own wrapped copy (terse-bench-topk-cuda wraps it, as a plugin does).
namespace cub = CUB_NS_QUALIFIER;

namespace {

// The sort covers the 31 bits a magnitude key has (the sign bit is always 0).
constexpr int kKeyBits = 31;

__global__ void keysKernel(const float* __restrict__ x, int n, uint32_t* __restrict__ keys,
                           uint32_t* __restrict__ indices) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    keys[i] = kit::topk::magnitudeKey(x[i]);
    indices[i] = static_cast<uint32_t>(i);
  }
}

int itemsOf(uint64_t numel) {
  if (numel >= (uint64_t{1} << 31)) {
    throw std::invalid_argument("the sort reference takes fewer than 2^31 elements, got " + std::to_string(numel));
  }
  return static_cast<int>(numel);
}

}  // namespace

TopKSortReference::TopKSortReference(uint64_t numel, cudaStream_t stream)
    : numel_(numel),
      keys_in_(4 * numel, stream),
      keys_out_(4 * numel, stream),
      indices_in_(4 * numel, stream),
      indices_out_(4 * numel, stream) {
  size_t temp_bytes = 0;
  TERSE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, temp_bytes, keys_in_.as<uint32_t>(), keys_out_.as<uint32_t>(), indices_in_.as<uint32_t>(),
      indices_out_.as<uint32_t>(), itemsOf(numel), 0, kKeyBits, stream));
  temp_ = cuda::DeviceBuffer(temp_bytes, stream);
}

void TopKSortReference::run(const float* x, cudaStream_t stream) {
  const int n = itemsOf(numel_);
  if (n == 0) return;
  const int blocks = std::min((n + 255) / 256, 1 << 16);
  keysKernel<<<blocks, 256, 0, stream>>>(x, n, keys_in_.as<uint32_t>(), indices_in_.as<uint32_t>());
  TERSE_CUDA_CHECK(cudaGetLastError());
  size_t temp_bytes = temp_.size();
  TERSE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp_.data(), temp_bytes, keys_in_.as<uint32_t>(),
                                                             keys_out_.as<uint32_t>(), indices_in_.as<uint32_t>(),
                                                             indices_out_.as<uint32_t>(), n, 0, kKeyBits, stream));
}

std::vector<uint32_t> TopKSortReference::topIndices(uint64_t k, cudaStream_t stream) const {
  std::vector<uint32_t> top(static_cast<size_t>(std::min(k, numel_)));
  indices_out_.copyToHost(top.data(), 4 * top.size(), stream);
  TERSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::sort(top.begin(), top.end());
  return top;
}

}  // namespace terse::bench
