// dgc's kernels: DGC's sampled-threshold selection (dgc_select.h) on the GPU, giving the host's payload byte for byte.
//
// The host's plan is a short loop of scalar decisions around three kinds of bulk work; the decisions run on the host,
// the same code as dgc_select.h (dgc_math.h's acceptable, countFor, sampleRank, firstRank, nextRank, nextThreshold),
// and the bulk work on the device with the host's arithmetic:
//
//   sample      one thread per sample j gathers x[samplePosition(rng, j, s, n)] (the host's Philox words, counter
//               j / 2, and its stratified multiply-high), keeping the value: its key is the host's sample key.
//   threshold   the rank-th largest sample key by terse/kit/topk_select_kernels.cuh's radix select (the host's
//               radixCut on the same keys); a one-thread kernel turns the selected prefix into the next threshold
//               with nextThreshold and the bracket the host passes, so the count pass follows the select without the
//               host waiting between.
//   counting    one pass counts, against the threshold, the tensor's keys above it, at or above it and non-finite, and
//               the sample's keys above it and at or above it (the host counts the sample after its verdict, in the
//               one direction it needs; counting both here saves a synchronization). The counts and the threshold are
//               read back with one synchronization per pass: dgc is variable-size, so compress must learn the count
//               anyway, and the first threshold aims at the band's middle so that one pass is the common case.
//   compaction  by the cut {threshold, keys above it} with the decided count. The common case takes every key above
//               the threshold, or every key at or above it (the count is clamped to [greater, greater_equal], which
//               leaves a choice only where several elements share the threshold's key): a stateless predicate, so one
//               cub::DeviceSelect pass writes the values and indices in index order (terse/kit/sparse_kernels.cuh's
//               selectEntries: the payload's two sections at once). When only some keys equal to the threshold are
//               taken, the tiled compaction that gives ties to the lower index (terse/kit/topk_select_kernels.cuh's
//               compactByCut); after max_passes misses, the exact top-k's radix select and that compaction.
//
// A non-finite gradient element is refused at compress as on the host: the first counting pass finds it (a tensor
// that is not sampled gets one counting pass for this alone before its exact top-k).

#include <cstddef>
#include <cstdint>

#include "dgc_cuda.h"
#include "dgc_math.h"
#include "terse/kit/cast_kernels.cuh"
#include "terse/kit/device.cuh"
#include "terse/kit/sparse_kernels.cuh"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_one_block.cuh"
#include "terse/kit/topk_select_kernels.cuh"
#include "terse/sdk/cuda.hpp"

