// natural's CUDA launchers (natural.cu), called by natural.cc for device tensors. Each queues work on `stream` (a
// cudaStream_t) and returns without waiting for it.
//
// Memory traffic per f32 element (device), and so each call's bound as a fraction of a device copy (8 B: 4 read + 4
// written), as tests/bench/compressors_device_bench.cc runs natural (decompress accumulates onto the output):
//   compress     exponentsKernel: 4 read + 1 exponent byte written; signWordsKernel (terse/kit/pack_kernels.cuh): 4
//                read again + 1/8 written. 9.125 B; bound 0.88x. The second read of the input is the price of the
//                kit's sign kernel; one kernel writing both would move 5.125 B (1.56x). Philox draws are arithmetic.
//   decompress   validateKernel reads the exponent bytes (1: 255 is invalid), then decodeKernel: 1 exponent + 1/8
//                sign + 4 output read + 4 output written. 10.125 B; bound 0.79x. Plus one stream synchronization for
//                the verdict: time, not traffic.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::natural::cuda {

namespace device = kit::device;

// Where things are in a payload (natural.cc's layout).
struct Shape {
  uint64_t numel;
  uint64_t exponents_offset;  // the prefix's size
  uint64_t signs_offset;      // after the exponent bytes, padded to 8
};

// Writes the whole payload: `prefix`, the exponent bytes and their zero padding, the sign words, rounding with draws
// of `rounding_bits` bits (8, 16 or 24: sdk/philox.hpp's drawAt). An input that is inf or NaN (or rounds up past
// 2^127) leaves exponent 255, which validate refuses.
void compress(const Shape& shape, const device::Prefix& prefix, const float* x, const sdk::PhiloxStream& rng,
              unsigned rounding_bits, std::byte* payload, void* stream);
// Raises `status` unless the payload holds `expected`, no exponent of 255, zero padding bytes and zero padding sign
// bits: everything natural.cc's host decoder checks.
void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, uint32_t* status,
              void* stream);
// out[i] = (or +=) element i's value, for a payload validate accepted; with a `gate` (a deferred verdict,
// terse/kit/device.hpp) queued right behind validate, nothing is written when validate raised it.
void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);

}  // namespace terse::compressors::natural::cuda
