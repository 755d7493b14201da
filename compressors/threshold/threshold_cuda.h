// threshold's CUDA launchers (threshold.cu), called by threshold.cc for device tensors. compress synchronizes `stream`
// (a variable-size payload: the count must reach the host); validate and decode queue work and return.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs threshold (tau 2.576, which
// about 1% of its standard-normal input reaches: count c ~ 0.01 n of n = 64M; decompress accumulates onto the output).
// DRAM traffic sets a floor under each call's time, so its bound, 8 B (a device copy's 4 read + 4 written) over the
// call's bytes, is the fastest it can run as a fraction of a device copy. The input (256 MiB) does not fit in the 50 MB
// L2:
//   compress     cub::DeviceSelect::If over (value, index) entries of x (one pass, decoupled look-back): 4 read + c
//                values and c indices written (the indices parked past n values), 0.08 B; nonfiniteKernel re-reads
//                the values (2.7 MB, from L2); the count to the host (one synchronization); the c indices copied
//                down to their offset 24 + 4 c, 0.08 B read and written. Total 4.16 B; bound 1.92x. cub's tile
//                states (a few bytes per tile of thousands of elements) stay in L2. Until 2026-12-05 a second
//                DeviceSelect over the indices read x again (8.08 B, bound 0.99x); it still does when more than half
//                of the elements are sent, where the parked indices would overlap their destination.
//   decompress   the count from the payload's size (no read back); validateSparseKernel<true> reads the payload, 8 c /
//   n =
//                0.08 B; scatterKernel re-reads it (from L2) and adds each value onto out[index]: 4 read + 4 written
//                per entry, 0.08 B useful, 32 + 32 B per entry in 32-byte sectors, 0.64 B. Total 0.16 B useful (bound
//                50x), 0.72 B in sectors (bound 11x): a scatter, not a dense pass, so the verdict's synchronization
//                and the launches, not traffic, likely set its time.
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

// out = the entries scattered onto zeros (or added onto out), for a payload validate accepted; with a `gate` (a
// deferred verdict, terse/kit/device.hpp) queued right behind validate, nothing is written when validate raised it.
void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);

// validate and decode in one launch of one block (a small tensor: terse/kit/one_block.hpp): raises `status` and leaves
// out untouched for a payload validate would refuse, else decodes it.
void validateAndDecodeOneBlock(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
                               uint32_t min_key, float* out, bool accumulate, uint32_t* status, void* stream);

}  // namespace terse::compressors::threshold::cuda

#endif  // TERSE_COMPRESSOR_CUDA
