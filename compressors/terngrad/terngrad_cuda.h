// terngrad's CUDA launchers (terngrad.cu), called by terngrad.cc for device tensors. Each queues work on `stream` (a
// cudaStream_t) and returns without waiting for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::terngrad::cuda {

namespace device = kit::device;

// Where things are in a payload (terngrad.cc's layout).
struct Shape {
  uint64_t numel;
  uint64_t bucket;   // effective bucket size, in [1, numel] (1 for an empty tensor)
  uint64_t buckets;  // ceil(numel / bucket)
  uint64_t scales_offset;
  uint64_t words_offset;
};

// Writes the whole payload: `prefix`, the scalers, the zero padding after them and the packed 2-bit codes, drawing
// with `rounding_bits` bits (8, 16 or 24: sdk/philox.hpp's drawAt).
void compress(const Shape& shape, const device::Prefix& prefix, const float* x, const sdk::PhiloxStream& rng,
              unsigned rounding_bits, std::byte* payload, void* stream);

// Raises `status` unless the payload holds `expected`, finite scalers >= 0, zero padding bytes and bits and no code 3:
// everything terngrad.cc's host decoder checks.
void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, uint32_t* status,
              void* stream);

// out[i] = (or +=) the value of code i, for a payload validate accepted.
void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream);

}  // namespace terse::compressors::terngrad::cuda
