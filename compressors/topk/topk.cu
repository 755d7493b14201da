// topk's kernels: the exact top-k of topk_select.h on the GPU, giving the host's payload byte for byte.
//
// The selection is a function of the input alone (topk.cc): every key above the k-th largest key `cut`, plus the first
// k - greater keys equal to it in index order (greater = how many keys lie strictly above the cut), written in index
// order. The kernels find the same cut with the same keys and digits (topk_math.h: magnitudeKey, digitOf, prefixOf)
// and write the same set in the same order:
//
//   radix select   three rounds of (histogram, pick), one per digit (13, 10, 8 bits, most significant first). The
//                  histogram counts the digit of every key whose higher digits equal the prefix picked so far
//                  (shared-memory counters per block, added to the workspace's global ones); the pick, one block,
//                  finds the bin holding the need-th largest key with the host's pickBin rule and appends it to the
//                  prefix. The round's state (prefix, greater) stays in the workspace, so nothing is read back.
//   compaction     with G(i) = keys above the cut and T(i) = keys equal to it among elements 0..i-1, element i is taken
//                  iff key > cut, or key == cut and T(i) < quota (= k - greater), and lands at G(i) + min(T(i), quota):
//                  exactly the host's compactByCut, whose ties go to the lower index. G and T are counted per tile of
//                  4096 elements (packed as G << 32 | T: both stay below 2^32, so one 64-bit sum carries both),
//                  cub::DeviceScan gives the tiles' exclusive prefixes, and a block scan (cub::BlockScan) gives each
//                  element's own. A tile with nothing selected is skipped without reading it.
//
// Five passes over the input (three histograms, count, write) plus small work, against the eight or so of a full radix
// sort of (key, index) pairs, which also moves twice the bytes per pass (tests/bench measures both).
//
// A non-finite input has the largest keys, so it is always selected and travels in the payload (the host refuses it at
// compress; the device would have to wait to know), and every decompress refuses the payload (topk.cc).
#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <cstddef>
#include <cstdint>

#include "compressors/common/cast_kernels.cuh"
#include "compressors/common/device.cuh"
#include "compressors/topk/sparse_kernels.cuh"
#include "compressors/topk/sparse_payload.h"
#include "compressors/topk/topk_cuda.h"
#include "compressors/topk/topk_math.h"
#include "terse/sdk/cuda.hpp"

