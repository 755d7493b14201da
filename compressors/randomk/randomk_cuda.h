// randomk's CUDA launchers (randomk.cu), called by randomk.cc for device tensors. Each queues work on `stream` (a
// cudaStream_t) and returns without waiting for it.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs randomk (default ratio
// 0.01, not unbiased: k = n / 100; decompress accumulates onto the output), in bytes per INPUT element, so each byte
// per selected coordinate counts 0.01. The indices are computed in registers (randomk_math.h's Feistel permutation):
// arithmetic, not traffic. A random 4-byte access moves a whole 32-byte DRAM sector, so the useful bytes and the
// sector bytes are both given; the bound is 8 B (a device copy's 4 read + 4 written) over the call's bytes:
//   compress     gatherKernel: x[pi(j)] read (useful 0.04, sectors 0.32) + values[j] written, coalesced (0.04).
//                0.08 B useful, 0.36 B in sectors; bound 100x useful, 22x in sectors. The 16-byte header comes first
//                from a one-block kernel, a fixed cost.
//   decompress   validateKernel reads only the 16-byte header (a fixed cost); scatterAddKernel: values read, coalesced
//                (0.04) + out[pi(j)] read and written (useful 0.04 + 0.04, sectors 0.32 + 0.32; the read brings the
//                sector in whole, so it is written back whole). 0.12 B useful, 0.68 B in sectors; bound 67x useful,
//                12x in sectors. Plus one stream synchronization for the verdict: time, not traffic.
//   Sector counts are upper bounds: at 1% two selected elements share a sector now and then (about 3% fewer sectors).
//   Bytes are unlikely to be what limits randomk: a 256 MiB device copy takes on the order of 0.1 ms at a few TB/s,
//   so these bounds leave a few microseconds a call, about what the launches and (decompress) the synchronization
//   cost, and scattered sector accesses do not reach streaming bandwidth.
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

// out = 0 (unless accumulating), then out[selectedIndex(pi, j)] += values[j]: the host's order of operations. With a
// `gate` (a deferred verdict, terse/kit/device.hpp) queued right behind validate, nothing is written when it is raised.
void decode(const std::byte* payload, const Permutation& pi, uint64_t k, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);

}  // namespace terse::compressors::randomk::cuda
