// signsgd's kernels, calling signsgd_math.h's functions as the host loops in signsgd.cc do, so device payloads,
// reductions and decodes are the host's bit for bit (the math is sign bits, integer votes and one product per value):
//   compress   terse/kit/pack_kernels.cuh's sign words (signBit's bit, in the bitpack width-1 layout), whose NaN
//              check (isNan's test) poisons the payload.
//   validate   one thread per prefix byte (against the prefix the host expects) and per count (countIsValid) or
//              padding byte; a raw payload's section only needs its padding bits.
//   decode     one thread per 4 elements with decodeSign / decodeCount, one 16-byte store.
//   reduce     the inputs' kinds and voters read from their prefixes on the device, by one thread a block (either
//              input may be raw or reduced): validatePair checks both as decompress's validate does, then fold adds
//              one element per thread, vote() of a raw bit or the stored count, as the host's fold does, and writes
//              the output's voters.
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
constexpr unsigned kHeaderBytes = 16;  // sdk::PayloadHeader, the prefix's first part

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

// A reduce input's block as its prefix states it, and whether signsgd.cc's host parser accepts that prefix for this
// call: the header, the scale, and a raw (1 voter, no count width, the raw size) or reduced (2..world_size voters, the
// aggregate's count width and size) block. Read by one thread a block, from the input's first 32 bytes.
struct InputBlock {  // no initializers: it lives in __shared__ memory (pairBlocks)
  uint32_t voters;
  uint32_t count_bytes;
  bool ok;
};

__device__ InputBlock inputBlock(const std::byte* p, uint64_t bytes, const ReduceCheck& c) {
  InputBlock in{0, 0, false};
  // Payloads are 16-byte aligned (the ABI): the header as four words, against the expected ones at fixed offsets.
  const auto* w = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
  for (unsigned k = 0; k < kHeaderBytes / 4; ++k) {
    uint32_t want;
    memcpy(&want, c.header.bytes + 4 * k, sizeof want);
    if (w[k] != want) return in;
  }
  w += kHeaderBytes / 4;
  const uint32_t kind = w[0], scale_bits = w[3];
  in.voters = w[1];
  in.count_bytes = w[2];
  if (scale_bits != c.scale_bits) return in;
  if (kind == kRawKind) {
    in.ok = in.voters == 1 && in.count_bytes == 0 && bytes == c.raw_bytes;
  } else if (kind == kReducedKind) {
    in.ok = in.voters >= 2 && in.voters <= static_cast<uint32_t>(c.world) && in.count_bytes == c.width &&
            bytes == c.reduced_bytes;
  }
  return in;
}

// Both inputs' blocks, read by thread 0 and shared with the block (call from every thread, before any returns).
struct PairBlocks {
  InputBlock a, b;
};
__device__ PairBlocks pairBlocks(const std::byte* a, uint64_t a_bytes, const std::byte* b, uint64_t b_bytes,
                                 const ReduceCheck& c) {
  __shared__ PairBlocks shared;
  if (threadIdx.x == 0) shared = PairBlocks{inputBlock(a, a_bytes, c), inputBlock(b, b_bytes, c)};
  __syncthreads();
  return shared;
}

// Section byte t of one input whose prefix passed: a count of a reduced input (range and parity for its voters) or a
// padding byte; of a raw input, only its last word's padding bits, at t = 0. `used` and `bytes`: a reduced section's
// counts and its size with padding (the count width is the aggregate's, which the prefix check held it to).
__device__ void checkSection(const std::byte* section, const InputBlock& input, uint64_t t, uint64_t numel,
                             uint64_t used, uint64_t bytes, uint32_t* status) {
  if (input.count_bytes == 0) {
    if (t == 0 && !bitpack::paddingIsZero(reinterpret_cast<const uint64_t*>(section), numel, 1)) {
      device::raiseStatus(status);
    }
    return;
  }
  if (t < numel && !countIsValid(countOf(section, input.count_bytes, t), static_cast<int32_t>(input.voters))) {
    device::raiseStatus(status);
  }
  if (t >= used && t < bytes && section[t] != std::byte{0}) device::raiseStatus(status);
}

