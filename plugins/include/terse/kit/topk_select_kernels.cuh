// The exact selection of topk_select.hpp on the GPU, shared by topk.cu (the whole top-k) and dgc.cu (the threshold of
// DGC's sample, its exact fallback, and the compaction of whatever cut it settles on). The selection is a function of
// the keys alone: every key above the cut, plus the first (count - greater) keys equal to it in index order (greater =
// how many keys lie strictly above the cut), written in index order. The kernels find the host's cut with the host's
// keys and digits (topk_math.hpp: magnitudeKey, digitOf, prefixOf) and write the host's set in the host's order:
//
//   radix select   three rounds of (histogram, pick), one per digit (13, 10, 8 bits, most significant first). The
//                  histogram counts the digit of every key whose higher digits equal the prefix picked so far
//                  (shared-memory counters per block, added to the workspace's global ones); the pick, one block,
//                  finds the bin holding the need-th largest key with the host's pickBin rule and appends it to the
//                  prefix. The round's state (prefix, greater) stays in the workspace, so nothing is read back, and a
//                  caller may go on from it on the device (dgc reads the prefix as its next threshold).
//   compaction     with G(i) = keys above the cut and T(i) = keys equal to it among elements 0..i-1, element i is taken
//                  iff key > cut, or key == cut and T(i) < quota (= count - greater), and lands at G(i) + min(T(i),
//                  quota): exactly the host's compactByCut, whose ties go to the lower index. G and T are counted per
//                  tile of 4096 elements (packed as G << 32 | T: both stay below 2^32, so one 64-bit sum carries both),
//                  cub::DeviceScan gives the tiles' exclusive prefixes, and a block scan (cub::BlockScan) gives each
//                  element's own. A tile with nothing selected is skipped without reading it. The cut need not come
//                  from the radix select: any State {cut, greater} with count in [greater, greater + ties] works (dgc
//                  compacts by its sampled threshold).
//   fast path      topk_candidates.cuh's selectTopK, topk's whole selection: the same kernels, with the lower digits
//                  and the compaction on the candidates (the keys at or above the top digit's boundary bin, copied
//                  out in index order) when they fit the host's candidate buffer; the kernels below take a `mode` for
//                  it (State::mode, decided by the top digit's pick), and kAnyMode where there is one way only.
//
// The kernels are templates (on the compaction's items per thread where nothing else varies), as in sparse_kernels.cuh,
// so that a plugin may include this header from more than one translation unit without duplicate symbols.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "terse/kit/cast_kernels.cuh"
#include "terse/kit/device.cuh"
#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_select.hpp"
#include "terse/sdk/cuda.hpp"

