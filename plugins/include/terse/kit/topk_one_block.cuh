// The exact top-k of a small tensor in one launch: topk_candidates.cuh's selection (the host's keys, digits, pick rule
// and compaction in index order, ties to the lower index), run by one block of 1024 threads that also writes the
// payload's prefix. For the tensors of a real model this is about launches, not bytes:
//
//   the plugin's grid-wide way queues 18 launches: the prefix, the top digit's histogram reset, three rounds of
//   histogram and pick (the lower two on two ways), cub's two-kernel DeviceSelect, the compaction's counts on two ways,
//   cub's two-kernel scan and the writes on two ways (21 until the picks cleared the next level's bins and the top
//   digit's histogram kernel the State). On the H200 a
//   ResNet-50 step of 161 tensors, most of them batch-norm vectors of 64 to 2,048 elements, with top-k 1% + error
//   feedback per tensor spent 0.38-0.49 of the step in the hook, against 0.16 when each bucket was compressed as one
//   tensor (results/reference/gpu/README.md): the cost per tensor, launches and the decode's verdict synchronization,
//   not the selection's bytes, set that step.
//
// The block reads the tensor four times (three histogram rounds and the compaction), from L2 at these sizes, and keeps
// its histogram (8,192 counters, 32 KiB) and the running cut in shared memory, so nothing goes to a workspace and
// nothing is read back. Where a whole GPU's worth of blocks beats one block plus 19 launches is for the device to say:
// terse-bench-topk-cuda times both at 2^10 to 2^18 elements, and topk.cc (and dgc.cc, for its exact selection) takes
// this path up to terse/kit/one_block.hpp's cut.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <string>

#include "terse/kit/device.cuh"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_select_kernels.cuh"

