// qsgd's per-element functors for terse/kit/pack_kernels.cuh's quantize and decode kernels (the Coder and Decoder
// concepts there), in a header of their own so that terse-bench-quantize-cuda (tests/bench/quantize_device_bench.cu)
// times the plugin's own coder and decoder beside its variants rather than copies of them. No kernels here: the
// kernels are the kit's, instantiated in each binary's own namespace (terse/kit/device.cuh).
#pragma once

#include <cstdint>

#include "qsgd_math.h"

namespace terse::compressors::qsgd::cuda {

// quantizeValue with its bucket's divisor, as quantizeAll computes it (looked up once per run of a bucket's elements).
struct Coder {
  const float* norms;
  uint64_t bucket;
  float levels_f;
  int32_t levels;
  unsigned mag_bits;
  struct Run {
    uint64_t end;
    float divisor;
  };
  __device__ Run run(uint64_t i) const {
    const uint64_t b = i / bucket;
    return {(b + 1) * bucket, normDivisor(norms[b])};
  }
  __device__ uint32_t operator()(const Run& r, float v, uint32_t random_bits) const {
    return quantizeValue(v, r.divisor, levels_f, levels, mag_bits, random_bits);
  }
};

// decodeValue with its bucket's unit ||v|| / s, as dequantizeAll computes it (once per bucket, here once per run).
struct Decoder {
  const float* norms;
  uint64_t bucket;
  float levels_f;
  unsigned mag_bits;
  struct Run {
    uint64_t end;
    float unit;
  };
  __device__ Run run(uint64_t i) const {
    const uint64_t b = i / bucket;
    return {(b + 1) * bucket, norms[b] / levels_f};
  }
  __device__ float operator()(const Run& r, uint32_t code) const { return decodeValue(code, r.unit, mag_bits); }
};

}  // namespace terse::compressors::qsgd::cuda
