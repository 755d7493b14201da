// onebit's kernels, calling onebit_math.h's functions as the host loops in onebit.cc do, so the device payload is the
// host payload bit for bit:
//   scales   one thread per (bucket, lane): laneBucketSums, the kLanes totals summed into the bucket's first lane by
//            combineLanes's own tree of additions, run as warp shuffles, then twoMeans or meanAbs. That is bucketSums's
//            own order of f32 and double additions, which a generic (cub) reduction would not keep.
//   signs    terse/kit/pack_kernels.cuh's sign words (signBit's bit, in the bitpack width-1 layout).
//   validate one thread per scale / prefix byte, raising the status word on anything the host refuses.
//   decode   terse/kit/pack_kernels.cuh with decodeValue.
// Cost note: a bucket is summed by kLanes = 16 threads, so a bucket of d elements takes about d / 16 dependent f32
// additions (32 for the default 512). A whole-tensor bucket of millions of elements is correct but slow on the GPU.
#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "onebit_cuda.h"
#include "onebit_math.h"
#include "terse/kit/device.cuh"
#include "terse/kit/pack_kernels.cuh"
#include "terse/sdk/bitpack.hpp"

namespace terse::compressors::onebit::cuda {
namespace {

namespace bitpack = sdk::bitpack;

static_assert(32 % kLanes == 0 && device::kThreads % kLanes == 0, "a bucket's lanes must share one warp");

TERSE_HD const float* scalesOf(const Shape& s, const std::byte* payload) {
  return reinterpret_cast<const float*>(payload + s.scales_offset);
}
TERSE_HD const uint64_t* wordsOf(const Shape& s, const std::byte* payload) {
  return reinterpret_cast<const uint64_t*>(payload + s.words_offset);
}

// Lane (this lane + w)'s v, within the bucket's kLanes lanes (a lane past them gets its own v, which no one uses).
__device__ double sumFromLane(double v, unsigned w) {
  return __shfl_down_sync(0xFFFFFFFFu, v, w, kLanes);
}

__global__ void scalesKernel(const float* __restrict__ x, Shape s, float* __restrict__ scales) {
  const uint64_t threads = s.buckets * kLanes;
  // The loop bound depends on the block only, so every thread of a warp reaches the shuffles together.
  for (uint64_t t0 = uint64_t{blockIdx.x} * blockDim.x; t0 < threads; t0 += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t t = t0 + threadIdx.x;
    const bool active = t < threads;
    const uint64_t b = t / kLanes;
    const unsigned lane = static_cast<unsigned>(t % kLanes);
    const uint64_t start = b * s.bucket;
    const uint64_t n = active ? (s.numel - start < s.bucket ? s.numel - start : s.bucket) : 0;
    BucketSums sums{0, 0, 0};
    if (active) sums = laneBucketSums(x + start, n, lane);
    // combineLanes's pairwise tree run on the lanes themselves: at width w lane l adds lane l + w's totals, the
    // additions combineLanes makes on its arrays, so lane 0 ends with its result bit for bit. (Gathering all kLanes
    // totals into every thread first took 48 shuffles and 108 registers a thread.)
    for (unsigned w = kLanes / 2; w > 0; w /= 2) {
      sums.positive += sumFromLane(sums.positive, w);
      sums.negative_abs += sumFromLane(sums.negative_abs, w);
      sums.negatives += sumFromLane(sums.negatives, w);
    }
    if (active && lane == 0) {
      if (s.scales_per_bucket == 2) {
        twoMeans(sums, n, &scales[2 * b], &scales[2 * b + 1]);
      } else {
        scales[b] = meanAbs(sums, n);
      }
    }
  }
}

// decodeValue with its bucket's magnitudes, as debinarizeAll picks them (pos = scale k*b, neg = scale k*b + k - 1).
struct Decoder {
  const float* scales;
  uint64_t bucket;
  uint32_t k;
  struct Run {
    uint64_t end;
    float pos, neg;
  };
  __device__ Run run(uint64_t i) const {
    const uint64_t b = i / bucket;
    return {(b + 1) * bucket, scales[k * b], scales[k * b + k - 1]};
  }
  __device__ float operator()(const Run& r, uint32_t bit) const { return decodeValue(bit, r.pos, r.neg); }
};

__global__ void validateKernel(const std::byte* __restrict__ payload, device::Prefix expected, Shape s,
                               uint32_t* status) {
  const float* scales = scalesOf(s, payload);
  const uint64_t count = s.buckets * s.scales_per_bucket;
  const uint64_t pad_begin = s.scales_offset + count * sizeof(float);
  const uint64_t items = count > s.words_offset ? count : s.words_offset;
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < items; t += uint64_t{gridDim.x} * blockDim.x) {
    device::checkPrefix(payload, expected, t, status);
    if (t >= pad_begin && t < s.words_offset && payload[t] != std::byte{0}) device::raiseStatus(status);
    if (t < count && !(scales[t] >= 0.0f && scales[t] <= FLT_MAX)) device::raiseStatus(status);
    if (t == 0 && !bitpack::paddingIsZero(wordsOf(s, payload), s.numel, 1)) device::raiseStatus(status);
  }
}

}  // namespace

void compress(const Shape& shape, const device::Prefix& prefix, const float* x, std::byte* payload, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, payload, stream);
  const uint64_t pad_begin = shape.scales_offset + shape.buckets * shape.scales_per_bucket * sizeof(float);
  if (shape.words_offset > pad_begin) {
    TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(payload + pad_begin, 0, shape.words_offset - pad_begin, st));
  }
  if (shape.numel == 0) return;
  scalesKernel<<<device::gridFor(shape.buckets * kLanes, device::kThreads), device::kThreads, 0, st>>>(
      x, shape, reinterpret_cast<float*>(payload + shape.scales_offset));
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  device::launchSignWords(x, shape.numel, reinterpret_cast<uint64_t*>(payload + shape.words_offset), nullptr, 0,
                          stream);
}

void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, uint32_t* status,
              void* stream) {
  const uint64_t count = shape.buckets * shape.scales_per_bucket;
  const uint64_t items = count > shape.words_offset ? count : shape.words_offset;
  validateKernel<<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      payload, expected, shape, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  const Decoder decoder{scalesOf(shape, payload), shape.bucket, shape.scales_per_bucket};
  device::launchDecodeCodes<1>(wordsOf(shape, payload), shape.numel, decoder, out, accumulate, stream, gate);
}

}  // namespace terse::compressors::onebit::cuda
