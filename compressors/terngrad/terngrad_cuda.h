// terngrad's CUDA launchers (terngrad.cu), called by terngrad.cc for device tensors. Each queues work on `stream` (a
// cudaStream_t) and returns without waiting for it.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs terngrad (default
// bucket_size 512, whose 4-byte scaler is 0.008 B an element; 2-bit codes, 0.25 B; decompress accumulates onto the
// output). DRAM traffic sets a floor under each call's time, so its bound, 8 B (a device copy's 4 read + 4 written)
// over the call's bytes, is the fastest it can run as a fraction of a device copy:
//   compress     cudaMemsetAsync zeroes the scalers for atomicMax (0.008 written); maxAbsKernel: 4 read + one
//                atomicMax per bucket (at most 0.008 read + 0.008 written; the scalers are small enough that they
//                likely stay in L2); then quantizeKernel (terse/kit/pack_kernels.cuh): 4 read again (the codes need
//                the finished scaler) + 0.008 scaler read + 0.25 codes written. 8.281 B; bound 0.97x. The scaler
//                arrays are under 0.04 B of it; the second read of the input is what keeps compress below a copy.
//                Philox draws are arithmetic, not traffic, so the rounding_bits 16 and 8 variants move the same bytes.
//                The 32-byte prefix comes first from a one-block kernel, a fixed cost.
//   decompress   validateKernel reads every code word (0.25: code 3 is invalid at any scaler) and the scalers (0.008),
//                then decodeCodesKernel: 0.25 codes + 0.008 scaler + 4 output read + 4 output written = 8.258 B.
//                8.516 B in all; bound 0.94x. Accumulating reads the output too, so decompress cannot reach a copy.
//                Plus one stream synchronization for the verdict: time, not traffic.
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

// out[i] = (or +=) the value of code i, for a payload validate accepted; with a `gate` (a deferred verdict,
// terse/kit/device.hpp) queued right behind validate, nothing is written when validate raised it.
void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);

}  // namespace terse::compressors::terngrad::cuda