namespace terse::compressors::topk::cuda {
namespace {

using device::kThreads;

// The radix select's running result, in the workspace: the key prefix narrowed so far (after the last round, the cut
// itself) and how many keys lie strictly above it.
struct State {
  uint32_t prefix;
  uint32_t reserved;
  uint64_t greater;
};

constexpr unsigned kItems = 16;                          // elements per thread in the compaction
constexpr uint64_t kTile = uint64_t{kThreads} * kItems;  // elements per compaction tile
constexpr uint64_t kLow = 0xffffffffu;                   // T in a packed (G << 32 | T) count
constexpr uint64_t kGreaterOne = uint64_t{1} << 32;      // one G in a packed count
// Quads (4 elements) per thread per block in a histogram pass: each block clears and flushes up to 8192 shared
// counters, so it should count many elements, not 1024.
constexpr uint64_t kHistogramQuads = 16;
// Workspace sections start at multiples of this (cudaMalloc's alignment; cub wants 256 for its temporaries).
constexpr uint64_t kAlign = 256;

static_assert(kMaxBins % kThreads == 0 && (1u << digitBits(2)) % kThreads == 0, "a pick thread owns whole bins");

uint64_t alignUp(uint64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// Where the workspace's sections are, in bytes from its start.
struct Layout {
  uint64_t tiles = 0;
  uint64_t hist = 0;     // kMaxBins u32 (the State is at 0)
  uint64_t counts = 0;   // tiles u64: each tile's packed count
  uint64_t offsets = 0;  // tiles u64: their exclusive prefix sums
  uint64_t scan = 0;     // cub's temporary storage for that scan
  size_t scan_bytes = 0;
  uint64_t total = 0;
};

Layout layoutFor(uint64_t numel) {
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

// Digit `Level` of every key whose higher digits equal state->prefix (all keys at level 0), added into hist.
template <int Level>
__global__ void histogramKernel(const float* __restrict__ x, uint64_t n, const State* __restrict__ state,
                                uint32_t* __restrict__ hist) {
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
// keys lie above its run, and the one thread whose run holds the need-th key walks it.
template <int Level>
__global__ void pickKernel(const uint32_t* __restrict__ hist, uint64_t k, State* state) {
  constexpr uint32_t kBins = 1u << digitBits(Level);
  constexpr uint32_t kPer = kBins / kThreads;
  using Scan = cub::BlockScan<uint64_t, kThreads>;
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
        break;
      }
      sum += own[j];
    }
  }
}

// The packed (G << 32 | T) count of key against the cut.
__device__ __forceinline__ uint64_t countOf(uint32_t key, uint32_t cut) {
  return key > cut ? kGreaterOne : (key == cut ? 1u : 0u);
}

// Each tile's packed count of keys above and equal to the cut.
__global__ void countKernel(const float* __restrict__ x, uint64_t n, const State* __restrict__ state, uint64_t tiles,
                            uint64_t* __restrict__ counts) {
  using Reduce = cub::BlockReduce<uint64_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint32_t cut = state->prefix;
  for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // block-uniform: the barriers below are safe
    const uint64_t base = tile * kTile;
    uint64_t c = 0;
    for (unsigned j = 0; j < kItems; ++j) {
      const uint64_t i = base + uint64_t{j} * kThreads + threadIdx.x;  // striped: coalesced loads
      if (i < n) c += countOf(magnitudeKey(x[i]), cut);
    }
    const uint64_t total = Reduce(temp).Sum(c);
    if (threadIdx.x == 0) counts[tile] = total;
    __syncthreads();  // the next tile reuses temp
  }
}

// Writes the selected elements of each tile at G(i) + min(T(i), quota) (see the top of this file). Threads own kItems
// consecutive elements (cub's blocked arrangement, loaded through shared memory), so a thread's exclusive scan value
// plus its tile's prefix is G and T at its first element.
__global__ void writeKernel(const float* __restrict__ x, uint64_t n, const State* __restrict__ state, uint64_t k,
                            uint64_t tiles, const uint64_t* __restrict__ counts, const uint64_t* __restrict__ offsets,
                            float* __restrict__ values, uint32_t* __restrict__ indices) {
  using Load = cub::BlockLoad<float, kThreads, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using Scan = cub::BlockScan<uint64_t, kThreads>;
  __shared__ union {
    typename Load::TempStorage load;
    typename Scan::TempStorage scan;
  } temp;
  const uint32_t cut = state->prefix;
  const uint64_t quota = k - state->greater;
  for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // block-uniform: the barriers below are safe
    const uint64_t g0 = offsets[tile] >> 32, t0 = offsets[tile] & kLow;
    const uint64_t t1 = t0 + (counts[tile] & kLow);
    const uint64_t selected = (counts[tile] >> 32) + (t1 < quota ? t1 : quota) - (t0 < quota ? t0 : quota);
    if (selected == 0) continue;
    const uint64_t base = tile * kTile;
    const int valid = static_cast<int>(n - base < kTile ? n - base : kTile);
    float v[kItems];
    Load(temp.load).Load(x + base, v, valid, 0.0f);
    __syncthreads();  // temp.load becomes temp.scan
    const unsigned first = threadIdx.x * kItems;
    uint64_t c = 0;
    for (unsigned j = 0; j < kItems; ++j) {
      if (first + j < static_cast<unsigned>(valid)) c += countOf(magnitudeKey(v[j]), cut);
    }
    uint64_t before = 0;
    Scan(temp.scan).ExclusiveSum(c, before);
    uint64_t g = g0 + (before >> 32), t = t0 + (before & kLow);
    for (unsigned j = 0; j < kItems; ++j) {
      if (first + j >= static_cast<unsigned>(valid)) break;
      const uint32_t key = magnitudeKey(v[j]);
      if (takeByCut(key, cut, t < quota ? quota - t : 0)) {
        const uint64_t pos = g + (t < quota ? t : quota);
        // pos < k whenever the state is the true cut (G < greater for a key above it, T < quota for a taken tie); the
        // test keeps a wrong state from writing past the payload.
        if (pos < k) {
          values[pos] = v[j];
          indices[pos] = static_cast<uint32_t>(base + first + j);
        }
      }
      g += key > cut ? 1 : 0;
      t += key == cut ? 1 : 0;
    }
    __syncthreads();  // the next tile's load reuses temp
  }
}