namespace terse::kit::topk::cuda {

namespace cub = CUB_NS_QUALIFIER;       // wrapped in a namespace of the plugin's own (device.cuh)
inline namespace TERSE_KIT_KERNEL_NS {  // unique per plugin: device.cuh

// The radix select's running result, in the workspace: the key prefix narrowed so far (after the last round, the cut
// itself) and how many keys lie strictly above it.
struct State {
  uint32_t prefix;
  uint32_t mode;  // selectTopK's: kOnTensor (0, what a cleared State says) or kOnCandidates
  uint64_t greater;
};

// Where selectTopK finishes, decided on the device after the top digit: on the whole tensor, or on the candidates
// (every key at or above the top digit's boundary bin, copied out in index order) once they fit their buffer.
inline constexpr uint32_t kOnTensor = 0;
inline constexpr uint32_t kOnCandidates = 1;
// A kernel's mode argument that runs it whatever the State says (radixSelect and compactByCut, which dgc calls too).
inline constexpr uint32_t kAnyMode = ~0u;

// One candidate: the value (so later passes need not touch the tensor) and its index. The host's fast path keeps the
// same pairs (topk_select.hpp's Candidate).
using kit::topk::Candidate;

inline constexpr unsigned kItems = 16;                                  // elements per thread in the compaction
inline constexpr uint64_t kTile = uint64_t{device::kThreads} * kItems;  // elements per compaction tile
inline constexpr uint64_t kLow = 0xffffffffu;                           // T in a packed (G << 32 | T) count
inline constexpr uint64_t kGreaterOne = uint64_t{1} << 32;              // one G in a packed count
// Quads (4 elements) per thread per block in a histogram pass: each block clears and flushes up to 8192 shared
// counters, so it should count many elements, not 1024.
inline constexpr uint64_t kHistogramQuads = 16;
// Workspace sections start at multiples of this (cudaMalloc's alignment; cub wants 256 for its temporaries).
inline constexpr uint64_t kAlign = 256;

static_assert(kMaxBins % device::kThreads == 0 && (1u << digitBits(2)) % device::kThreads == 0,
              "a pick thread owns whole bins");

inline uint64_t alignUp(uint64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// Where the selection's workspace sections are, in bytes from its start. A caller with sections of its own puts them
// from `total` on.
struct Layout {
  uint64_t tiles = 0;
  uint64_t hist = 0;     // kMaxBins u32 (the State is at 0)
  uint64_t counts = 0;   // tiles u64: each tile's packed count
  uint64_t offsets = 0;  // tiles u64: their exclusive prefix sums
  uint64_t scan = 0;     // cub's temporary storage for that scan
  size_t scan_bytes = 0;
  uint64_t total = 0;
};

// The layout for selecting among numel elements (and, for dgc, among fewer: the sample reuses the State and histogram).
inline Layout layoutFor(uint64_t numel) {
  Layout l;
  l.tiles = (numel + kTile - 1) / kTile;  // numel < 2^32: at most 2^20 tiles, an int
  // The size query launches nothing; cub sizes its tile-status storage for the current device.
  TERSE_SDK_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, l.scan_bytes, static_cast<const uint64_t*>(nullptr),
                                                     static_cast<uint64_t*>(nullptr), static_cast<int>(l.tiles)));
  l.hist = alignUp(sizeof(State));
  l.counts = l.hist + alignUp(kMaxBins * sizeof(uint32_t));
  l.offsets = l.counts + alignUp(l.tiles * sizeof(uint64_t));
  l.scan = l.offsets + alignUp(l.tiles * sizeof(uint64_t));
  l.total = l.scan + alignUp(l.scan_bytes);
  return l;
}

// Whether a kernel given `mode` runs under this State (block-uniform: a kernel that returns does so before any
// barrier).
__device__ __forceinline__ bool runsIn(uint32_t mode, const State* state) {
  return mode == kAnyMode || state->mode == mode;
}

// Digit `Level` of every key of x[0..n) whose higher digits equal state->prefix (all keys at level 0), added into
// hist. Runs only in `mode` (kAnyMode: always) below level 0; level 0 always runs, reads no State and clears it (one
// thread), so that the pick after it finds a cleared State and the select saves a memset launch.
template <int Level>
__global__ void histogramKernel(const float* __restrict__ x, uint64_t n, State* __restrict__ state,
                                uint32_t* __restrict__ hist, uint32_t mode) {
  if constexpr (Level == 0) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *state = State{};
  } else {
    if (!runsIn(mode, state)) return;
  }
  constexpr uint32_t kBins = 1u << digitBits(Level);
  __shared__ uint32_t counts[kBins];
  for (uint32_t b = threadIdx.x; b < kBins; b += blockDim.x) counts[b] = 0;
  __syncthreads();
  const uint32_t prefix = Level == 0 ? 0u : state->prefix;
  const uint64_t quads = (n + 3) / 4;
  for (uint64_t q = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; q < quads; q += uint64_t{gridDim.x} * blockDim.x) {
    float v[4];
    device::loadQuad(x, 4 * q, n, v);
    for (unsigned j = 0; j < 4; ++j) {
      const uint32_t key = magnitudeKey(v[j]);
      if (4 * q + j < n && prefixOf(key, Level) == prefix) atomicAdd(&counts[digitOf(key, Level)], 1u);
    }
  }
  __syncthreads();
  for (uint32_t b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (counts[b] != 0) atomicAdd(&hist[b], counts[b]);
  }
}

