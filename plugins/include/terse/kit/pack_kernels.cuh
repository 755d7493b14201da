// Kernels of the compressors that turn each element into a W-bit code and pack the codes with sdk/bitpack.hpp: with
// its own random draw (qsgd, terngrad), or its sign bit (onebit, signsgd); and the matching decode. The compressor
// supplies the per-element math as a small functor over its TERSE_HD functions; the work split, the Philox counters
// and the packing are the same for all:
//
//   struct Coder {    // quantize: the run of elements that share i's constants (its bucket's scale), then each
//     struct Run { uint64_t end; ... };         // element's value and draw (sdk::drawAt's 32-bit word) -> its code;
//     __device__ Run run(uint64_t i) const;     // the run holds for elements up to end (exclusive)
//     __device__ uint32_t operator()(const Run& run, float v, uint32_t random_bits) const;
//   };
//   struct Decoder {  // decode: the same runs, then each code -> its value
//     struct Run { uint64_t end; ... };
//     __device__ Run run(uint64_t i) const;
//     __device__ float operator()(const Run& run, uint32_t code) const;
//   };
//
// Coders and decoders look their constants up once per run of a thread's elements instead of once per element: that
// lookup is a 64-bit division (i / bucket) and, for qsgd, an IEEE float division, which per element kept the decode
// kernels compute-bound at under two thirds of a device copy on an H100.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "terse/kit/cast_kernels.cuh"
#include "terse/kit/device.cuh"
#include "terse/sdk/bitpack.hpp"
#include "terse/sdk/half.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::kit::device {
inline namespace TERSE_KIT_KERNEL_NS {  // unique per plugin: device.cuh

// Elements per thread of quantizeKernel at draw width B: the draws of one Philox block (4 words of 1, 2 or 4 draws).
template <unsigned B>
inline constexpr unsigned kCodesPerThread = 4 * sdk::drawsPerWord(B);
// Elements per block iteration of quantizeKernel.
template <unsigned B>
inline constexpr unsigned kCodeTile = kCodesPerThread<B>* kThreads;
static_assert(kCodeTile<24> % sdk::bitpack::kGroup == 0, "a tile is whole groups, so its words start on a word");

// Bits [32 m, 32 m + 32) of the little-endian stream of the W-bit codes in `codes` (bitpack.hpp's layout: code j at
// bits [j W, j W + W)). On a little-endian machine that is 32-bit word m of the packed stream, the low or high half of
// 64-bit word m / 2, so words assembled this way are bitpack::packGroup's words, byte for byte.
template <unsigned W>
__device__ __forceinline__ uint32_t streamWord(const uint32_t* codes, unsigned m) {
  constexpr uint32_t kMask = sdk::bitpack::lowMask(W);
  const unsigned first_bit = 32 * m;
  uint32_t word = 0;
  for (unsigned j = first_bit / W; j * W < first_bit + 32; ++j) {
    const uint64_t code = codes[j] & kMask;
    const unsigned at = j * W;  // may start below the word: its low bits belong to word m - 1
    word |= static_cast<uint32_t>(at >= first_bit ? code << (at - first_bit) : code >> (first_bit - at));
  }
  return word;
}

// One thread per K = kCodesPerThread<B> elements, the draws of one Philox block at draw width B (sdk/philox.hpp's
// drawAt: at B = 24 elements 4k .. 4k+3 draw words 0..3 of block k; at B = 16 elements 8k .. 8k+7 their halves, at
// B = 8 elements 16k .. 16k+15 their bytes, the host's layout), so each block is computed once: K / 4 16-byte loads,
// K codes into shared memory (zero past numel, the padding bits bitpack::packTail leaves zero). Then every thread
// assembles whole 32-bit words of the tile's stream, K W kThreads / 32 of them per tile, and stores each once. A tile
// of kCodeTile<B> codes starts on a 64-bit word (a multiple of 64 codes), and the store stops at
// bitpack::wordCount(numel, W) words, so the payload is the host's, word for word. Shared memory: 4 K kThreads bytes,
// 16 KiB at B = 8.
// (Packing one 64-code group per thread, as the host does, left 240 of 256 threads idle and put W words per thread in
// local memory: compress ran at a third of a device copy on an H100.)
//
// Rng is the plugins' sdk::PhiloxStream; anything whose block(b) returns four 32-bit words in .v may stand in for it
// (terse-bench-quantize-cuda measures what the Philox rounds cost by swapping in a cheaper hash).
template <unsigned W, unsigned B, class Coder, class Rng>
__global__ void quantizeKernel(const float* __restrict__ x, uint64_t numel, Rng rng, Coder coder,
                               uint64_t* __restrict__ words) {
  constexpr unsigned K = kCodesPerThread<B>;
  constexpr unsigned kTile = kCodeTile<B>;
  constexpr unsigned kTileWords32 = kTile * W / 32;
  // streamWord reads codes up to index (32 m + 31) / W, which for the tile's last word is kTile - 1.
  __shared__ __align__(16) uint32_t codes[kTile];
  uint32_t* out32 = reinterpret_cast<uint32_t*>(words);
  const uint64_t total32 = 2 * sdk::bitpack::wordCount(numel, W);
  const uint64_t tiles = (numel + kTile - 1) / kTile;
  for (uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {  // block-uniform: __syncthreads below is safe
    const uint64_t i0 = tile * kTile + K * threadIdx.x;
    uint32_t c[K];
#pragma unroll
    for (unsigned j = 0; j < K; ++j) c[j] = 0;
    if (i0 < numel) {
      const auto r = rng.block(i0 / K);  // stream words i0 / (K / 4) .. + 3: this block's words 0..3
      auto run = coder.run(i0);
      // Fully unrolled with the bounds checks inside, so that r.v and c are indexed by constants (registers).
#pragma unroll
      for (unsigned q = 0; q < K / 4; ++q) {
        if (i0 + 4 * q < numel) {
          float v[4];
          loadQuad(x, i0 + 4 * q, numel, v);
#pragma unroll
          for (unsigned j = 0; j < 4; ++j) {
            const uint64_t i = i0 + 4 * q + j;
            if (i < numel) {
              if (i >= run.end) run = coder.run(i);
              c[4 * q + j] = coder(run, v[j], sdk::drawAt<B>(r.v, 4 * q + j));
            }
          }
        }
      }
    }
    // 16-byte stores: K / 4 per thread.
#pragma unroll
    for (unsigned q = 0; q < K / 4; ++q) {
      reinterpret_cast<uint4*>(codes)[K / 4 * threadIdx.x + q] =
          make_uint4(c[4 * q], c[4 * q + 1], c[4 * q + 2], c[4 * q + 3]);
    }
    __syncthreads();
    const uint64_t base32 = tile * kTileWords32;
    for (unsigned m = threadIdx.x; m < kTileWords32 && base32 + m < total32; m += blockDim.x) {
      out32[base32 + m] = streamWord<W>(codes, m);
    }
    __syncthreads();  // the next tile rewrites the codes
  }
}

// Codes i0 .. i0+3 (zero past the stream's end, which the padding makes them anyway). Where 4 W divides 64 (W = 1, 2,
// 4, 8, 16) the four lie in one 64-bit word at a constant offset pattern: one load and constant shifts. Other widths
// read each code with bitpack::get (it may straddle two words).
template <unsigned W>
__device__ __forceinline__ void loadCodeQuad(const uint64_t* __restrict__ words, uint64_t i0, uint64_t numel,
                                             uint32_t (&c)[4]) {
  constexpr uint32_t kMask = sdk::bitpack::lowMask(W);
  if constexpr (64 % (4 * W) == 0) {
    const uint64_t bit = i0 * W;
    const uint64_t w = words[bit / 64] >> (bit % 64);  // i0 < numel, so word bit / 64 is in the stream
    for (unsigned j = 0; j < 4; ++j) c[j] = static_cast<uint32_t>(w >> (j * W)) & kMask;
  } else {
    for (unsigned j = 0; j < 4; ++j) c[j] = i0 + j < numel ? sdk::bitpack::get(words, i0 + j, W) : 0u;
  }
}

// One thread per 4 elements: the four codes (loadCodeQuad), the decoder's run looked up once (again only where a run
// ends inside the quad), each code decoded and written (or added) with one 16-byte store.
template <unsigned W, class Decoder>
__global__ void decodeCodesKernel(const uint64_t* __restrict__ words, uint64_t numel, Decoder decoder,
                                  float* __restrict__ out, bool accumulate, const uint32_t* gate) {
  if (gateRaised(gate)) return;  // a deferred verdict refused the payload (device.hpp, checkedDecompress)
  const uint64_t quads = (numel + 3) / 4;
  for (uint64_t q = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; q < quads; q += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t i0 = 4 * q;
    uint32_t c[4];
    loadCodeQuad<W>(words, i0, numel, c);
    float o[4];
    if (accumulate) loadQuad(out, i0, numel, o);
    auto run = decoder.run(i0);
    for (unsigned j = 0; j < 4 && i0 + j < numel; ++j) {
      if (i0 + j >= run.end) run = decoder.run(i0 + j);
      const float v = decoder(run, c[j]);
      o[j] = accumulate ? o[j] + v : v;
    }
    storeQuad(out, i0, numel, o);
  }
}

inline constexpr unsigned kSignGroups = 4;  // 64-element groups one warp turns into sign words per iteration

// The sign bits of x as width-1 codes (bit i % 64 of word i / 64, padding bits zero) and, when nan_flag is not null,
// *nan_flag = nan_value if any element is a NaN. One warp per kSignGroups consecutive groups: each lane reads two
// elements of a group (coalesced 128-byte rows), two __ballot_sync give the group's word directly, elements past the
// end voting 0. Every load is issued before the first ballot: with one group per iteration the kernel reached half
// the memory bandwidth of a copy on an H100.
__global__ void signWordsKernel(const float* __restrict__ x, uint64_t numel, uint64_t* __restrict__ words,
                                uint32_t* nan_flag, uint32_t nan_value) {
  constexpr unsigned kGroup = sdk::bitpack::kGroup;
  const unsigned lane = threadIdx.x % 32;
  const uint64_t warp = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const uint64_t warps = uint64_t{gridDim.x} * blockDim.x / 32;
  const uint64_t groups = (numel + kGroup - 1) / kGroup;
  for (uint64_t g0 = warp * kSignGroups; g0 < groups; g0 += warps * kSignGroups) {  // warp-uniform: ballots below
    uint32_t lo[kSignGroups], hi[kSignGroups];
    for (unsigned u = 0; u < kSignGroups; ++u) {
      const uint64_t i = (g0 + u) * kGroup + lane;
      lo[u] = i < numel ? sdk::floatBits(x[i]) : 0u;
      hi[u] = i + 32 < numel ? sdk::floatBits(x[i + 32]) : 0u;
    }
    bool nan = false;
    for (unsigned u = 0; u < kSignGroups; ++u) {
      const uint32_t lo_bits = __ballot_sync(0xFFFFFFFFu, (lo[u] >> 31) != 0);
      const uint32_t hi_bits = __ballot_sync(0xFFFFFFFFu, (hi[u] >> 31) != 0);
      if (lane == 0 && g0 + u < groups) words[g0 + u] = uint64_t{lo_bits} | uint64_t{hi_bits} << 32;
      nan = nan || (lo[u] & 0x7FFFFFFFu) > 0x7F800000u || (hi[u] & 0x7FFFFFFFu) > 0x7F800000u;
    }
    if (nan_flag != nullptr && __any_sync(0xFFFFFFFFu, nan) && lane == 0) *nan_flag = nan_value;
  }
}

// Codes of a width W fixed at compile time (terngrad's 2 bits, the sign codecs' 1): only W's kernels are built.
// draw_bits: the rounding_bits parameter, 8, 16 or 24 (sdk/philox.hpp's drawAt), one kernel each.
template <unsigned W, class Coder, class Rng>
void launchQuantize(unsigned draw_bits, const float* x, uint64_t numel, const Rng& rng, const Coder& coder,
                    uint64_t* words, void* stream) {
  if (numel == 0) return;
  const cudaStream_t st = streamOf(stream);
  if (draw_bits == 8) {
    quantizeKernel<W, 8, Coder, Rng><<<gridFor(numel, kCodeTile<8>), kThreads, 0, st>>>(x, numel, rng, coder, words);
  } else if (draw_bits == 16) {
    quantizeKernel<W, 16, Coder, Rng><<<gridFor(numel, kCodeTile<16>), kThreads, 0, st>>>(x, numel, rng, coder, words);
  } else if (draw_bits == 24) {
    quantizeKernel<W, 24, Coder, Rng><<<gridFor(numel, kCodeTile<24>), kThreads, 0, st>>>(x, numel, rng, coder, words);
  } else {
    throw sdk::Error(TERSE_ERR_INTERNAL, "draw width " + std::to_string(draw_bits) + " is not 8, 16 or 24");
  }
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

// Calls f.template operator()<W>() for the one W in [Lo, Hi] that equals `width`; false when none does. Host code:
// the run-time dispatch of the launchers below, which builds only the kernels of the widths in the range.
template <unsigned Lo, unsigned Hi, class F>
bool dispatchWidth(unsigned width, F&& f) {
  static_assert(1 <= Lo && Lo <= Hi && Hi <= 32, "code widths are 1..32 bits");
  if (width == Lo) {
    f.template operator()<Lo>();
    return true;
  }
  if constexpr (Lo < Hi) {
    return dispatchWidth<Lo + 1, Hi>(width, std::forward<F>(f));
  } else {
    return false;
  }
}

// dispatchWidth, and an internal error naming the range for a width outside it (the plugin validated the width).
template <unsigned Lo, unsigned Hi, class F>
void launchForWidth(unsigned width, F&& f) {
  if (!dispatchWidth<Lo, Hi>(width, std::forward<F>(f))) {
    throw sdk::Error(TERSE_ERR_INTERNAL, "code width " + std::to_string(width) + " is not in " + std::to_string(Lo) +
                                             ".." + std::to_string(Hi));
  }
}

// A width known only at run time, within [Lo, Hi] (qsgd's, 2..25 from its levels): the kernels of each width in the
// range are built (three draw widths each), and only those -- a plugin that asked for all 32 widths carried a quarter
// more device code for widths it cannot produce.
template <unsigned Lo, unsigned Hi, class Coder, class Rng>
void launchQuantize(unsigned width, unsigned draw_bits, const float* x, uint64_t numel, const Rng& rng,
                    const Coder& coder, uint64_t* words, void* stream) {
  launchForWidth<Lo, Hi>(width,
                         [&]<unsigned W>() { launchQuantize<W>(draw_bits, x, numel, rng, coder, words, stream); });
}

// Decode of a width W fixed at compile time (terngrad, onebit, signsgd): one kernel.
template <unsigned W, class Decoder>
void launchDecodeCodes(const uint64_t* words, uint64_t numel, const Decoder& decoder, float* out, bool accumulate,
                       void* stream, const uint32_t* gate = nullptr) {
  if (numel == 0) return;
  decodeCodesKernel<W, Decoder><<<gridFor((numel + 3) / 4, kThreads), kThreads, 0, streamOf(stream)>>>(
      words, numel, decoder, out, accumulate, gate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

// Decode of a width known only at run time, within [Lo, Hi] (qsgd): each width's kernel in the range is built. The
// width comes from a payload that was validated against the plugin's own parameters first.
template <unsigned Lo, unsigned Hi, class Decoder>
void launchDecodeCodes(const uint64_t* words, uint64_t numel, unsigned width, const Decoder& decoder, float* out,
                       bool accumulate, void* stream, const uint32_t* gate = nullptr) {
  launchForWidth<Lo, Hi>(
      width, [&]<unsigned W>() { launchDecodeCodes<W>(words, numel, decoder, out, accumulate, stream, gate); });
}

// signWordsKernel over numel elements; nan_flag may be null (no NaN check).
inline void launchSignWords(const float* x, uint64_t numel, uint64_t* words, uint32_t* nan_flag, uint32_t nan_value,
                            void* stream) {
  if (numel == 0) return;
  const uint64_t groups = (numel + sdk::bitpack::kGroup - 1) / sdk::bitpack::kGroup;
  signWordsKernel<<<gridFor(groups, kThreads / 32 * kSignGroups), kThreads, 0, streamOf(stream)>>>(x, numel, words,
                                                                                                   nan_flag, nan_value);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace TERSE_KIT_KERNEL_NS
}  // namespace terse::kit::device
