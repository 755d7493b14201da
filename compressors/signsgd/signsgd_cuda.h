// signsgd's CUDA launchers (signsgd.cu), called by signsgd.cc for device tensors. Each queues work on `stream` (a
// cudaStream_t) and returns without waiting for it. Payload offsets are signsgd.cc's: a 32-byte prefix, then sign bits
// (raw) or vote counts of `count_bytes` bytes each (reduced).
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs signsgd (default scale 1,
// world_size 1, so decompress decodes one raw payload and accumulates onto the output). DRAM traffic sets a floor under
// each call's time, so its bound, 8 B (a device copy's 4 read + 4 written) over the call's bytes, is the fastest it can
// run as a fraction of a device copy:
//   compress     signWordsKernel (terse/kit/pack_kernels.cuh): 4 read + 1/8 written (one sign bit) = 4.125 B; bound
//                1.94x. The NaN check is in the same pass (a NaN only rewrites the one 4-byte kind word); the 32-byte
//                prefix comes first from a one-block kernel, a fixed cost that does not grow with N.
//   decompress   validateKernel on a raw payload reads only the 32-byte prefix and the last sign word (a fixed cost),
//                then decodeCodesKernel: 1/8 payload read + 4 output read + 4 output written = 8.125 B; bound 0.98x.
//                Accumulating reads the output too, so decompress cannot quite reach a copy. Plus one stream
//                synchronization for the verdict (none when the core defers it): time, not traffic.
//   A reduced aggregate of b-byte counts (several ranks, not in the benchmark) costs validateKernel's b read, then
//   decodeCountsKernel's b + 4 + 4: 8 + 2b B, bound 0.80x at b = 1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"

namespace terse::compressors::signsgd::cuda {

namespace device = kit::device;

// The offset of the kind field in the prefix, and the kind a device compress writes there when the gradient holds a
// NaN: it cannot refuse the input without waiting for the device, so it poisons the payload instead, and every
// decompress or reduce of it refuses it.
inline constexpr uint64_t kKindOffset = 16;
inline constexpr uint32_t kPoisonedKind = 0;
// The kinds (signsgd.cc's kRaw, kReduced) and the offset of the voters field.
inline constexpr uint32_t kRawKind = 1;
inline constexpr uint32_t kReducedKind = 2;
inline constexpr uint64_t kVotersOffset = 20;

// What a reduce's inputs are checked against on the device (validatePair), where their prefixes are read: the payload
// header every input starts with (16 bytes), the scale's bits, world_size, the aggregate's count width
// (countBytes(world_size)), numel, and the sizes of a raw and of a reduced payload of it.
struct ReduceCheck {
  device::Prefix header;
  uint32_t scale_bits;
  int32_t world;
  uint32_t width;
  uint64_t numel;
  uint64_t raw_bytes;
  uint64_t reduced_bytes;
};

// A raw payload: `prefix`, then the sign bits of x (1 bit per element, bitpack layout); the kind becomes
// kPoisonedKind if any x_i is NaN.
void compress(const device::Prefix& prefix, const float* x, uint64_t numel, std::byte* payload, void* stream);

// Raises `status` unless the payload starts with `expected` (its 32-byte prefix) and the section after it is what
// signsgd.cc's host parser accepts of that kind: raw (count_bytes 0), padding bits zero; reduced, every count possible
// for `voters` and zero padding bytes. The payload must hold as many bytes as that kind has for numel.
void validate(const device::Prefix& expected, const std::byte* payload, uint64_t numel, uint32_t count_bytes,
              int32_t voters, uint32_t* status, void* stream);

// The decodes write nothing when `gate` is non-null and raised (a deferred verdict, terse/kit/device.hpp).
// out = (or +=) scale * sign of each raw bit.
void decodeRaw(const std::byte* payload, uint64_t numel, float scale, float* out, bool accumulate, void* stream,
               const uint32_t* gate);
// out = (or +=) magnitude * sign(count) for each reduced count.
void decodeCounts(const std::byte* payload, uint64_t numel, uint32_t count_bytes, float magnitude, float* out,
                  bool accumulate, void* stream, const uint32_t* gate);

// Raises `status` unless both reduce inputs are what signsgd.cc's host reduce accepts: each prefix (raw or reduced,
// read on the device) and section as `check` holds them to, and their voters adding up to at most world_size.
void validatePair(const ReduceCheck& check, const std::byte* a, uint64_t a_bytes, const std::byte* b, uint64_t b_bytes,
                  uint32_t* status, void* stream);

// output = `prefix` with its voters field the inputs' voters added, then count_i(a) + count_i(b) in check.width-byte
// integers, then zero padding to `total` bytes; a raw input counts its bit as a vote of +1 or -1, each input's kind
// read from its prefix. Inputs validated by validatePair().
void fold(const device::Prefix& prefix, const ReduceCheck& check, const std::byte* a, const std::byte* b,
          std::byte* output, uint64_t total, void* stream);

}  // namespace terse::compressors::signsgd::cuda