// One block: the bin of digit `Level` that holds the need-th largest key among those with the prefix (need = k -
// greater >= 1), as the host's pickBin finds it: walking the bins from the top, the first whose running sum reaches
// need. Thread t sums the t-th run of bins from the top; an exclusive scan of those sums tells each thread how many
// keys lie above its run, and the one thread whose run holds the need-th key walks it. With a capacity (level 0 of
// selectTopK), the keys at or above the bin are every candidate, and if they fit, the State switches to kOnCandidates:
// the host's fast-path test (topk_select.hpp's selectTopK). Below the last level it then clears the next level's bins
// (the first 1 << digitBits(Level + 1) of hist) for that level's histogram, which always follows a pick: one memset
// launch fewer a level.
template <int Level>
__global__ void pickKernel(uint32_t* __restrict__ hist, uint64_t k, State* state, uint64_t capacity) {
  constexpr uint32_t kBins = 1u << digitBits(Level);
  constexpr uint32_t kPer = kBins / device::kThreads;
  using Scan = cub::BlockScan<uint64_t, device::kThreads>;
  __shared__ typename Scan::TempStorage temp;
  // Every thread reads the state before the scan's barriers; the one writer writes after them.
  const State s = *state;
  const uint64_t need = k - s.greater;
  uint32_t own[kPer];
  uint64_t run = 0;
  for (uint32_t j = 0; j < kPer; ++j) {
    own[j] = hist[kBins - 1 - (threadIdx.x * kPer + j)];
    run += own[j];
  }
  uint64_t above = 0;
  Scan(temp).ExclusiveSum(run, above);
  if (above < need && need <= above + run) {
    uint64_t sum = above;
    for (uint32_t j = 0; j < kPer; ++j) {
      if (sum + own[j] >= need) {
        state->greater = s.greater + sum;
        state->prefix = (s.prefix << digitBits(Level)) | (kBins - 1 - (threadIdx.x * kPer + j));
        if (s.greater + sum + own[j] <= capacity) state->mode = kOnCandidates;
        break;
      }
      sum += own[j];
    }
  }
  if constexpr (Level + 1 < kDigits) {
    __syncthreads();  // every thread has read its bins (into own) before any is cleared
    for (uint32_t b = threadIdx.x; b < (1u << digitBits(Level + 1)); b += device::kThreads) hist[b] = 0;
  }
}

// The packed (G << 32 | T) count of key against the cut.
__device__ __forceinline__ uint64_t countOf(uint32_t key, uint32_t cut) {
  return key > cut ? kGreaterOne : (key == cut ? 1u : 0u);
}

// The compaction reads either the tensor (items are floats, an item's index is its position) or the candidates (items
// carry their value and index).
__device__ __forceinline__ float valueOf(float v) {
  return v;
}
__device__ __forceinline__ float valueOf(const Candidate& c) {
  return c.value;
}
__device__ __forceinline__ uint32_t indexOf(float, uint64_t i) {
  return static_cast<uint32_t>(i);
}
__device__ __forceinline__ uint32_t indexOf(const Candidate& c, uint64_t) {
  return c.index;
}

// How many items the compaction reads: n, or the count on the device (the candidates DeviceSelect wrote).
__device__ __forceinline__ uint64_t itemCount(uint64_t n, const uint64_t* selected) {
  return selected != nullptr ? *selected : n;
}

// Each tile's packed count of keys above and equal to the cut (tiles past the items count none), and zero for the
// tiles from `tiles` to `zero_to`. Runs only in `mode`.
template <unsigned Items, class Item>
__global__ void countKernel(const Item* __restrict__ x, uint64_t n, const uint64_t* __restrict__ selected,
                            const State* __restrict__ state, uint32_t mode, uint64_t tiles, uint64_t zero_to,
                            uint64_t* __restrict__ counts) {
  if (!runsIn(mode, state)) return;
  constexpr uint64_t kTileElements = uint64_t{device::kThreads} * Items;
  using Reduce = cub::BlockReduce<uint64_t, device::kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint32_t cut = state->prefix;
  const uint64_t items = itemCount(n, selected);
  for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // block-uniform: the barriers below are safe
    const uint64_t base = tile * kTileElements;
    uint64_t c = 0;
    for (unsigned j = 0; j < Items; ++j) {
      const uint64_t i = base + uint64_t{j} * device::kThreads + threadIdx.x;  // striped: coalesced loads
      if (i < items) c += countOf(magnitudeKey(valueOf(x[i])), cut);
    }
    const uint64_t total = Reduce(temp).Sum(c);
    if (threadIdx.x == 0) counts[tile] = total;
    __syncthreads();  // the next tile reuses temp
  }
  for (uint64_t t = tiles + uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < zero_to;
       t += uint64_t{gridDim.x} * blockDim.x) {
    counts[t] = 0;
  }
}

