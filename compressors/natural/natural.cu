// natural's kernels, calling natural_math.h's functions as the host loops in natural.cc do, so the device payload is
// the host payload bit for bit:
//   quantize   terse/kit/pack_kernels.cuh with encodeValue: one Philox block per 4, 8 or 16 elements (rounding_bits
//              24, 16 or 8; the host's stream layout, sdk/philox.hpp's drawAt), 9-bit codes packed by the host's
//              bitpack::packGroup<9> / packTail<9>. No pass before it: the code of an element depends on nothing else.
//   validate   one thread per 64-code group / prefix byte, raising the status word on anything the host refuses.
//   decode     terse/kit/pack_kernels.cuh with decodeValue.
#include <cstddef>
#include <cstdint>

#include "natural_cuda.h"
#include "natural_math.h"
#include "terse/kit/device.cuh"
#include "terse/kit/pack_kernels.cuh"
#include "terse/sdk/bitpack.hpp"

namespace terse::compressors::natural::cuda {
namespace {

namespace bitpack = sdk::bitpack;

// No per-run constants: a run is the whole tensor.
struct Coder {
  struct Run {
    uint64_t end;
  };
  __device__ Run run(uint64_t) const { return {~uint64_t{0}}; }
  __device__ uint32_t operator()(const Run&, float v, uint32_t random_bits) const {
    return encodeValue(v, random_bits);
  }
};

struct Decoder {
  struct Run {
    uint64_t end;
  };
  __device__ Run run(uint64_t) const { return {~uint64_t{0}}; }
  __device__ float operator()(const Run&, uint32_t code) const { return decodeValue(code); }
};

TERSE_HD const uint64_t* wordsOf(const Shape& s, const std::byte* payload) {
  return reinterpret_cast<const uint64_t*>(payload + s.words_offset);
}

// Whether any of group g's codes (64 consecutive ones, fewer in the last group) is one encodeValue never writes for a
// finite input.
__device__ bool groupHasInvalidCode(const uint64_t* words, uint64_t g, uint64_t numel) {
  const uint64_t first = g * bitpack::kGroup;
  const uint64_t last = numel - first < bitpack::kGroup ? numel : first + bitpack::kGroup;
  bool bad = false;
  for (uint64_t i = first; i < last; ++i) bad |= !codeIsValid(bitpack::get(words, i, kCodeBits));
  return bad;
}

__global__ void validateKernel(const std::byte* __restrict__ payload, device::Prefix expected, Shape s, uint64_t groups,
                               uint32_t* status) {
  const uint64_t* words = wordsOf(s, payload);
  const uint64_t items = groups > s.words_offset ? groups : s.words_offset;
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < items; t += uint64_t{gridDim.x} * blockDim.x) {
    device::checkPrefix(payload, expected, t, status);
    if (t < groups && groupHasInvalidCode(words, t, s.numel)) device::raiseStatus(status);
    if (t == 0 && !bitpack::paddingIsZero(words, s.numel, kCodeBits)) device::raiseStatus(status);
  }
}

}  // namespace

void compress(const Shape& shape, const device::Prefix& prefix, const float* x, const sdk::PhiloxStream& rng,
              unsigned rounding_bits, std::byte* payload, void* stream) {
  device::writePrefix(prefix, payload, stream);
  device::launchQuantize<kCodeBits>(rounding_bits, x, shape.numel, rng, Coder{},
                                    reinterpret_cast<uint64_t*>(payload + shape.words_offset), stream);
}

void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, uint32_t* status,
              void* stream) {
  const uint64_t groups = (shape.numel + bitpack::kGroup - 1) / bitpack::kGroup;
  const uint64_t items = groups > shape.words_offset ? groups : shape.words_offset;
  validateKernel<<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      payload, expected, shape, groups, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  device::launchDecodeCodes<kCodeBits>(wordsOf(shape, payload), shape.numel, Decoder{}, out, accumulate, stream, gate);
}

}  // namespace terse::compressors::natural::cuda
