// dgc's CUDA launchers (dgc.cu), called by dgc.cc for device tensors. plan() synchronizes `stream` once per counting
// pass (dgc is variable-size: the count must reach the host before compress returns, and the host decides each next
// step from the counts, as dgc_select.h does); write, validate and decode queue work and return.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs dgc (defaults: ratio 0.01,
// sample_ratio 0.01, max_passes 4; k = s = 671089 of n = 64M; decompress accumulates onto the output). DRAM traffic
// sets a floor under each call's time, so its bound, 8 B (a device copy's 4 read + 4 written) over the call's bytes, is
// the fastest it can run as a fraction of a device copy. The input (256 MiB) does not fit in the 50 MB L2; the sample
// (2.7 MB) does. In the common case, one counting pass (the first threshold aims at 1.05 k, inside [0.8k, 1.3k]):
//   compress     sampleKernel gathers s elements, one in each stratum of about 100: 4 s / n = 0.04 B useful, but
//                each gather reads a 32-byte sector of its own, 0.32 B; the sample written, 0.04 B. The radix select
//                over the sample (three histograms) and countPassKernel's sample counts read it from L2.
//                countPassKernel reads x, 4 B (then one synchronization). The compaction by that threshold, which
//                takes every key above it, or at or above it (ties are split only where several elements share the
//                threshold's key and k falls strictly among them): one DeviceSelect reads x, 4 B, and writes count
//                (about 1.05 k) values and indices, 0.084 B. Total
//                about 8.44 B (8.2 B counting useful bytes only); bound 0.95x. Each further counting pass adds 4 B; a
//                threshold whose ties are split takes the tiled compaction instead (countKernel and writeKernel, 8 B,
//                as before 2026-12-05: 12.4 B in all); the exact fallback adds a radix select over x, 12 B (worst
//                case, four passes and the fallback, about 36 B).
//                Selection bound: any exact top-k reads the input once and writes k values and indices, 4.08 B, so
//                it could run at 1.96x a device copy; this compress moves 2.1x that. countPassKernel and the
//                DeviceSelect both read x only to compare keys against the same threshold; fusing them would need
//                the count before the write, which is what the host waits for.
//   decompress   the count from the payload's size (no read back), then as topk: validateSparseKernel reads the
//                payload, 8 count / n = 0.084 B; scatterKernel re-reads it (from L2) and adds each value onto
//                out[index]: 4 read + 4 written per entry, 0.084 B useful, 32 + 32 B per entry in 32-byte sectors,
//                0.67 B. Total 0.17 B useful (bound 48x), 0.76 B in sectors (bound 11x): a scatter, not a dense pass,
//                so the verdict's synchronization and the launches, not traffic, likely set its time.
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
  uint32_t cut = 0;            // when !exact: every key > cut plus (count - greater) ties, lowest index first
  uint64_t greater = 0;        // keys strictly above cut
  uint64_t greater_equal = 0;  // keys at or above cut (count == greater or == this: no tie is split)
  uint64_t count = 0;          // entries selected, in [minCount(k), maxCount(k)]
  bool exact = false;          // select exactly k by the exact top-k instead
  bool nonfinite = false;      // the tensor holds inf or NaN (compress refuses it, as the host does)
  int passes = 0;              // counting passes over the tensor (0 when exact from the start)
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

// out = the payload's entries scattered onto zeros (or added onto out), for a payload validate accepted; with a `gate`
// (a deferred verdict, terse/kit/device.hpp) queued right behind validate, nothing is written when validate raised it.
void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);

// The exact selection of a small tensor (1 <= k <= n, n at most terse/kit/one_block.hpp's cut) in one launch of one
// block, no workspace: the payload `write` gives for an exact plan, and `nonfinite` (clear) raised for an inf or NaN
// element, which the caller reads after synchronizing `stream` (the plan's counting pass reads it so).
void selectOneBlock(const device::Prefix& prefix, const float* x, uint64_t n, uint64_t k, uint32_t* nonfinite,
                    std::byte* payload, void* stream);

// validate and decode in one launch of one block (a small tensor): raises `status` and leaves out untouched for a
// payload validate would refuse, else decodes it.
void validateAndDecodeOneBlock(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
                               float* out, bool accumulate, uint32_t* status, void* stream);

}  // namespace terse::compressors::dgc::cuda

#endif  // TERSE_COMPRESSOR_CUDA