// Writes the `count` selected items of each tile at G(i) + min(T(i), quota) (see the top of this file). Threads own
// Items consecutive items (cub's blocked arrangement, loaded through shared memory), so a thread's exclusive scan
// value plus its tile's prefix is G and T at its first item. Runs only in `mode`.
template <unsigned Items, class Item>
__global__ void writeKernel(const Item* __restrict__ x, uint64_t n, const uint64_t* __restrict__ selected,
                            const State* __restrict__ state, uint32_t mode, uint64_t count, uint64_t tiles,
                            const uint64_t* __restrict__ counts, const uint64_t* __restrict__ offsets,
                            float* __restrict__ values, uint32_t* __restrict__ indices) {
  if (!runsIn(mode, state)) return;
  constexpr uint64_t kTileElements = uint64_t{device::kThreads} * Items;
  using Load = cub::BlockLoad<Item, device::kThreads, Items, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using Scan = cub::BlockScan<uint64_t, device::kThreads>;
  __shared__ union {
    typename Load::TempStorage load;
    typename Scan::TempStorage scan;
  } temp;
  const uint32_t cut = state->prefix;
  const uint64_t quota = count - state->greater;
  const uint64_t items = itemCount(n, selected);
  for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // block-uniform: the barriers below are safe
    const uint64_t g0 = offsets[tile] >> 32, t0 = offsets[tile] & kLow;
    const uint64_t t1 = t0 + (counts[tile] & kLow);
    const uint64_t taken = (counts[tile] >> 32) + (t1 < quota ? t1 : quota) - (t0 < quota ? t0 : quota);
    if (taken == 0) continue;  // also every tile past the items: they count none
    const uint64_t base = tile * kTileElements;
    const int valid = static_cast<int>(items - base < kTileElements ? items - base : kTileElements);
    Item v[Items];
    Load(temp.load).Load(x + base, v, valid, Item{});
    __syncthreads();  // temp.load becomes temp.scan
    const unsigned first = threadIdx.x * Items;
    uint64_t c = 0;
    for (unsigned j = 0; j < Items; ++j) {
      if (first + j < static_cast<unsigned>(valid)) c += countOf(magnitudeKey(valueOf(v[j])), cut);
    }
    uint64_t before = 0;
    Scan(temp.scan).ExclusiveSum(c, before);
    uint64_t g = g0 + (before >> 32), t = t0 + (before & kLow);
    for (unsigned j = 0; j < Items; ++j) {
      if (first + j >= static_cast<unsigned>(valid)) break;
      const float value = valueOf(v[j]);
      const uint32_t key = magnitudeKey(value);
      if (takeByCut(key, cut, t < quota ? quota - t : 0)) {
        const uint64_t pos = g + (t < quota ? t : quota);
        // pos < count whenever the state is a true cut for count (G < greater for a key above it, T < quota for a
        // taken tie); the test keeps a wrong state from writing past the payload.
        if (pos < count) {
          values[pos] = value;
          indices[pos] = indexOf(v[j], base + first + j);
        }
      }
      g += key > cut ? 1 : 0;
      t += key == cut ? 1 : 0;
    }
    __syncthreads();  // the next tile's load reuses temp
  }
}

// Every element, in index order (the selection when count == n).
template <class Index>
__global__ void iotaKernel(Index* __restrict__ indices, uint64_t n) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    indices[i] = static_cast<Index>(i);
  }
}

// Counts digit `Level` of the tensor's keys into the histogram's first bins (in `mode`). At level 0 it clears those
// bins first, and its kernel clears the State; a lower level's bins were cleared by the pick of the level above, which
// every caller queues before it (pickKernel).
template <int Level>
void histogramRound(const float* x, uint64_t n, State* state, uint32_t* hist, uint32_t mode, cudaStream_t st) {
  if constexpr (Level == 0) {
    TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(hist, 0, (1u << digitBits(Level)) * sizeof(uint32_t), st));
  }
  histogramKernel<Level><<<device::gridFor((n + 3) / 4, device::kThreads * kHistogramQuads), device::kThreads, 0, st>>>(
      x, n, state, hist, mode);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

