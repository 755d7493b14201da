// topk's CUDA launchers (topk.cu), called by topk.cc for device tensors. Each queues work on `stream` (a cudaStream_t)
// and returns without waiting for it.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs topk (default ratio 0.01:
// k = 671089 of n = 64M, 1%; decompress accumulates onto the output). DRAM traffic sets a floor under each call's time,
// so its bound, 8 B (a device copy's 4 read + 4 written) over the call's bytes, is the fastest it can run as a fraction
// of a device copy. The input (256 MiB) does not fit in the 50 MB L2, so every pass over it reads 4 B:
//   compress     selectTopK (terse/kit/topk_candidates.cuh), the fast path, which normal data takes: the top
//                digit's histogramKernel reads every element, 4 B; the DeviceSelect of the candidates (keys at or
//                above the boundary bin: 1% selected + about 0.16% in that bin of 1/32 octave at |g| = 2.58 sigma,
//                m = 1.16% of n) reads every element again, 4 B, and writes m (value, index) pairs, 8 m / n = 0.09 B;
//                the two lower digits' histograms and the compaction's count and write read the pairs, 4 x 0.09 B;
//                k values and k indices written, 0.08 B. Total 8.55 B; bound 0.94x. (The 6 MB of pairs likely stay
//                in the 50 MB L2, which would make it 8.17 B of DRAM traffic.) Before the fast path this was five
//                passes over the input (three histograms, count, write: 20.08 B, bound 0.40x), and it still is for
//                data whose boundary bin is too dense for the candidate buffer (heavily tied values).
//                Selection bound: any exact top-k reads the input once and writes k values and indices, 4.08 B, so
//                it could run at 1.96x a device copy; this compress moves 2.1x that.
//                The bench's reference, a cub radix sort of (key, index) pairs, moves about 80 B: 12 B to build the
//                pairs, a 4 B histogram pass, and passes of 16 B over keys and values (four, if cub takes the 31 key
//                bits 8 at a time).
//   decompress   validateSparseKernel reads the payload, 8 k / n = 0.08 B; scatterKernel re-reads it (5.4 MB, from
//                L2) and adds each value onto out[index]: 4 read + 4 written per entry, 0.08 B useful, but with 1%
//                selected each entry has a 32-byte sector of its own, 32 read + 32 written, 0.64 B. Total 0.16 B
//                useful (bound 50x), 0.72 B in sectors (bound 11x): accumulating a sparse payload is a scatter, not a
//                dense pass, so the stream synchronization for the verdict and the launches, not traffic, likely set
//                its time.
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
// The same payload in one launch (terse/kit/topk_one_block.cuh), with no workspace.
void compressOneBlock(const device::Prefix& prefix, const float* x, uint64_t numel, uint64_t k, std::byte* payload,
                      void* stream);

// Raises `status` unless a payload of payloadBytes(count) bytes starts with `expected` (header and count) and holds
// strictly increasing indices below numel and finite values: everything sparse::readSparse checks once the size fits.
void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t* status, void* stream);

// out = the payload's entries scattered onto zeros (or added onto out), for a payload validate accepted; with a `gate`
// (a deferred verdict, terse/kit/device.hpp) queued right behind validate, nothing is written when validate raised it.
void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);

// validate and decode in one launch of one block, for a small tensor: raises `status` and leaves out untouched for a
// payload validate would refuse, else decodes it.
void validateAndDecodeOneBlock(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
                               float* out, bool accumulate, uint32_t* status, void* stream);

}  // namespace terse::compressors::topk::cuda
