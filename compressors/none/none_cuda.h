// none's CUDA launchers (none.cu), called by none.cc for device tensors. Both queue work on `stream` (a cudaStream_t)
// and return without waiting for it.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs none (no parameters;
// decompress accumulates onto the output). DRAM traffic sets a floor under each call's time, so its bound, 8 B (a
// device copy's 4 read + 4 written) over the call's bytes, is the fastest it can run as a fraction of a device copy:
//   compress     cudaMemcpyAsync of the values: 4 read + 4 written = 8 B; bound 1.00x (it is a device copy). The
//                16-byte header comes first from a one-block kernel, a fixed cost that does not grow with N.
//   decompress   decodeKernel (terse/kit/cast_kernels.cuh), the only pass (it checks the header itself): 4 payload
//                values read + 4 output read + 4 output written = 12 B; bound 0.67x. Accumulating has to read the
//                output too, which is why decompress cannot reach a copy. Plus one stream synchronization for the
//                verdict: time, not traffic.
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