namespace terse::compressors::dgc::cuda {
namespace {

namespace tc = kit::topk::cuda;

// One counting pass's result, in the workspace, read back by the host. The threshold is written by thresholdKernel
// before the pass and stays while the counters are cleared for the next.
enum Counter : unsigned {
  kGt,         // tensor keys > t
  kGe,         // tensor keys >= t
  kNonFinite,  // tensor keys of inf or NaN
  kSampleGt,   // sample keys > t
  kSampleGe,   // sample keys >= t
  kCounters
};
struct PassCounts {
  unsigned long long count[kCounters];  // atomicAdd's 64-bit type
  uint32_t t;
  uint32_t reserved;
};
static_assert(sizeof(unsigned long long) == sizeof(uint64_t) && offsetof(PassCounts, t) == sizeof(PassCounts::count),
              "the counters are cleared as one block in front of t");

// Where the workspace's sections are: the select's (State, histogram, compaction; terse/kit/topk_select_kernels.cuh)
// when there is anything to select, then the pass counts, then the sample.
struct WorkLayout {
  tc::Layout select;
  uint64_t pass = 0;
  uint64_t sample = 0;
  uint64_t selected = 0;  // u64: the count the one-pass compaction's DeviceSelect writes
  uint64_t beyond = 0;    // cub's temporary storage for that DeviceSelect
  size_t beyond_bytes = 0;
  uint64_t total = 0;
};

// The one-pass compaction's predicate on element i (kit::sparse::selectEntries): key > cut, or key >= cut when every
// key equal to the cut is taken.
struct Beyond {
  const float* x;
  uint32_t cut;
  bool ties;
  __device__ bool operator()(uint32_t i) const {
    const uint32_t key = kit::topk::magnitudeKey(x[i]);
    return key > cut || (ties && key == cut);
  }
};

WorkLayout workLayout(uint64_t numel, uint64_t k, uint64_t samples) {
  WorkLayout w;
  if (k < numel) {
    w.select = tc::layoutFor(numel);
    w.pass = w.select.total;
  } else {
    samples = 0;  // everything is sent: nothing to select, nothing to sample
  }
  w.sample = w.pass + tc::alignUp(sizeof(PassCounts));
  w.selected = w.sample + tc::alignUp(samples * sizeof(float));
  w.beyond = w.selected + tc::alignUp(sizeof(uint64_t));
  if (k < numel) {
    kit::sparse::selectEntries(nullptr, w.beyond_bytes, nullptr, numel, Beyond{}, nullptr, nullptr, nullptr, nullptr);
  }
  w.total = w.beyond + tc::alignUp(w.beyond_bytes);
  return w;
}

// Quads (4 elements) per thread per block in the counting pass: blocks flush their counters with atomics, so each
// should count many elements.
constexpr uint64_t kCountQuads = 16;

__global__ void sampleKernel(const float* __restrict__ x, uint64_t n, uint64_t s, sdk::PhiloxStream rng,
                             float* __restrict__ sample) {
  for (uint64_t j = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < s; j += uint64_t{gridDim.x} * blockDim.x) {
    sample[j] = x[samplePosition(rng, j, s, n)];
  }
}

// pass->t = nextThreshold(the select's prefix, or -1 when there was no proposal, too_low, too_high).
__global__ void thresholdKernel(const tc::State* __restrict__ state, bool proposed, int64_t too_low, int64_t too_high,
                                PassCounts* pass) {
  const int64_t proposal = proposed ? static_cast<int64_t>(state->prefix) : int64_t{-1};
  pass->t = static_cast<uint32_t>(nextThreshold(proposal, too_low, too_high));
}

// The cut a plan settled on, for the compaction.
__global__ void cutKernel(tc::State* state, uint32_t cut, uint64_t greater) {
  state->prefix = cut;
  state->greater = greater;
}

// dgc_select.h's countPass over x and the two sample counts, against pass->t, added into *pass. Keys are compared as
// integers, as on the host. Per-thread counts stay below 2^32 (n < 2^32), per-block sums too.
__global__ void countPassKernel(const float* __restrict__ x, uint64_t n, const float* __restrict__ sample, uint64_t s,
                                PassCounts* pass) {
  __shared__ unsigned int sums[kCounters];
  if (threadIdx.x < kCounters) sums[threadIdx.x] = 0;
  __syncthreads();
  const uint32_t t = pass->t;
  unsigned int c[kCounters] = {};
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (uint64_t q = first; q < (n + 3) / 4; q += stride) {
    float v[4];
    device::loadQuad(x, 4 * q, n, v);
    for (unsigned j = 0; j < 4; ++j) {
      const uint32_t key = kit::topk::magnitudeKey(v[j]);
      const bool in = 4 * q + j < n;
      c[kGt] += in && key > t ? 1u : 0u;
      c[kGe] += in && key >= t ? 1u : 0u;
      c[kNonFinite] += in && kit::topk::isNonFiniteKey(key) ? 1u : 0u;
    }
  }
  for (uint64_t q = first; q < (s + 3) / 4; q += stride) {
    float v[4];
    device::loadQuad(sample, 4 * q, s, v);
    for (unsigned j = 0; j < 4; ++j) {
      const uint32_t key = kit::topk::magnitudeKey(v[j]);
      const bool in = 4 * q + j < s;
      c[kSampleGt] += in && key > t ? 1u : 0u;
      c[kSampleGe] += in && key >= t ? 1u : 0u;
    }
  }
  for (unsigned i = 0; i < kCounters; ++i) {
    if (c[i] != 0) atomicAdd(&sums[i], c[i]);
  }
  __syncthreads();
  if (threadIdx.x < kCounters && sums[threadIdx.x] != 0) {
    atomicAdd(&pass->count[threadIdx.x], static_cast<unsigned long long>(sums[threadIdx.x]));
  }
}

// One counting pass against the threshold already in pass->t: clears the counters, counts, and reads the result back
// (one synchronization).
PassCounts countPass(const float* x, uint64_t n, const float* sample, uint64_t s, PassCounts* pass, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(pass, 0, offsetof(PassCounts, t), st));
  const uint64_t quads = (n + 3) / 4 + (s + 3) / 4;
  countPassKernel<<<device::gridFor(quads, device::kThreads * kCountQuads), device::kThreads, 0, st>>>(x, n, sample, s,
                                                                                                       pass);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  PassCounts h{};
  device::copyToHost(&h, pass, sizeof h, stream);
  device::synchronize(stream);
  return h;
}

void setThreshold(const tc::State* state, bool proposed, int64_t too_low, int64_t too_high, PassCounts* pass,
                  cudaStream_t st) {
  thresholdKernel<<<1, 1, 0, st>>>(state, proposed, too_low, too_high, pass);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace

uint64_t workspaceBytes(uint64_t numel, uint64_t k, uint64_t samples) {
  if (k == 0) return 0;
  return workLayout(numel, k, samples).total;
}

Plan plan(const float* x, const Shape& shape, const sdk::PhiloxStream& rng, std::byte* workspace, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  const uint64_t n = shape.n, k = shape.k, s = shape.s;
  const WorkLayout w = workLayout(n, k, s);
  auto* pass = reinterpret_cast<PassCounts*>(workspace + w.pass);
  Plan p;
  if (k >= n || s == 0 || s >= n || shape.max_passes < 1) {
    // Exact from the start, as on the host; one pass for the host's refusal of a non-finite gradient (its exact top-k
    // would select it), against any threshold.
    TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(pass, 0, sizeof(PassCounts), st));
    p.nonfinite = countPass(x, n, nullptr, 0, pass, stream).count[kNonFinite] > 0;
    p.exact = true;
    p.count = k;
    return p;
  }
  auto* state = reinterpret_cast<tc::State*>(workspace);
  auto* hist = reinterpret_cast<uint32_t*>(workspace + w.select.hist);
  auto* sample = reinterpret_cast<float*>(workspace + w.sample);
  sampleKernel<<<device::gridFor(s, device::kThreads), device::kThreads, 0, st>>>(x, n, s, rng, sample);
  TERSE_COMPRESSOR_CHECK_LAUNCH();

  const uint64_t lo = minCount(k), hi = maxCount(k);
  int64_t too_low = -1;
  int64_t too_high = int64_t{1} << 31;
  // The first threshold: the sample's kAim k s / n-th largest key, taken whatever it is (every key lies inside the
  // initial bracket).
  tc::radixSelect(sample, s, sampleRank(firstRank(k, s, n), s), state, hist, st);
  setThreshold(state, true, too_low, too_high, pass, st);
  for (int i = 1; i <= shape.max_passes; ++i) {
    const PassCounts c = countPass(x, n, sample, s, pass, stream);
    p.passes = i;
    const uint64_t gt = c.count[kGt], ge = c.count[kGe];
    if (c.count[kNonFinite] > 0) {
      p.nonfinite = true;
      return p;
    }
    if (acceptable(gt, ge, lo, hi)) {
      p.cut = c.t;
      p.greater = gt;
      p.greater_equal = ge;
      p.count = countFor(k, gt, ge);
      return p;
    }
    const bool too_many = gt > hi;
    if (too_many) {
      too_low = c.t;
    } else {
      too_high = c.t;
    }
    if (i == shape.max_passes) break;
    const uint64_t sample_hits = too_many ? c.count[kSampleGt] : c.count[kSampleGe];
    const uint64_t hits = too_many ? gt : ge;
    const bool proposed = sample_hits > 0 && hits > 0;
    if (proposed) tc::radixSelect(sample, s, sampleRank(nextRank(sample_hits, k, hits), s), state, hist, st);
    setThreshold(state, proposed, too_low, too_high, pass, st);
  }
  p.exact = true;
  p.count = k;
  return p;
}

void write(const device::Prefix& prefix, const float* x, const Shape& shape, const Plan& p, std::byte* workspace,
           std::byte* payload, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, payload, stream);
  if (p.count == 0) return;
  float* values = reinterpret_cast<float*>(payload + kit::sparse::kFixedBytes);
  uint32_t* indices = reinterpret_cast<uint32_t*>(payload + kit::sparse::kFixedBytes + sizeof(float) * p.count);
  if (p.count >= shape.n) {
    tc::takeAll(x, shape.n, values, indices, st);
    return;
  }
  const WorkLayout w = workLayout(shape.n, shape.k, shape.s);
  if (!p.exact && (p.count == p.greater || p.count == p.greater_equal)) {
    size_t beyond_bytes = w.beyond_bytes;
    kit::sparse::selectEntries(workspace + w.beyond, beyond_bytes, x, shape.n, Beyond{x, p.cut, p.count != p.greater},
                               values, indices, reinterpret_cast<uint64_t*>(workspace + w.selected), st);
    return;
  }
  const tc::Layout& l = w.select;
  auto* state = reinterpret_cast<tc::State*>(workspace);
  if (p.exact) {
    tc::radixSelect(x, shape.n, p.count, state, reinterpret_cast<uint32_t*>(workspace + l.hist), st);
  } else {
    cutKernel<<<1, 1, 0, st>>>(state, p.cut, p.greater);
    TERSE_COMPRESSOR_CHECK_LAUNCH();
  }
  tc::compactByCut(x, shape.n, p.count, l, workspace, values, indices, st);
}

void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t* status, void* stream) {
  kit::sparse::launchValidateSparse<false>(expected, payload, count, numel, 0, status, stream);
}

void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  kit::sparse::launchScatter(payload, count, numel, out, accumulate, stream, gate);
}

void selectOneBlock(const device::Prefix& prefix, const float* x, uint64_t n, uint64_t k, uint32_t* nonfinite,
                    std::byte* payload, void* stream) {
  tc::selectOneBlock(prefix, x, n, k, payload, device::streamOf(stream), nonfinite);
}

void validateAndDecodeOneBlock(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
                               float* out, bool accumulate, uint32_t* status, void* stream) {
  kit::sparse::launchValidateAndScatterOneBlock<false>(expected, payload, count, numel, 0, out, accumulate, status,
                                                       stream);
}

}  // namespace terse::compressors::dgc::cuda
