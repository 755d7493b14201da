// qsgd's CUDA launchers (qsgd.cu), called by qsgd.cc for device tensors. Each queues work on `stream` (a cudaStream_t)
// and returns without waiting for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::qsgd::cuda {

namespace device = kit::device;

// The code widths qsgd can produce: sign + bitsFor(levels) bits, levels in [1, 2^24 - 1] (qsgd.cc checks that its
// own kMaxLevels fits). The device kernels are built for these widths only.
inline constexpr unsigned kMinCodeBits = 2;
inline constexpr unsigned kMaxCodeBits = 25;

// Where things are in a payload and how it was made (qsgd.cc's layout).
struct Shape {
  uint64_t numel;
  uint64_t bucket;   // effective bucket size, in [1, numel] (1 for an empty tensor)
  uint64_t buckets;  // ceil(numel / bucket)
  int32_t levels;    // s
  uint32_t mag_bits;
  uint32_t code_bits;  // mag_bits + 1
  uint64_t norms_offset;
  uint64_t words_offset;
};

// Writes the whole payload: `prefix`, the bucket norms, the zero padding after them and the packed codes, rounding
// with draws of `rounding_bits` bits (8, 16 or 24: sdk/philox.hpp's drawAt).
void compress(const Shape& shape, const device::Prefix& prefix, const float* x, const sdk::PhiloxStream& rng,
              unsigned rounding_bits, std::byte* payload, void* stream);

// Raises `status` unless the payload holds `expected`, finite norms >= 0, zero padding bytes and bits, and (when
// check_codes) only codes with a magnitude <= levels: everything qsgd.cc's host decoder checks.
void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, bool check_codes,
              uint32_t* status, void* stream);

// out[i] = (or +=) the value of code i, for a payload validate accepted.
void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream);

}  // namespace terse::compressors::qsgd::cuda
