// bf16's CUDA launchers (bf16.cu), called by the plugin (bf16.cc through terse/kit/cast16.hpp) for device
// tensors. Both queue work on `stream` (a cudaStream_t) and return without waiting for it.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs bf16 (default parameters;
// decompress accumulates onto the output). DRAM traffic sets a floor under each call's time, so its bound, 8 B (a
// device copy's 4 read + 4 written) over the call's bytes, is the fastest it can run as a fraction of a device copy:
//   compress     encodeKernel (terse/kit/cast_kernels.cuh): 4 read + 2 written = 6 B; bound 1.33x. The 16-byte
//                header comes first from a one-block kernel, a fixed cost that does not grow with N.
//   decompress   decodeKernel, the only pass (it checks the header itself): 2 payload read + 4 output read + 4 output
//                written = 10 B; bound 0.80x. Accumulating reads the output too, so decompress cannot reach a copy
//                although its payload is half a copy's input. Plus one stream synchronization for the verdict: time,
//                not traffic.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"

namespace terse::compressors::bf16::cuda {

namespace device = kit::device;

// out[i] = encodeValue(in[i]) for i < n (bf16_math.h).
void encode(const float* in, uint16_t* out, uint64_t n, void* stream);

// If the payload starts with `expected` (the header): out[i] = decodeValue(wire[i]), or out[i] += it when
// accumulate, for the n 16-bit values after it. Otherwise raises `status` and writes nothing.
void decode(const std::byte* payload, const device::Prefix& expected, float* out, uint64_t n, bool accumulate,
            uint32_t* status, void* stream);

}  // namespace terse::compressors::bf16::cuda