// k == numel: every element, in index order.
__global__ void iotaKernel(uint32_t* __restrict__ indices, uint64_t n) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    indices[i] = static_cast<uint32_t>(i);
  }
}

template <int Level>
void selectRound(const float* x, uint64_t n, uint64_t k, State* state, uint32_t* hist, cudaStream_t st) {
  TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(hist, 0, (1u << digitBits(Level)) * sizeof(uint32_t), st));
  histogramKernel<Level>
      <<<device::gridFor((n + 3) / 4, kThreads * kHistogramQuads), kThreads, 0, st>>>(x, n, state, hist);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  pickKernel<Level><<<1, kThreads, 0, st>>>(hist, k, state);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace

uint64_t workspaceBytes(uint64_t numel, uint64_t k) {
  if (k == 0 || k >= numel) return 0;
  return layoutFor(numel).total;
}

void compress(const device::Prefix& prefix, const float* x, uint64_t numel, uint64_t k, std::byte* workspace,
              std::byte* payload, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, payload, stream);
  if (k == 0) return;
  float* values = reinterpret_cast<float*>(payload + sparse::kFixedBytes);
  uint32_t* indices = reinterpret_cast<uint32_t*>(payload + sparse::kFixedBytes + sizeof(float) * k);
  if (k >= numel) {
    TERSE_SDK_CUDA_CHECK(cudaMemcpyAsync(values, x, numel * sizeof(float), cudaMemcpyDeviceToDevice, st));
    iotaKernel<<<device::gridFor(numel, kThreads), kThreads, 0, st>>>(indices, numel);
    TERSE_COMPRESSOR_CHECK_LAUNCH();
    return;
  }
  const Layout l = layoutFor(numel);
  auto* state = reinterpret_cast<State*>(workspace);
  auto* hist = reinterpret_cast<uint32_t*>(workspace + l.hist);
  auto* counts = reinterpret_cast<uint64_t*>(workspace + l.counts);
  auto* offsets = reinterpret_cast<uint64_t*>(workspace + l.offsets);
  TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(state, 0, sizeof(State), st));
  selectRound<0>(x, numel, k, state, hist, st);
  selectRound<1>(x, numel, k, state, hist, st);
  selectRound<2>(x, numel, k, state, hist, st);

  const unsigned grid = device::gridFor(l.tiles, 1);
  countKernel<<<grid, kThreads, 0, st>>>(x, numel, state, l.tiles, counts);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  size_t scan_bytes = l.scan_bytes;
  TERSE_SDK_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(workspace + l.scan, scan_bytes, counts, offsets, static_cast<int>(l.tiles), st));
  writeKernel<<<grid, kThreads, 0, st>>>(x, numel, state, k, l.tiles, counts, offsets, values, indices);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t* status, void* stream) {
  sparse::launchValidateSparse<false>(expected, payload, count, numel, 0, status, stream);
}

void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream) {
  sparse::launchScatter(payload, count, numel, out, accumulate, stream);
}

}  // namespace terse::compressors::topk::cuda
