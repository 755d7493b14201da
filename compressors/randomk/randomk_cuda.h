// randomk's CUDA launchers (randomk.cu), called by randomk.cc for device tensors. Each queues work on `stream` (a
// cudaStream_t) and returns without waiting for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "randomk_math.h"
#include "terse/kit/device.hpp"

namespace terse::compressors::randomk::cuda {

namespace device = kit::device;

// Writes the whole payload: `prefix` (the header), then values[j] = scale * x[selectedIndex(pi, j)] for j < k.
void compress(const device::Prefix& prefix, const float* x, const Permutation& pi, uint64_t k, float scale,
              std::byte* payload, void* stream);

// Raises `status` unless the payload starts with `expected` (the header); the caller has checked its size, and the
// values are not checked (the core sums them, as on the host).
void validate(const device::Prefix& expected, const std::byte* payload, uint32_t* status, void* stream);

// out = 0 (unless accumulating), then out[selectedIndex(pi, j)] += values[j]: the host's order of operations.
void decode(const std::byte* payload, const Permutation& pi, uint64_t k, float* out, bool accumulate, void* stream);

}  // namespace terse::compressors::randomk::cuda