// Thread t checks section byte t of each input (a count's range and parity for its voters, or a padding byte; a raw
// section only its last word's padding bits, thread 0), once both prefixes pass and their voters add up to at most
// world_size.
__global__ void validatePairKernel(const std::byte* __restrict__ a, uint64_t a_bytes, const std::byte* __restrict__ b,
                                   uint64_t b_bytes, ReduceCheck c, uint32_t* status) {
  const PairBlocks in = pairBlocks(a, a_bytes, b, b_bytes, c);
  const bool ok = in.a.ok && in.b.ok && in.a.voters + in.b.voters <= static_cast<uint32_t>(c.world);
  if (!ok) {
    if (blockIdx.x == 0 && threadIdx.x == 0) device::raiseStatus(status);
    return;
  }
  const uint64_t used = c.numel * c.width, bytes = sectionBytes(c.numel, c.width);
  // Two raw inputs have only thread 0's check (their padding bits): the launch gave them one block, which must not
  // stride over a reduced section's bytes for nothing.
  const uint64_t end = in.a.count_bytes == 0 && in.b.count_bytes == 0 ? 1 : (bytes > 1 ? bytes : 1);
  for (uint64_t t = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < end; t += uint64_t{gridDim.x} * blockDim.x) {
    checkSection(a + kPrefixBytes, in.a, t, c.numel, used, bytes, status);
    checkSection(b + kPrefixBytes, in.b, t, c.numel, used, bytes, status);
  }
}

// output counts = the inputs' votes added, each input's kind read from its prefix (validatePairKernel passed them);
// the output's voters field, the one part of its prefix the host does not know, is their sum.
// The kind and voters of two inputs validatePairKernel passed, read by thread 0 and shared with the block: a raw one
// has no count width, a reduced one the aggregate's.
__device__ PairBlocks passedBlocks(const std::byte* a, const std::byte* b, const ReduceCheck& c) {
  __shared__ PairBlocks shared;
  if (threadIdx.x == 0) {
    const auto block = [&](const std::byte* p) {
      const auto* w = reinterpret_cast<const uint32_t*>(p + kKindOffset);
      return InputBlock{w[1], w[0] == kRawKind ? 0u : c.width, true};
    };
    shared = PairBlocks{block(a), block(b)};
  }
  __syncthreads();
  return shared;
}

template <class T>
__global__ void foldKernel(const std::byte* __restrict__ a, const std::byte* __restrict__ b, ReduceCheck c,
                           std::byte* __restrict__ output) {
  const PairBlocks in = passedBlocks(a, b, c);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *reinterpret_cast<uint32_t*>(output + kVotersOffset) = in.a.voters + in.b.voters;
  }
  T* out = reinterpret_cast<T*>(output + kPrefixBytes);
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < c.numel;
       i += uint64_t{gridDim.x} * blockDim.x) {
    // |sum| <= world_size fits T
    out[i] = static_cast<T>(votesOf(a, in.a.count_bytes, i) + votesOf(b, in.b.count_bytes, i));
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

void validatePair(const ReduceCheck& check, const std::byte* a, uint64_t a_bytes, const std::byte* b, uint64_t b_bytes,
                  uint32_t* status, void* stream) {
  // Two raw inputs need one thread (their padding bits): one block, unless an input has a reduced payload's size.
  const bool counts = a_bytes == check.reduced_bytes || b_bytes == check.reduced_bytes;
  const uint64_t items = counts ? sectionBytes(check.numel, check.width) : 1;
  validatePairKernel<<<device::gridFor(items, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      a, a_bytes, b, b_bytes, check, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void fold(const device::Prefix& prefix, const ReduceCheck& check, const std::byte* a, const std::byte* b,
          std::byte* output, uint64_t total, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, output, stream);
  const uint64_t used = kPrefixBytes + check.numel * check.width;
  if (total > used) TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(output + used, 0, total - used, st));
  // At least one block, also for an empty tensor: the kernel writes the output's voters.
  const unsigned grid = device::gridFor(check.numel, device::kThreads);
  if (check.width == 1) {
    foldKernel<int8_t><<<grid, device::kThreads, 0, st>>>(a, b, check, output);
  } else if (check.width == 2) {
    foldKernel<int16_t><<<grid, device::kThreads, 0, st>>>(a, b, check, output);
  } else {
    foldKernel<int32_t><<<grid, device::kThreads, 0, st>>>(a, b, check, output);
  }
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace terse::compressors::signsgd::cuda
