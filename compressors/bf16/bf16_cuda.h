// bf16's CUDA launchers (bf16.cu), called by the plugin (bf16.cc through terse/kit/cast16.hpp) for device
// tensors. Both queue work on `stream` (a cudaStream_t) and return without waiting for it.
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
