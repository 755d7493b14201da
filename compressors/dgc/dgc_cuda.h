// dgc's CUDA launchers (dgc.cu), called by dgc.cc for device tensors. plan() synchronizes `stream` once per counting
// pass (dgc is variable-size: the count must reach the host before compress returns, and the host decides each next
// step from the counts, as dgc_select.h does); write, validate and decode queue work and return.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"
#include "terse/sdk/philox.hpp"

#if TERSE_COMPRESSOR_CUDA

namespace terse::compressors::dgc::cuda {

namespace device = kit::device;

// What the host knows of a tensor's selection before it starts.
struct Shape {
  uint64_t n = 0;      // elements, < 2^32
  uint64_t k = 0;      // target count, 1 <= k <= n
  uint64_t s = 0;      // sample size (sampleCount), 0 when the tensor is not sampled (exact top-k from the start)
  int max_passes = 1;  // counting passes before the exact fallback
};

// dgc_select.h's Plan, as the device found it: the same numbers for the same input, seed, step and tensor.
struct Plan {
  uint32_t cut = 0;        // when !exact: every key > cut plus (count - greater) ties, lowest index first
  uint64_t greater = 0;    // keys strictly above cut
  uint64_t count = 0;      // entries selected, in [minCount(k), maxCount(k)]
  bool exact = false;      // select exactly k by the exact top-k instead
  bool nonfinite = false;  // the tensor holds inf or NaN (compress refuses it, as the host does)
  int passes = 0;          // counting passes over the tensor (0 when exact from the start)
};

// Workspace bytes for a tensor of numel elements, k selected, a sample of `samples` (0: not sampled): 0 when k == 0.
// Asks cub for its scan's temporary storage, so the device the tensor lives on must be current.
uint64_t workspaceBytes(uint64_t numel, uint64_t k, uint64_t samples);

// Decides the selection of x (device memory, shape.n floats) as dgc_select.h's plan does, sampling with `rng` (the
// host's PhiloxStream for the tensor). Queues its work on `stream` and synchronizes it once per counting pass.
// `workspace` holds workspaceBytes(shape.n, shape.k, shape.s) bytes.
Plan plan(const float* x, const Shape& shape, const sdk::PhiloxStream& rng, std::byte* workspace, void* stream);

// Writes the payload of `p` (a plan of the same x and workspace, not nonfinite): `prefix` (header and count = p.count),
// then the selected values and their indices in index order. Queued on `stream`, not waited for.
void write(const device::Prefix& prefix, const float* x, const Shape& shape, const Plan& p, std::byte* workspace,
           std::byte* payload, void* stream);

// Raises `status` unless a payload of payloadBytes(count) bytes starts with `expected` (header and count) and holds
// strictly increasing indices below numel and finite values: everything sparse::readSparse checks once the size fits.
void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t* status, void* stream);

// out = the payload's entries scattered onto zeros (or added onto out), for a payload validate accepted.
void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream);

}  // namespace terse::compressors::dgc::cuda

#endif  // TERSE_COMPRESSOR_CUDA
