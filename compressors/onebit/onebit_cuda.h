// onebit's CUDA launchers (onebit.cu), called by onebit.cc for device tensors. Each queues work on `stream` (a
// cudaStream_t) and returns without waiting for it.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs onebit (default scale
// two_means and bucket_size 512, whose two 4-byte scales are 0.016 B an element; decompress accumulates onto the
// output). DRAM traffic sets a floor under each call's time, so its bound, 8 B (a device copy's 4 read + 4 written)
// over the call's bytes, is the fastest it can run as a fraction of a device copy:
//   compress     scalesKernel: 4 read + 0.016 scales written; then signWordsKernel (terse/kit/pack_kernels.cuh): 4
//                read again + 0.125 written (one sign bit). 8.141 B; bound 0.98x. The sign pass does not need the
//                scales, but it reads the input again because the two are separate kernels and a 256 MiB input does
//                not stay in L2; that second read is what keeps compress below a copy. The 32-byte prefix comes first
//                from a one-block kernel, a fixed cost.
//   decompress   validateKernel reads the scales (0.016; every sign bit is valid, so only the last word's padding is
//                read, a fixed cost), then decodeCodesKernel: 0.125 bits + 0.016 scales + 4 output read + 4 output
//                written = 8.141 B. 8.156 B in all; bound 0.98x. Accumulating reads the output too, so decompress
//                cannot reach a copy. Plus one stream synchronization for the verdict: time, not traffic.
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

// out[i] = (or +=) the value of sign bit i, for a payload validate accepted; with a `gate` (a deferred verdict,
// terse/kit/device.hpp) queued right behind validate, nothing is written when validate raised it.
void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);

}  // namespace terse::compressors::onebit::cuda
