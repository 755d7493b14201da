// Kernels of the compressors that turn each element into a W-bit code with its own random draw and pack the codes with
// sdk/bitpack.hpp (qsgd, terngrad), and the matching decode. The compressor supplies the per-element math as a small
// functor over its TERSE_HD functions; the work split, the Philox counters and the packing are the same for all:
//
//   struct Coder {    // quantize: element i, its value, its 32 random bits -> its code
//     __device__ uint32_t operator()(uint64_t i, float v, uint32_t random_bits) const;
//   };
//   struct Decoder {  // decode: element i, its code -> its value
//     __device__ float operator()(uint64_t i, uint32_t code) const;
//   };
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "terse/kit/cast_kernels.cuh"
#include "terse/kit/device.cuh"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::kit::device {
inline namespace TERSE_KIT_KERNEL_NS {  // unique per plugin: device.cuh

inline constexpr unsigned kCodeTile = 4 * kThreads;  // elements per block iteration of quantizeKernel
inline constexpr unsigned kGroupsPerTile = kCodeTile / sdk::bitpack::kGroup;
static_assert(kCodeTile % sdk::bitpack::kGroup == 0 && kGroupsPerTile <= kThreads);

// One thread per 4 elements: one 16-byte load, one Philox block (counter i / 4: elements 4k .. 4k+3 draw words 0..3 of
// block k, the layout of the host's groupRandomBits), four codes. The codes meet in shared memory, where one thread per
// 64-element group packs them with the host's bitpack::packGroup<W> (a short last group with packTail<W>, which zeroes
// the padding bits), so every payload word is written and each exactly once.
template <unsigned W, class Coder>
__global__ void quantizeKernel(const float* __restrict__ x, uint64_t numel, sdk::PhiloxStream rng, Coder coder,
                               uint64_t* __restrict__ words) {
  constexpr unsigned kGroup = sdk::bitpack::kGroup;
  __shared__ uint32_t codes[kCodeTile];
  const uint64_t tiles = (numel + kCodeTile - 1) / kCodeTile;
  for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // block-uniform: __syncthreads below is safe
    const uint64_t i0 = tile * kCodeTile + 4 * threadIdx.x;
    if (i0 < numel) {
      float v[4];
      loadQuad(x, i0, numel, v);
      const auto r = rng.block(i0 / 4);
      for (unsigned j = 0; j < 4 && i0 + j < numel; ++j) codes[4 * threadIdx.x + j] = coder(i0 + j, v[j], r.v[j]);
    }
    __syncthreads();
    if (threadIdx.x < kGroupsPerTile) {
      const uint64_t g = tile * kGroupsPerTile + threadIdx.x;
      const uint64_t first = g * kGroup;
      if (first < numel) {
        const uint32_t* c = codes + kGroup * threadIdx.x;
        if (numel - first >= kGroup) {
          sdk::bitpack::packGroup<W>(c, words + g * W);
        } else {
          sdk::bitpack::packTail<W>(c, static_cast<unsigned>(numel - first), words + g * W);
        }
      }
    }
    __syncthreads();  // the next tile rewrites the codes
  }
}

// One thread per 4 elements: each code read with bitpack::get (neighbouring threads share words, which the L1 cache
// serves), decoded, and written (or added) with one 16-byte store.
template <class Decoder>
__global__ void decodeCodesKernel(const uint64_t* __restrict__ words, uint64_t numel, unsigned width, Decoder decoder,
                                  float* __restrict__ out, bool accumulate) {
  const uint64_t quads = (numel + 3) / 4;
  for (uint64_t q = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; q < quads; q += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t i0 = 4 * q;
    float o[4];
    if (accumulate) loadQuad(out, i0, numel, o);
    for (unsigned j = 0; j < 4 && i0 + j < numel; ++j) {
      const float v = decoder(i0 + j, sdk::bitpack::get(words, i0 + j, width));
      o[j] = accumulate ? o[j] + v : v;
    }
    storeQuad(out, i0, numel, o);
  }
}

template <class Coder>
void launchQuantize(unsigned width, const float* x, uint64_t numel, const sdk::PhiloxStream& rng, const Coder& coder,
                    uint64_t* words, void* stream) {
  if (numel == 0) return;
  const unsigned grid = gridFor(numel, kCodeTile);
  const cudaStream_t st = streamOf(stream);
  bool launched = false;
  TERSE_BITPACK_DISPATCH(width, quantizeKernel<kW, Coder><<<grid, kThreads, 0, st>>>(x, numel, rng, coder, words);
                         launched = true);
  if (!launched) throw sdk::Error(TERSE_ERR_INTERNAL, "code width " + std::to_string(width) + " is not in 1..32");
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

template <class Decoder>
void launchDecodeCodes(const uint64_t* words, uint64_t numel, unsigned width, const Decoder& decoder, float* out,
                       bool accumulate, void* stream) {
  if (numel == 0) return;
  decodeCodesKernel<Decoder><<<gridFor((numel + 3) / 4, kThreads), kThreads, 0, streamOf(stream)>>>(
      words, numel, width, decoder, out, accumulate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace TERSE_KIT_KERNEL_NS
}  // namespace terse::kit::device