template <int Level>
void pickRound(uint32_t* hist, uint64_t k, State* state, uint64_t capacity, cudaStream_t st) {
  pickKernel<Level><<<1, device::kThreads, 0, st>>>(hist, k, state, capacity);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

template <int Level>
void selectRound(const float* x, uint64_t n, uint64_t k, State* state, uint32_t* hist, cudaStream_t st) {
  histogramRound<Level>(x, n, state, hist, kAnyMode, st);
  pickRound<Level>(hist, k, state, 0, st);
}

// Leaves in *state the cut of the k largest keys of x[0..n) (1 <= k <= n) and how many lie above it: topk_select.hpp's
// radixCut. `hist` holds kMaxBins counters. Queued on `st`, nothing waited for.
inline void radixSelect(const float* x, uint64_t n, uint64_t k, State* state, uint32_t* hist, cudaStream_t st) {
  selectRound<0>(x, n, k, state, hist, st);
  selectRound<1>(x, n, k, state, hist, st);
  selectRound<2>(x, n, k, state, hist, st);
}

// The compaction's kernels over `x` (n items, or *selected of them), in `mode`: the count into the tiles' counts, and
// the write from their scanned offsets.
template <class Item>
void countTiles(const Item* x, uint64_t n, const uint64_t* selected, uint32_t mode, uint64_t tiles, uint64_t zero_to,
                const Layout& l, std::byte* workspace, cudaStream_t st) {
  countKernel<kItems, Item><<<device::gridFor(tiles, 1), device::kThreads, 0, st>>>(
      x, n, selected, reinterpret_cast<const State*>(workspace), mode, tiles, zero_to,
      reinterpret_cast<uint64_t*>(workspace + l.counts));
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

template <class Item>
void writeTiles(const Item* x, uint64_t n, const uint64_t* selected, uint32_t mode, uint64_t count, uint64_t tiles,
                const Layout& l, std::byte* workspace, float* values, uint32_t* indices, cudaStream_t st) {
  writeKernel<kItems, Item><<<device::gridFor(tiles, 1), device::kThreads, 0, st>>>(
      x, n, selected, reinterpret_cast<const State*>(workspace), mode, count, tiles,
      reinterpret_cast<const uint64_t*>(workspace + l.counts), reinterpret_cast<const uint64_t*>(workspace + l.offsets),
      values, indices);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

// The exclusive scan of the first `tiles` tile counts into their offsets.
inline void scanTiles(uint64_t tiles, const Layout& l, std::byte* workspace, cudaStream_t st) {
  size_t scan_bytes = l.scan_bytes;
  TERSE_SDK_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(
      workspace + l.scan, scan_bytes, reinterpret_cast<const uint64_t*>(workspace + l.counts),
      reinterpret_cast<uint64_t*>(workspace + l.offsets), static_cast<int>(tiles), st));
}

// Writes the `count` elements of x[0..n) that the cut in *state selects (count in [greater, greater + ties]) to
// values[0..count) and their indices to indices[0..count), in index order: topk_select.hpp's compactByCut. `workspace`
// is laid out by `l` = layoutFor(n). Queued on `st`, nothing waited for.
inline void compactByCut(const float* x, uint64_t n, uint64_t count, const Layout& l, std::byte* workspace,
                         float* values, uint32_t* indices, cudaStream_t st) {
  countTiles(x, n, nullptr, kAnyMode, l.tiles, l.tiles, l, workspace, st);
  scanTiles(l.tiles, l, workspace, st);
  writeTiles(x, n, nullptr, kAnyMode, count, l.tiles, l, workspace, values, indices, st);
}

// count == n: every element in index order (a copy and an iota).
inline void takeAll(const float* x, uint64_t n, float* values, uint32_t* indices, cudaStream_t st) {
  TERSE_SDK_CUDA_CHECK(cudaMemcpyAsync(values, x, n * sizeof(float), cudaMemcpyDeviceToDevice, st));
  iotaKernel<uint32_t><<<device::gridFor(n, device::kThreads), device::kThreads, 0, st>>>(indices, n);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace TERSE_KIT_KERNEL_NS
}  // namespace terse::kit::topk::cuda
