// none's CUDA launchers (none.cu), called by none.cc for device tensors. Both queue work on `stream` (a cudaStream_t)
// and return without waiting for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"

namespace terse::compressors::none::cuda {

namespace device = kit::device;

// out[i] = in[i] for i < n: the identity, as a device-to-device copy.
void encode(const float* in, float* out, uint64_t n, void* stream);

// If the payload starts with `expected` (the header): out[i] = decodeValue(wire[i], out[i], accumulate) for the n
// values after it. Otherwise raises `status` and writes nothing.
void decode(const std::byte* payload, const device::Prefix& expected, float* out, uint64_t n, bool accumulate,
            uint32_t* status, void* stream);

}  // namespace terse::compressors::none::cuda
