// qsgd's CUDA launchers (qsgd.cu), called by qsgd.cc for device tensors. Each queues work on `stream` (a cudaStream_t)
// and returns without waiting for it.
//
// Memory traffic per f32 element (device), as tests/bench/compressors_device_bench.cc runs qsgd (default levels 127,
// so 8-bit codes, and bucket_size 512, whose 4-byte norm is 0.008 B an element; decompress accumulates onto the
// output). DRAM traffic sets a floor under each call's time, so its bound, 8 B (a device copy's 4 read + 4 written)
// over the call's bytes, is the fastest it can run as a fraction of a device copy:
//   compress     normsKernel: 4 read + 0.008 norm written; then quantizeKernel (terse/kit/pack_kernels.cuh): 4 read
//                again (the codes need the finished norm, and a 256 MiB input does not stay in L2 between the passes)
//                + 0.008 norm read + 1 code written. 9.016 B; bound 0.89x. The second read of the input is what keeps
//                compress below a copy. Philox draws are arithmetic, not traffic, so the rounding_bits 16 and 8
//                variants move the same bytes. The 32-byte prefix comes first from a one-block kernel, a fixed cost.
//   decompress   validateKernel reads the norms (0.008; at levels 127 every 8-bit code is valid, so the codes are not
//                scanned), then decodeCodesKernel: 1 code + 0.008 norm + 4 output read + 4 output written = 9.008 B.
//                9.016 B in all; bound 0.89x. Accumulating reads the output too, so decompress cannot reach a copy.
//                Plus one stream synchronization for the verdict: time, not traffic.
//   Levels below 2^(W-1) - 1 for W = code_bits (not the benchmark's) leave invalid codes possible, and validation
//   then reads the codes as well: W/8 B more.
#pragma once

#include <cstddef>
#include <cstdint>

#include "terse/kit/device.hpp"
#include "terse/sdk/philox.hpp"

namespace terse::compressors::qsgd::cuda {

namespace device = kit::device;

// The code widths qsgd can produce: sign + bitsFor(levels) bits, levels in [1, 2^24 - 1] (qsgd.cc checks that its
// own kMaxLevels fits). The device kernels are built for these widths only.
inline constexpr unsigned kMinCodeBits = 2;
inline constexpr unsigned kMaxCodeBits = 25;

// Where things are in a payload and how it was made (qsgd.cc's layout).
struct Shape {
  uint64_t numel;
  uint64_t bucket;   // effective bucket size, in [1, numel] (1 for an empty tensor)
  uint64_t buckets;  // ceil(numel / bucket)
  int32_t levels;    // s
  uint32_t mag_bits;
  uint32_t code_bits;  // mag_bits + 1
  uint64_t norms_offset;
  uint64_t words_offset;
};

// Writes the whole payload: `prefix`, the bucket norms, the zero padding after them and the packed codes, rounding
// with draws of `rounding_bits` bits (8, 16 or 24: sdk/philox.hpp's drawAt).
void compress(const Shape& shape, const device::Prefix& prefix, const float* x, const sdk::PhiloxStream& rng,
              unsigned rounding_bits, std::byte* payload, void* stream);

// Raises `status` unless the payload holds `expected`, finite norms >= 0, zero padding bytes and bits, and (when
// check_codes) only codes with a magnitude <= levels: everything qsgd.cc's host decoder checks.
void validate(const Shape& shape, const device::Prefix& expected, const std::byte* payload, bool check_codes,
              uint32_t* status, void* stream);

// out[i] = (or +=) the value of code i, for a payload validate accepted; with a `gate` (a deferred verdict,
// terse/kit/device.hpp) queued right behind validate, nothing is written when validate raised it.
void decode(const Shape& shape, const std::byte* payload, float* out, bool accumulate, void* stream,
            const uint32_t* gate = nullptr);

}  // namespace terse::compressors::qsgd::cuda
