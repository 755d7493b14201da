// onebit's CUDA launchers (onebit.cu), called by onebit.cc for device tensors. Each queues work on `stream` (a
// cudaStream_t) and returns without waiting for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"

namespace terse::compressors::onebit::cuda {

namespace device = kit::device;

// Where things are in a payload and how it was made (onebit.cc's layout).
struct Shape {
  uint64_t numel;
  uint64_t bucket;             // effective bucket size, in [1, numel] (1 for an empty tensor)
  uint64_t buckets;            // ceil(numel / bucket)
  uint32_t scales_per_bucket;  // 2 (two_means) or 1 (mean_abs)
  uint64_t scales_offset;
  uint64_t words_offset;
};

// Writes the whole payload: `prefix`, the scales, the zero padding after them and the sign bits.
void compress(const Shape& shape, const device::Prefix& prefix, const float* x, std::byte* payload, void* stream);

// Raises `status` unless the payload holds `expected`, finite scales >= 0 and zero padding bytes and bits: everything
// onebit.cc's host decoder checks.
void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, uint32_t* status,
              void* stream);

// out[i] = (or +=) the value of sign bit i, for a payload validate accepted.
void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream);

}  // namespace terse::compressors::onebit::cuda
