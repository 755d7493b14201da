// threshold's CUDA launchers (threshold.cu), called by threshold.cc for device tensors. compress synchronizes `stream`
// (a variable-size payload: the count must reach the host); validate and decode queue work and return.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"

#if TERSE_COMPRESSOR_CUDA

namespace terse::compressors::threshold::cuda {

namespace device = kit::device;

// Workspace bytes compress needs for numel elements (a counter and cub's selection storage). Asks cub, so the
// tensor's device must be current.
uint64_t workspaceBytes(uint64_t numel);

// What compress found: the number of elements sent, or that a sent element is not finite (then the payload is
// incomplete and the caller refuses the gradient, as the host does).
struct Selection {
  uint64_t count;
  bool nonfinite;
};

// Writes `header` (the 16-byte payload header), then the values with key >= min_key and their indices, in index
// order, and the count; synchronizes `stream` once to learn the count. The output holds payloadBytes(numel) bytes.
// `status` (clear) is raised by a non-finite sent value.
Selection compress(const device::Prefix& header, const float* x, uint64_t numel, uint32_t min_key, std::byte* workspace,
                   std::byte* payload, const device::StatusWords::Lease& status, void* stream);

// Raises `status` unless a payload of payloadBytes(count) bytes starts with `expected` (header and count) and holds
// strictly increasing indices below numel and finite values with keys >= min_key (sparse::readSparse's checks).
void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t min_key, uint32_t* status, void* stream);

// out = the entries scattered onto zeros (or added onto out), for a payload validate accepted.
void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream);

}  // namespace terse::compressors::threshold::cuda

#endif  // TERSE_COMPRESSOR_CUDA
