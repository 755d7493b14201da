// qsgd's kernels, calling qsgd_math.h's functions as the host loops in qsgd.cc do, so the device payload is the host
// payload bit for bit:
//   norms      one thread per (bucket, lane): laneSumSquares, the kLanes sums added into the bucket's first lane by
//              combineLanes's own tree of additions, run as warp shuffles, then normOf. That is sumSquares's own order
//              of double additions, which a generic (cub) reduction would not keep, and the norm feeds every code.
//   quantize   terse/kit/pack_kernels.cuh with quantizeValue: one Philox block per 4, 8 or 16 elements (rounding_bits
//              24, 16 or 8; the host's stream layout, sdk/philox.hpp's drawAt), codes packed by the host's
//              bitpack::packGroup / packTail.
//   validate   one thread per 64-code group (when levels leave invalid codes possible) / norm / prefix byte, raising
//              the status word on anything the host refuses.
//   decode     terse/kit/pack_kernels.cuh with decodeValue.
// Cost note: a bucket is summed by kLanes = 8 threads, so a bucket of d elements takes d / 8 dependent double additions
// (64 for the default 512). A whole-tensor bucket of millions of elements is correct but slow on the GPU.
#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "qsgd_coders.cuh"
#include "qsgd_cuda.h"
#include "qsgd_math.h"
#include "terse/kit/device.cuh"
#include "terse/kit/pack_kernels.cuh"
#include "terse/sdk/bitpack.hpp"

namespace terse::compressors::qsgd::cuda {
namespace {

namespace bitpack = sdk::bitpack;

static_assert(32 % kLanes == 0 && device::kThreads % kLanes == 0, "a bucket's lanes must share one warp");

TERSE_HD const float* normsOf(const Shape& s, const std::byte* payload) {
  return reinterpret_cast<const float*>(payload + s.norms_offset);
}
TERSE_HD const uint64_t* wordsOf(const Shape& s, const std::byte* payload) {
  return reinterpret_cast<const uint64_t*>(payload + s.words_offset);
}

__global__ void normsKernel(const float* __restrict__ x, Shape s, float* __restrict__ norms) {
  const uint64_t threads = s.buckets * kLanes;
  // The loop bound depends on the block only, so every thread of a warp reaches the shuffles together.
  for (uint64_t t0 = uint64_t{blockIdx.x} * blockDim.x; t0 < threads; t0 += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t t = t0 + threadIdx.x;
    const bool active = t < threads;
    const uint64_t b = t / kLanes;
    const unsigned lane = static_cast<unsigned>(t % kLanes);
    double sum = 0;
    if (active) {
      const uint64_t start = b * s.bucket;
      const uint64_t n = s.numel - start < s.bucket ? s.numel - start : s.bucket;
      sum = laneSumSquares(x + start, n, lane);
    }
    // combineLanes's pairwise tree run on the lanes themselves (at width w lane l adds lane l + w's sum, the additions
    // combineLanes makes on its array), so lane 0 ends with its result bit for bit, in 3 shuffles instead of 8.
    for (unsigned w = kLanes / 2; w > 0; w /= 2) sum += __shfl_down_sync(0xFFFFFFFFu, sum, w, kLanes);
    if (active && lane == 0) norms[b] = normOf(sum);
  }
}

// Whether any of group g's codes (64 consecutive ones, fewer in the last group) is one quantizeValue cannot produce.
__device__ bool groupHasInvalidCode(const uint64_t* words, uint64_t g, const Shape& s) {
  const uint64_t first = g * bitpack::kGroup;
  const uint64_t last = s.numel - first < bitpack::kGroup ? s.numel : first + bitpack::kGroup;
  bool bad = false;
  for (uint64_t i = first; i < last; ++i) {
    bad |= !codeIsValid(bitpack::get(words, i, s.code_bits), static_cast<uint32_t>(s.levels), s.mag_bits);
  }
  return bad;
}

// One thread per prefix byte / padding byte / norm, and per group of 64 codes when the codes need a scan (check_codes:
// levels below 2^mag_bits - 1). (One thread per element, scan or not, made validation 3.5x the decode's time on an
// H100: 16M threads for a 64 MiB tensor whose codes the default levels cannot make invalid.)
__global__ void validateKernel(const std::byte* __restrict__ payload, device::Prefix expected, Shape s, uint64_t groups,
                               uint32_t* status) {
  const float* norms = normsOf(s, payload);
  const uint64_t* words = wordsOf(s, payload);
  const uint64_t pad_begin = s.norms_offset + s.buckets * sizeof(float);
  uint64_t items = groups > s.buckets ? groups : s.buckets;
  items = items > s.words_offset ? items : s.words_offset;
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < items; t += uint64_t{gridDim.x} * blockDim.x) {
    device::checkPrefix(payload, expected, t, status);
    if (t >= pad_begin && t < s.words_offset && payload[t] != std::byte{0}) device::raiseStatus(status);
    if (t < s.buckets && !(norms[t] >= 0.0f && norms[t] <= FLT_MAX)) device::raiseStatus(status);
    if (t < groups && groupHasInvalidCode(words, t, s)) device::raiseStatus(status);
    if (t == 0 && !bitpack::paddingIsZero(words, s.numel, s.code_bits)) device::raiseStatus(status);
  }
}

}  // namespace

void compress(const Shape& shape, const device::Prefix& prefix, const float* x, const sdk::PhiloxStream& rng,
              unsigned rounding_bits, std::byte* payload, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, payload, stream);
  const uint64_t pad_begin = shape.norms_offset + shape.buckets * sizeof(float);
  if (shape.words_offset > pad_begin) {
    TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(payload + pad_begin, 0, shape.words_offset - pad_begin, st));
  }
  if (shape.numel == 0) return;
  float* norms = reinterpret_cast<float*>(payload + shape.norms_offset);
  uint64_t* words = reinterpret_cast<uint64_t*>(payload + shape.words_offset);
  normsKernel<<<device::gridFor(shape.buckets * kLanes, device::kThreads), device::kThreads, 0, st>>>(x, shape, norms);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  const float levels_f = static_cast<float>(shape.levels);
  device::launchQuantize<kMinCodeBits, kMaxCodeBits>(shape.code_bits, rounding_bits, x, shape.numel, rng,
                                                     Coder{norms, shape.bucket, levels_f, shape.levels, shape.mag_bits},
                                                     words, stream);
}

void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, bool check_codes,
              uint32_t* status, void* stream) {
  const uint64_t groups = check_codes ? (shape.numel + bitpack::kGroup - 1) / bitpack::kGroup : 0;
  uint64_t items = groups > shape.buckets ? groups : shape.buckets;
  items = items > shape.words_offset ? items : shape.words_offset;
  validateKernel<<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      payload, expected, shape, groups, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  const Decoder decoder{normsOf(shape, payload), shape.bucket, static_cast<float>(shape.levels), shape.mag_bits};
  device::launchDecodeCodes<kMinCodeBits, kMaxCodeBits>(wordsOf(shape, payload), shape.numel, shape.code_bits, decoder,
                                                        out, accumulate, stream, gate);
}

}  // namespace terse::compressors::qsgd::cuda
