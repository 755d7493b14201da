// topk's CUDA launchers (topk.cu), called by topk.cc for device tensors. Each queues work on `stream` (a cudaStream_t)
// and returns without waiting for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"

namespace terse::compressors::topk::cuda {

namespace device = kit::device;

// Workspace bytes compress needs to keep k of numel elements: 0 when nothing is selected (k == 0, or k >= numel: every
// element is sent). Asks cub for its scan's temporary storage, so the device the tensor lives on must be current.
uint64_t workspaceBytes(uint64_t numel, uint64_t k);

// Writes the whole payload (terse/kit/sparse_payload.hpp): `prefix` (header and count = k), then the k values and their
// indices in index order, the selection terse/kit/topk_select.hpp makes on the host. `workspace` holds
// workspaceBytes(numel, k) bytes.
void compress(const device::Prefix& prefix, const float* x, uint64_t numel, uint64_t k, std::byte* workspace,
              std::byte* payload, void* stream);

// Raises `status` unless a payload of payloadBytes(count) bytes starts with `expected` (header and count) and holds
// strictly increasing indices below numel and finite values: everything sparse::readSparse checks once the size fits.
void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t* status, void* stream);

// out = the payload's entries scattered onto zeros (or added onto out), for a payload validate accepted.
void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream);

}  // namespace terse::compressors::topk::cuda
