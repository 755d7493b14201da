// signsgd's kernels, calling signsgd_math.h's functions as the host loops in signsgd.cc do, so device payloads,
// reductions and decodes are the host's bit for bit (the math is sign bits, integer votes and one product per value):
//   compress   terse/kit/pack_kernels.cuh's sign words (signBit's bit, in the bitpack width-1 layout), whose NaN
//              check (isNan's test) poisons the payload.
//   validate   one thread per prefix byte (against the prefix the host expects) and per count (countIsValid) or
//              padding byte; a raw payload's section only needs its padding bits.
//   decode     one thread per 4 elements with decodeSign / decodeCount, one 16-byte store.
//   fold       one thread per element: vote() of a raw bit or the stored count, added as the host's fold does.
#include <cstddef>
#include <cstdint>

#include "signsgd_cuda.h"
#include "signsgd_math.h"
#include "terse/kit/device.cuh"
#include "terse/kit/pack_kernels.cuh"
#include "terse/sdk/bitpack.hpp"

namespace terse::compressors::signsgd::cuda {
namespace {

namespace bitpack = sdk::bitpack;

constexpr uint64_t kPrefixBytes = 32;

TERSE_HD uint64_t sectionBytes(uint64_t numel, uint32_t count_bytes) {
  return count_bytes == 0 ? 8 * bitpack::wordCount(numel, 1) : (numel * count_bytes + 7) / 8 * 8;
}

template <class T>
__device__ int32_t countAt(const std::byte* counts, uint64_t i) {
  return reinterpret_cast<const T*>(counts)[i];
}

__device__ int32_t countOf(const std::byte* counts, uint32_t count_bytes, uint64_t i) {
  return count_bytes == 1   ? countAt<int8_t>(counts, i)
         : count_bytes == 2 ? countAt<int16_t>(counts, i)
                            : countAt<int32_t>(counts, i);
}

// One input's vote count of element i: the raw bit's vote, or the stored count.
__device__ int32_t votesOf(const std::byte* payload, uint32_t count_bytes, uint64_t i) {
  const std::byte* section = payload + kPrefixBytes;
  if (count_bytes == 0) return vote(bitpack::get(reinterpret_cast<const uint64_t*>(section), i, 1));
  return countOf(section, count_bytes, i);
}

// Thread t checks prefix byte t (against the prefix signsgd.cc expects) and section byte t: a count's range and
// parity, or a padding byte. A raw section needs only its last word's padding bits, which thread 0 checks.
__global__ void validateKernel(const std::byte* __restrict__ payload, device::Prefix expected, uint64_t numel,
                               uint32_t count_bytes, int32_t voters, uint32_t* status) {
  const std::byte* section = payload + kPrefixBytes;
  const uint64_t used = numel * count_bytes, bytes = count_bytes == 0 ? 0 : sectionBytes(numel, count_bytes);
  const uint64_t items = bytes > kPrefixBytes ? bytes : kPrefixBytes;
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < items; t += uint64_t{gridDim.x} * blockDim.x) {
    device::checkPrefix(payload, expected, t, status);
    if (count_bytes == 0) {
      if (t == 0 && !bitpack::paddingIsZero(reinterpret_cast<const uint64_t*>(section), numel, 1)) {
        device::raiseStatus(status);
      }
      continue;
    }
    if (t < numel && !countIsValid(countOf(section, count_bytes, t), voters)) device::raiseStatus(status);
    if (t >= used && t < bytes && section[t] != std::byte{0}) device::raiseStatus(status);
  }
}

struct RawDecoder {
  float scale;
  struct Run {
    uint64_t end;  // one run: every bit decodes with the same scale
  };
  __device__ Run run(uint64_t) const { return {UINT64_MAX}; }
  __device__ float operator()(const Run&, uint32_t bit) const { return decodeSign(bit, scale); }
};

__global__ void decodeCountsKernel(const std::byte* __restrict__ payload, uint64_t numel, uint32_t count_bytes,
                                   float magnitude, float* __restrict__ out, bool accumulate, const uint32_t* gate) {
  if (device::gateRaised(gate)) return;  // a deferred verdict refused the payload (terse/kit/device.hpp)
  const std::byte* counts = payload + kPrefixBytes;
  const uint64_t quads = (numel + 3) / 4;
  for (uint64_t q = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; q < quads; q += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t i0 = 4 * q;
    float o[4];
    if (accumulate) device::loadQuad(out, i0, numel, o);
    for (unsigned j = 0; j < 4 && i0 + j < numel; ++j) {
      const float v = decodeCount(countOf(counts, count_bytes, i0 + j), magnitude);
      o[j] = accumulate ? o[j] + v : v;
    }
    device::storeQuad(out, i0, numel, o);
  }
}

template <class T>
__global__ void foldKernel(const std::byte* __restrict__ a, uint32_t a_count_bytes, const std::byte* __restrict__ b,
                           uint32_t b_count_bytes, uint64_t numel, T* __restrict__ out) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += uint64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<T>(votesOf(a, a_count_bytes, i) + votesOf(b, b_count_bytes, i));  // |sum| <= world_size fits
  }
}

}  // namespace

