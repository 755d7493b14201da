// terngrad's kernels, calling terngrad_math.h's functions as the host loops in terngrad.cc do, so the device payload
// is the host payload bit for bit:
//   scalers    a max of magnitudeBits, which is exact in any order: each warp reduces up to kChunk elements of one
//              bucket (coalesced loads, then warp shuffles) and folds its result into the bucket's scaler with
//              atomicMax on the bits (zeroed first), so one bucket may span many warps (the paper's whole-tensor
//              scaler) or one. (A block per chunk with cub::BlockReduce ran at a third of the memory bandwidth on an
//              H100 for the default 512-element buckets: two elements per thread, then a block-wide reduction and
//              barrier.)
//   quantize   terse/kit/pack_kernels.cuh with quantizeValue: one Philox block per 4, 8 or 16 elements
//              (rounding_bits 24, 16 or 8; the host's stream layout, sdk/philox.hpp's drawAt), 2-bit codes packed by
//              the host's bitpack::packGroup<2> / packTail<2>.
//   validate   one thread per code word / scaler / prefix byte, raising the status word on anything the host refuses.
//   decode     terse/kit/pack_kernels.cuh with decodeValue.
#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "terngrad_cuda.h"
#include "terngrad_math.h"
#include "terse/kit/device.cuh"
#include "terse/kit/pack_kernels.cuh"
#include "terse/sdk/bitpack.hpp"

namespace terse::compressors::terngrad::cuda {

namespace {

namespace bitpack = sdk::bitpack;

constexpr unsigned kChunk = 32 * 32;  // elements one warp reduces per item: 32 per lane

TERSE_HD float* scalesOf(const Shape& s, std::byte* payload) {
  return reinterpret_cast<float*>(payload + s.scales_offset);
}
TERSE_HD const float* scalesOf(const Shape& s, const std::byte* payload) {
  return reinterpret_cast<const float*>(payload + s.scales_offset);
}
TERSE_HD const uint64_t* wordsOf(const Shape& s, const std::byte* payload) {
  return reinterpret_cast<const uint64_t*>(payload + s.words_offset);
}

uint64_t chunksPerBucket(const Shape& s) {
  return (s.bucket + kChunk - 1) / kChunk;
}

// scale_bits[b] = max(scale_bits[b], magnitudeBits of the chunk's elements), one warp per chunk.
__global__ void maxAbsKernel(const float* __restrict__ x, Shape s, uint64_t chunks_per_bucket,
                             uint32_t* __restrict__ scale_bits) {
  const unsigned lane = threadIdx.x % 32;
  const uint64_t warps = uint64_t{gridDim.x} * blockDim.x / 32;
  const uint64_t items = s.buckets * chunks_per_bucket;
  for (uint64_t item = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; item < items; item += warps) {
    const uint64_t b = item / chunks_per_bucket;  // warp-uniform, so every lane reaches the shuffles
    const uint64_t bucket_end = (b + 1) * s.bucket < s.numel ? (b + 1) * s.bucket : s.numel;
    const uint64_t begin = b * s.bucket + (item % chunks_per_bucket) * kChunk;
    const uint64_t end = begin + kChunk < bucket_end ? begin + kChunk : bucket_end;
    uint32_t m = 0;
    for (uint64_t i = begin + lane; i < end; i += 32) {
      const uint32_t a = magnitudeBits(x[i]);
      m = a > m ? a : m;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, m, offset);
      m = other > m ? other : m;
    }
    if (lane == 0 && m != 0) atomicMax(scale_bits + b, m);
  }
}

// A bucket's scaler for the elements around i (terse/kit/pack_kernels.cuh's runs): looked up once per run of a thread's
// elements in one bucket, by the coder and the decoder alike.
struct ScaleRuns {
  const float* scales;
  uint64_t bucket;
  struct Run {
    uint64_t end;
    float scale;
  };
  __device__ Run run(uint64_t i) const {
    const uint64_t b = i / bucket;
    return {(b + 1) * bucket, scales[b]};
  }
};

// quantizeValue with its bucket's scaler, as ternarizeAll computes it.
struct Coder : ScaleRuns {
  __device__ uint32_t operator()(const Run& r, float v, uint32_t random_bits) const {
    return quantizeValue(v, r.scale, random_bits);
  }
};

struct Decoder : ScaleRuns {
  __device__ float operator()(const Run& r, uint32_t code) const { return decodeValue(code, r.scale); }
};

__global__ void validateKernel(const std::byte* __restrict__ payload, device::Prefix expected, Shape s, uint64_t words,
                               uint32_t* status) {
  const float* scales = scalesOf(s, payload);
  const uint64_t* w = wordsOf(s, payload);
  const uint64_t pad_begin = s.scales_offset + s.buckets * sizeof(float);
  uint64_t items = words > s.buckets ? words : s.buckets;
  items = items > s.words_offset ? items : s.words_offset;
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < items; t += uint64_t{gridDim.x} * blockDim.x) {
    device::checkPrefix(payload, expected, t, status);
    if (t >= pad_begin && t < s.words_offset && payload[t] != std::byte{0}) device::raiseStatus(status);
    if (t < s.buckets && !(scales[t] >= 0.0f && scales[t] <= FLT_MAX)) device::raiseStatus(status);
    if (t < words && wordHasInvalidCode(w[t])) device::raiseStatus(status);
    if (t == 0 && !bitpack::paddingIsZero(w, s.numel, kCodeBits)) device::raiseStatus(status);
  }
}

}  // namespace

void compress(const Shape& shape, const device::Prefix& prefix, const float* x, const sdk::PhiloxStream& rng,
              unsigned rounding_bits, std::byte* payload, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, payload, stream);
  // The scalers start at 0 for atomicMax (a bucket of zeros keeps 0), and the padding after them must be 0 anyway.
  if (shape.words_offset > shape.scales_offset) {
    TERSE_SDK_CUDA_CHECK(
        cudaMemsetAsync(payload + shape.scales_offset, 0, shape.words_offset - shape.scales_offset, st));
  }
  if (shape.numel == 0) return;
  float* scales = scalesOf(shape, payload);
  const uint64_t chunks = chunksPerBucket(shape);
  maxAbsKernel<<<device::gridFor(shape.buckets * chunks, device::kThreads / 32), device::kThreads, 0, st>>>(
      x, shape, chunks, reinterpret_cast<uint32_t*>(scales));
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  device::launchQuantize<kCodeBits>(rounding_bits, x, shape.numel, rng, Coder{{scales, shape.bucket}},
                                    reinterpret_cast<uint64_t*>(payload + shape.words_offset), stream);
}

void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, uint32_t* status,
              void* stream) {
  const uint64_t words = bitpack::wordCount(shape.numel, kCodeBits);
  uint64_t items = words > shape.buckets ? words : shape.buckets;
  items = items > shape.words_offset ? items : shape.words_offset;
  validateKernel<<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      payload, expected, shape, words, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  device::launchDecodeCodes<kCodeBits>(wordsOf(shape, payload), shape.numel,
                                       Decoder{{scalesOf(shape, payload), shape.bucket}}, out, accumulate, stream,
                                       gate);
}

}  // namespace terse::compressors::terngrad::cuda