namespace terse::kit::topk::cuda {

inline namespace TERSE_KIT_KERNEL_NS {  // unique per plugin: device.cuh

// One block of this many threads: the most a block may have, so that each histogram round is as few loads per thread
// as one SM allows.
inline constexpr unsigned kOneBlockThreads = 1024;
// Consecutive elements per thread in a compaction tile (a thread's scan value is G and T at its first element).
inline constexpr unsigned kOneBlockItems = 4;

// The cut narrowed so far, shared by the block: the prefix of the keys picked so far and how many keys lie above it.
struct OneBlockCut {
  uint32_t prefix;
  uint64_t greater;
};

// Warp scans, not cub's default raking: a raking thread holds a 32-entry segment of 64-bit sums in registers, which at
// 1,024 threads (64 registers each) spilled 584 bytes a thread; warp scans fit with none (ptxas, sm_90).
using OneBlockScan = cub::BlockScan<uint64_t, kOneBlockThreads, cub::BLOCK_SCAN_WARP_SCANS>;

// Round `Level` of the radix select (topk_select_kernels.cuh's histogramKernel and pickKernel, in one block): counts
// digit `Level` of every key of x[0..n) whose higher digits equal cut.prefix, then finds the bin that holds the need-th
// largest key (need = k - cut.greater) by the host's pickBin rule and narrows `cut` to it. Ends on a barrier, so that
// the next round (or the compaction) reads the new cut and may clear `counts`.
// At level 0, with CheckNonFinite, it also raises `nonfinite` when a key is inf's or NaN's (dgc refuses those).
template <int Level, bool CheckNonFinite>
__device__ __forceinline__ void oneBlockRound(const float* __restrict__ x, uint32_t n, uint64_t k, uint32_t* counts,
                                              OneBlockScan::TempStorage& temp, OneBlockCut& cut, uint32_t* nonfinite) {
  constexpr uint32_t kBins = 1u << digitBits(Level);
  // Bins per thread, counted from the top; with fewer bins than threads (the 256 of the last digit), one each.
  constexpr uint32_t kPer = kBins >= kOneBlockThreads ? kBins / kOneBlockThreads : 1;
  static_assert(kBins < kOneBlockThreads || kBins % kOneBlockThreads == 0, "a thread owns whole bins");
  for (uint32_t b = threadIdx.x; b < kBins; b += kOneBlockThreads) counts[b] = 0;
  __syncthreads();  // the counters are clear, and the last round's cut is written
  const uint32_t prefix = Level == 0 ? 0u : cut.prefix;
  const uint64_t greater = Level == 0 ? 0u : cut.greater;
  for (uint64_t i = threadIdx.x; i < n; i += kOneBlockThreads) {  // striped: coalesced
    const uint32_t key = magnitudeKey(x[i]);
    if (prefixOf(key, Level) == prefix) atomicAdd(&counts[digitOf(key, Level)], 1u);
    if (Level == 0 && CheckNonFinite && isNonFiniteKey(key)) device::raiseStatus(nonfinite);
  }
  __syncthreads();
  const uint32_t first = threadIdx.x * kPer;
  uint64_t run = 0;
  if (first < kBins) {
    for (uint32_t j = 0; j < kPer; ++j) run += counts[kBins - 1 - (first + j)];
  }
  uint64_t above = 0;
  OneBlockScan(temp).ExclusiveSum(run, above);
  const uint64_t need = k - greater;
  // Exactly one thread holds the need-th key in its run (need <= the keys with the prefix, as k <= n). It walks its
  // bins in shared memory again: nothing writes them before the barrier below.
  if (above < need && need <= above + run) {
    uint64_t sum = above;
    for (uint32_t j = 0; j < kPer; ++j) {
      const uint32_t own = counts[kBins - 1 - (first + j)];
      if (sum + own >= need) {
        cut.greater = greater + sum;
        cut.prefix = (prefix << digitBits(Level)) | (kBins - 1 - (first + j));
        break;
      }
      sum += own;
    }
  }
  __syncthreads();  // the cut is written; the scan's storage and the counters may be reused
}

// The whole payload of topk (sparse_payload.hpp: the prefix, then k values and their indices in index order) for
// x[0..n), in one block: the prefix bytes, then for 1 <= k < n the three rounds and the compaction by the cut
// (topk_select_kernels.cuh's writeKernel over tiles of kOneBlockThreads x kOneBlockItems elements, the tiles' packed
// counts carried from one to the next), and for k == n every element. n < 2^32, so the packed G and T stay below 2^32.
// With CheckNonFinite it raises `nonfinite` (a host-mapped status word: device.hpp's StatusWords) when any element is
// inf or NaN, for a caller that refuses those (dgc); for k > 0 only, as the host checks. A template on it, so that
// topk's kernel carries no such test: it fits its 64 registers with no spill, where dgc's spills 4 bytes (sm_90).
template <bool CheckNonFinite>
__global__ void __launch_bounds__(kOneBlockThreads, 1)
    selectOneBlockKernel(device::Prefix prefix, const float* __restrict__ x, uint32_t n, uint32_t k,
                         std::byte* __restrict__ payload, uint32_t* nonfinite) {
  __shared__ uint32_t counts[kMaxBins];
  __shared__ OneBlockScan::TempStorage temp;
  __shared__ OneBlockCut cut;
  if (threadIdx.x < prefix.size) payload[threadIdx.x] = device::prefixByte(prefix, threadIdx.x);
  float* values = reinterpret_cast<float*>(payload + sparse::kFixedBytes);
  uint32_t* indices = reinterpret_cast<uint32_t*>(payload + sparse::kFixedBytes + sizeof(float) * uint64_t{k});
  if (k == 0) return;
  if (k >= n) {  // every element in index order
    for (uint64_t i = threadIdx.x; i < n; i += kOneBlockThreads) {
      values[i] = x[i];
      indices[i] = static_cast<uint32_t>(i);
      if (CheckNonFinite && isNonFiniteKey(magnitudeKey(values[i]))) device::raiseStatus(nonfinite);
    }
    return;
  }
  oneBlockRound<0, CheckNonFinite>(x, n, k, counts, temp, cut, nonfinite);
  oneBlockRound<1, false>(x, n, k, counts, temp, cut, nullptr);
  oneBlockRound<2, false>(x, n, k, counts, temp, cut, nullptr);
  const uint32_t cut_key = cut.prefix;
  const uint64_t quota = k - cut.greater;
  constexpr uint64_t kTileElements = kOneBlockThreads * kOneBlockItems;
  uint64_t carried = 0;  // packed (G << 32 | T) of the elements before the tile, the same in every thread
  // 64-bit positions: a cut moved by TERSE_SPARSE_ONE_BLOCK_MAX may bring n near 2^32, where a 32-bit one would wrap.
  for (uint64_t base = 0; base < n; base += kTileElements) {  // block-uniform: the barriers below are safe
    const uint64_t first = base + threadIdx.x * kOneBlockItems;
    float v[kOneBlockItems];
    uint64_t c = 0;
    for (unsigned j = 0; j < kOneBlockItems; ++j) {
      v[j] = first + j < n ? x[first + j] : 0.0f;
      if (first + j < n) c += countOf(magnitudeKey(v[j]), cut_key);
    }
    uint64_t before = 0, tile = 0;
    OneBlockScan(temp).ExclusiveSum(c, before, tile);
    uint64_t g = (carried >> 32) + (before >> 32), t = (carried & kLow) + (before & kLow);
    for (unsigned j = 0; j < kOneBlockItems && first + j < n; ++j) {
      const uint32_t key = magnitudeKey(v[j]);
      if (takeByCut(key, cut_key, t < quota ? quota - t : 0)) {
        const uint64_t pos = g + (t < quota ? t : quota);
        if (pos < k) {  // always, for a true cut; the test keeps a wrong one inside the payload
          values[pos] = v[j];
          indices[pos] = static_cast<uint32_t>(first + j);
        }
      }
      g += key > cut_key ? 1 : 0;
      t += key == cut_key ? 1 : 0;
    }
    carried += tile;
    __syncthreads();  // the next tile's scan reuses temp
    const uint64_t taken = carried & kLow;
    if ((carried >> 32) + (taken < quota ? taken : quota) >= k) break;  // all k written: the rest holds none
  }
}

// Queues selectOneBlockKernel on `st`: the whole topk payload of x[0..n) (n < 2^32, k <= n) at `payload`, and with a
// `nonfinite` word, that word raised for an inf or NaN element.
inline void selectOneBlock(const device::Prefix& prefix, const float* x, uint64_t n, uint64_t k, std::byte* payload,
                           cudaStream_t st, uint32_t* nonfinite = nullptr) {
  // The prefix's threads write while others write the values from byte kFixedBytes on: the two must not overlap.
  if (prefix.size > sparse::kFixedBytes) {
    throw sdk::Error(TERSE_ERR_INTERNAL, "selectOneBlock: a prefix of " + std::to_string(prefix.size) +
                                             " bytes, more than the sparse payload's " +
                                             std::to_string(sparse::kFixedBytes));
  }
  const auto n32 = static_cast<uint32_t>(n), k32 = static_cast<uint32_t>(k);
  if (nonfinite != nullptr) {
    selectOneBlockKernel<true><<<1, kOneBlockThreads, 0, st>>>(prefix, x, n32, k32, payload, nonfinite);
  } else {
    selectOneBlockKernel<false><<<1, kOneBlockThreads, 0, st>>>(prefix, x, n32, k32, payload, nullptr);
  }
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace TERSE_KIT_KERNEL_NS
}  // namespace terse::kit::topk::cuda