void compress(const device::Prefix& prefix, const float* x, uint64_t numel, std::byte* payload, void* stream) {
  device::writePrefix(prefix, payload, stream);
  // The NaN flag is written after the prefix kernel, in stream order.
  device::launchSignWords(x, numel, reinterpret_cast<uint64_t*>(payload + kPrefixBytes),
                          reinterpret_cast<uint32_t*>(payload + kKindOffset), kPoisonedKind, stream);
}

void validate(const device::Prefix& expected, const std::byte* payload, uint64_t numel, uint32_t count_bytes,
              int32_t voters, uint32_t* status, void* stream) {
  const uint64_t section = count_bytes == 0 ? 0 : sectionBytes(numel, count_bytes);
  const uint64_t items = section > kPrefixBytes ? section : kPrefixBytes;
  validateKernel<<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      payload, expected, numel, count_bytes, voters, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decodeRaw(const std::byte* payload, uint64_t numel, float scale, float* out, bool accumulate, void* stream,
               const uint32_t* gate) {
  device::launchDecodeCodes<1>(reinterpret_cast<const uint64_t*>(payload + kPrefixBytes), numel, RawDecoder{scale}, out,
                               accumulate, stream, gate);
}

void decodeCounts(const std::byte* payload, uint64_t numel, uint32_t count_bytes, float magnitude, float* out,
                  bool accumulate, void* stream, const uint32_t* gate) {
  if (numel == 0) return;
  decodeCountsKernel<<<device::gridFor((numel + 3) / 4, device::kThreads), device::kThreads, 0,
                       device::streamOf(stream)>>>(payload, numel, count_bytes, magnitude, out, accumulate, gate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void fold(const device::Prefix& prefix, const std::byte* a, uint32_t a_count_bytes, const std::byte* b,
          uint32_t b_count_bytes, uint64_t numel, uint32_t count_bytes, std::byte* output, uint64_t total,
          void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, output, stream);
  const uint64_t used = kPrefixBytes + numel * count_bytes;
  if (total > used) TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(output + used, 0, total - used, st));
  if (numel == 0) return;
  const unsigned grid = device::gridFor(numel, device::kThreads);
  std::byte* counts = output + kPrefixBytes;
  if (count_bytes == 1) {
    foldKernel<<<grid, device::kThreads, 0, st>>>(a, a_count_bytes, b, b_count_bytes, numel,
                                                  reinterpret_cast<int8_t*>(counts));
  } else if (count_bytes == 2) {
    foldKernel<<<grid, device::kThreads, 0, st>>>(a, a_count_bytes, b, b_count_bytes, numel,
                                                  reinterpret_cast<int16_t*>(counts));
  } else {
    foldKernel<<<grid, device::kThreads, 0, st>>>(a, a_count_bytes, b, b_count_bytes, numel,
                                                  reinterpret_cast<int32_t*>(counts));
  }
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace terse::compressors::signsgd::cuda
