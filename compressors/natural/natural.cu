// natural's kernels, calling natural_math.h's functions as the host loops in natural.cc do, so the device payload is
// the host payload bit for bit:
//   exponents  one thread per Philox block: 4, 8 or 16 elements (rounding_bits 24, 16 or 8; the host's stream layout,
//              sdk/philox.hpp's drawAt), each element's rounded exponent byte.
//   signs      terse/kit/pack_kernels.cuh's sign words, the layout kit/sign_bits.hpp gives the host.
//   validate   one thread per exponent byte (and its padding) / prefix byte, raising the status word on anything the
//              host refuses.
//   decode     one thread per element (grid-stride).
#include <cstddef>
#include <cstdint>

#include "natural_cuda.h"
#include "natural_math.h"
#include "terse/kit/device.cuh"
#include "terse/kit/pack_kernels.cuh"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::natural::cuda {
namespace {

constexpr unsigned kGroup = sdk::bitpack::kGroup;

template <unsigned B>
__global__ void exponentsKernel(const float* __restrict__ x, uint64_t numel, sdk::PhiloxStream rng,
                                uint8_t* __restrict__ exponents) {
  constexpr unsigned K = 4 * sdk::drawsPerWord(B);  // elements per Philox block
  const uint64_t blocks = (numel + K - 1) / K;
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < blocks;
       t += uint64_t{gridDim.x} * blockDim.x) {
    const auto r = rng.block(t);
    const uint64_t i0 = t * K;
#pragma unroll
    for (unsigned j = 0; j < K; ++j) {
      if (i0 + j < numel) exponents[i0 + j] = static_cast<uint8_t>(roundedExponent(x[i0 + j], sdk::drawAt<B>(r.v, j)));
    }
  }
}

__global__ void validateKernel(const std::byte* __restrict__ payload, device::Prefix expected, Shape s,
                               uint32_t* status) {
  const auto* exponents = reinterpret_cast<const uint8_t*>(payload + s.exponents_offset);
  const auto* signs = reinterpret_cast<const uint64_t*>(payload + s.signs_offset);
  const uint64_t padded = s.signs_offset - s.exponents_offset;  // exponent bytes and their padding
  const uint64_t items = padded > s.exponents_offset ? padded : s.exponents_offset;
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < items; t += uint64_t{gridDim.x} * blockDim.x) {
    device::checkPrefix(payload, expected, t, status);
    if (t < s.numel && exponents[t] == kBadExponent) device::raiseStatus(status);
    if (t >= s.numel && t < padded && exponents[t] != 0) device::raiseStatus(status);
    if (t == 0 && s.numel % kGroup != 0 && (signs[s.numel / kGroup] >> (s.numel % kGroup)) != 0) {
      device::raiseStatus(status);
    }
  }
}

__global__ void decodeKernel(const uint8_t* __restrict__ exponents, const uint64_t* __restrict__ signs, uint64_t numel,
                             float* __restrict__ out, bool accumulate, const uint32_t* gate) {
  if (device::gateRaised(gate)) return;  // a deferred verdict refused the payload (device.hpp, checkedDecompress)
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += uint64_t{gridDim.x} * blockDim.x) {
    const float v = decodeValue(exponents[i], static_cast<uint32_t>(signs[i / kGroup] >> (i % kGroup)) & 1u);
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace

void compress(const Shape& shape, const device::Prefix& prefix, const float* x, const sdk::PhiloxStream& rng,
              unsigned rounding_bits, std::byte* payload, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, payload, stream);
  const uint64_t padded = shape.signs_offset - shape.exponents_offset;
  if (padded > shape.numel) {
    TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(payload + shape.exponents_offset + shape.numel, 0, padded - shape.numel, st));
  }
  if (shape.numel == 0) return;
  auto* exponents = reinterpret_cast<uint8_t*>(payload + shape.exponents_offset);
  // One thread per Philox block: 4, 8 or 16 elements.
  auto grid = [&](uint64_t per_block) {
    return device::gridFor((shape.numel + per_block - 1) / per_block, device::kThreads);
  };
  if (rounding_bits == 8) {
    exponentsKernel<8><<<grid(16), device::kThreads, 0, st>>>(x, shape.numel, rng, exponents);
  } else if (rounding_bits == 16) {
    exponentsKernel<16><<<grid(8), device::kThreads, 0, st>>>(x, shape.numel, rng, exponents);
  } else {
    exponentsKernel<24><<<grid(4), device::kThreads, 0, st>>>(x, shape.numel, rng, exponents);
  }
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  device::launchSignWords(x, shape.numel, reinterpret_cast<uint64_t*>(payload + shape.signs_offset), nullptr, 0,
                          stream);
}

void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, uint32_t* status,
              void* stream) {
  const uint64_t padded = shape.signs_offset - shape.exponents_offset;
  const uint64_t items = padded > shape.exponents_offset ? padded : shape.exponents_offset;
  validateKernel<<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      payload, expected, shape, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  if (shape.numel == 0) return;
  decodeKernel<<<device::gridFor(shape.numel, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      reinterpret_cast<const uint8_t*>(payload + shape.exponents_offset),
      reinterpret_cast<const uint64_t*>(payload + shape.signs_offset), shape.numel, out, accumulate, gate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace terse::compressors::natural::cuda
