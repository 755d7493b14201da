// topk's whole selection on the GPU, with the host's fast path (terse/kit/topk_select.hpp's selectTopK): the kernels of
// topk_select_kernels.cuh in the order that reads the tensor twice, not five times, when the data allows.
//
// After the top digit's histogram and pick, the keys at or above its boundary bin are the candidates: every selected
// key is one. If they fit the host's candidate buffer (candidateCapacity: 2k + n/64 + 4096 entries), the pick says so
// in the State (mode kOnCandidates), cub::DeviceSelect copies them out as (value, index) pairs in index order, and the
// two lower digits and the compaction run on those: about 1.2% of n at k = 1% of normal data (the 1% and the
// 1/32-octave boundary bin). Otherwise (a crowded boundary bin: heavily tied data) they run on the tensor, as
// radixSelect and compactByCut do. The pick decides on the device, so compress never waits: every kernel of both ways
// is queued and those of the way not taken return at once. The selection is the host's either way.
//
// Apart from the base header so that a plugin that does not call selectTopK (dgc) does not compile the DeviceSelect:
// these host functions are not templates, and their cub calls would instantiate its kernels in every includer.
#pragma once

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cub/device/device_select.cuh>

#include "terse/kit/topk_select_kernels.cuh"

namespace terse::kit::topk::cuda {

namespace thrust = THRUST_NS_QUALIFIER;  // wrapped in a namespace of the plugin's own (device.cuh)
inline namespace TERSE_KIT_KERNEL_NS {

// The selectTopK layout: Layout's sections, then the candidate buffer (Candidate entries, as many as the host's fast
// path keeps: topk_select.hpp's candidateCapacity), the count DeviceSelect writes, and cub's temporary storage for it.
struct TopKLayout {
  Layout select;
  uint64_t capacity = 0;    // candidate entries
  uint64_t cand_tiles = 0;  // compaction tiles over a full candidate buffer (<= select.tiles)
  uint64_t selected = 0;    // u64: how many candidates DeviceSelect wrote
  uint64_t candidates = 0;  // capacity Candidate entries
  uint64_t filter = 0;      // cub's temporary storage for the DeviceSelect
  size_t filter_bytes = 0;
  uint64_t total = 0;
};

// The DeviceSelect runs over the indices 0..n-1 (a counting iterator): a 4-byte primitive input gets cub's tuned
// policy for sm_90 (384 threads of 17 items: tiles of 6,528), where a (value, index) input of 8 bytes, a type cub does
// not know, gets its untuned default (128 threads of 5: tiles of 640, ten times the decoupled look-backs). The indices
// are transposed through shared memory and the predicate reads x[i] in blocked order (a thread's 17 elements in a
// row, as cub's own tuned flagged select reads); a kept index is turned into its candidate on the way out (x[i]
// again, just read). Whether this beats the default on the device is for the next GPU run to say.

// Whether element i's key is at or above the top digit's boundary bin (state->prefix after round 0): every key above
// the cut, and every key equal to it, is one. Nothing is kept, and no element read, when the selection stays on the
// tensor (the DeviceSelect still sweeps its n indices then, reading the State).
struct AtOrAboveBin {
  const float* x;
  const State* state;
  __device__ bool operator()(uint32_t i) const {
    return state->mode == kOnCandidates && magnitudeKey(x[i]) >= (state->prefix << digitShift(0));
  }
};

// Candidate i of the tensor: (x[i], i). The output iterator that calls it is __host__ __device__, so it needs a host
// body; only device code ever writes through it (x is device memory), and the host body stops the process rather
// than make up a candidate.
struct CandidateOf {
  const float* x;
  __host__ __device__ Candidate operator()(uint32_t i) const {
#ifdef __CUDA_ARCH__
    return Candidate{x[i], i};
#else
    std::abort();
#endif
  }
};

// cub::DeviceSelect::If over every element of x, keeping the candidates in index order; with temp == nullptr, only
// sizes its temporary storage (launches nothing).
inline void filterCandidates(void* temp, size_t& temp_bytes, const float* x, uint64_t n, const State* state,
                             Candidate* candidates, uint64_t* selected, cudaStream_t st) {
  TERSE_SDK_CUDA_CHECK(cub::DeviceSelect::If(temp, temp_bytes, thrust::counting_iterator<uint32_t>(0),
                                             thrust::make_transform_output_iterator(candidates, CandidateOf{x}),
                                             selected, static_cast<int64_t>(n), AtOrAboveBin{x, state}, st));
}

inline TopKLayout topKLayoutFor(uint64_t numel, uint64_t k) {
  TopKLayout l;
  l.select = layoutFor(numel);
  l.capacity = candidateCapacity(numel, k);
  l.cand_tiles = (l.capacity + kTile - 1) / kTile;
  l.selected = l.select.total;
  l.candidates = l.selected + alignUp(sizeof(uint64_t));
  l.filter = l.candidates + alignUp(l.capacity * sizeof(Candidate));
  filterCandidates(nullptr, l.filter_bytes, nullptr, numel, nullptr, nullptr, nullptr, nullptr);
  l.total = l.filter + alignUp(l.filter_bytes);
  return l;
}

// histogramKernel's count over the candidates (*selected of them), when the selection finishes on them.
template <int Level>
__global__ void candidateHistogramKernel(const Candidate* __restrict__ candidates,
                                         const uint64_t* __restrict__ selected, const State* __restrict__ state,
                                         uint32_t* __restrict__ hist) {
  if (state->mode != kOnCandidates) return;
  constexpr uint32_t kBins = 1u << digitBits(Level);
  __shared__ uint32_t counts[kBins];
  for (uint32_t b = threadIdx.x; b < kBins; b += blockDim.x) counts[b] = 0;
  __syncthreads();
  const uint32_t prefix = state->prefix;
  const uint64_t m = *selected;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < m; i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t key = magnitudeKey(candidates[i].value);
    if (prefixOf(key, Level) == prefix) atomicAdd(&counts[digitOf(key, Level)], 1u);
  }
  __syncthreads();
  for (uint32_t b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (counts[b] != 0) atomicAdd(&hist[b], counts[b]);
  }
}

// One lower digit of selectTopK: its histogram on the tensor or on the candidates, whichever way the State says (the
// other kernel returns at once), then its pick.
template <int Level>
void lowerRound(const float* x, uint64_t n, uint64_t k, const TopKLayout& l, State* state, uint32_t* hist,
                const Candidate* candidates, const uint64_t* selected, cudaStream_t st) {
  histogramRound<Level>(x, n, state, hist, kOnTensor, st);
  candidateHistogramKernel<Level>
      <<<device::gridFor(l.capacity, device::kThreads * kHistogramQuads), device::kThreads, 0, st>>>(
          candidates, selected, state, hist);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  pickRound<Level>(hist, k, state, 0, st);
}

// The exact top-k of x[0..n) (1 <= k < n) into values[0..k) and indices[0..k), in index order: topk_select.hpp's
// selectTopK, and its fast path. The top digit's histogram runs on the tensor; if the keys at or above its boundary bin
// fit the candidate buffer (the pick says so in the State), one DeviceSelect copies them out in index order and the
// two lower digits and the compaction run on them: two passes over the tensor instead of five. Otherwise the two
// digits and the compaction run on the tensor as radixSelect and compactByCut do. The host never learns which: each
// pass of both ways is queued and the kernels of the way not taken return at once, but for the DeviceSelect, which on
// the tensor's way still sweeps its n items (reading the State, not the tensor; nothing selected). `workspace` is laid
// out by `l` = topKLayoutFor(n, k). Queued on `st`, nothing waited for.
inline void selectTopK(const float* x, uint64_t n, uint64_t k, const TopKLayout& l, std::byte* workspace, float* values,
                       uint32_t* indices, cudaStream_t st) {
  auto* state = reinterpret_cast<State*>(workspace);
  auto* hist = reinterpret_cast<uint32_t*>(workspace + l.select.hist);
  auto* selected = reinterpret_cast<uint64_t*>(workspace + l.selected);
  auto* candidates = reinterpret_cast<Candidate*>(workspace + l.candidates);
  histogramRound<0>(x, n, state, hist, kAnyMode, st);  // clears the State too
  pickRound<0>(hist, k, state, l.capacity, st);
  size_t filter_bytes = l.filter_bytes;
  filterCandidates(workspace + l.filter, filter_bytes, x, n, state, candidates, selected, st);
  lowerRound<1>(x, n, k, l, state, hist, candidates, selected, st);
  lowerRound<2>(x, n, k, l, state, hist, candidates, selected, st);
  // One scan over the tensor's tiles serves both ways: on candidates, the count kernel counts the first cand_tiles
  // (<= the tensor's) and zeroes the rest, which the write never reads (their offsets would not matter, but the scan
  // should not read memory nothing wrote).
  countTiles(x, n, nullptr, kOnTensor, l.select.tiles, l.select.tiles, l.select, workspace, st);
  countTiles<Candidate>(candidates, l.capacity, selected, kOnCandidates, l.cand_tiles, l.select.tiles, l.select,
                        workspace, st);
  scanTiles(l.select.tiles, l.select, workspace, st);
  writeTiles(x, n, nullptr, kOnTensor, k, l.select.tiles, l.select, workspace, values, indices, st);
  writeTiles<Candidate>(candidates, l.capacity, selected, kOnCandidates, k, l.cand_tiles, l.select, workspace, values,
                        indices, st);
}

}  // namespace TERSE_KIT_KERNEL_NS
}  // namespace terse::kit::topk::cuda
