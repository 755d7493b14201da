// fp16: cast the gradient to IEEE 754 binary16 and let the core sum the halves across ranks. The simplest lossy
// compressor (2x), standard in mixed-precision data-parallel training (Micikevicius et al., "Mixed Precision
// Training", ICLR 2018; Horovod's and PyTorch DDP's fp16 compression hooks).
//
// Equation: C(g)_i = fp16(g_i), rounded to nearest even; |fp16(g) - g| <= 2^-11 |g| for normal halves, up to 2^-25
// absolute in the subnormal range; |g| >= 65520 becomes infinity; infinities and NaN are kept. The aggregate is
// sum_r C(g_r) summed in the wire dtype (the core adds 16-bit payloads in f32 per pair and rounds back).
//
// Payload and plugin: terse/kit/cast16.hpp.

#include <cstddef>
#include <cstdint>

#include "fp16_cuda.h"
#include "fp16_f16c.h"
#include "fp16_math.h"
#include "terse/kit/cast16.hpp"
#include "terse/kit/device.hpp"
#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;
namespace math = terse::compressors::fp16;

constexpr uint64_t kBlock = 64;  // fixed-length inner loops: GCC -O2 vectorizes only known trip counts

void encodeAll(const float* __restrict in, uint16_t* __restrict out, uint64_t n) {
  uint64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (uint64_t j = 0; j < kBlock; ++j) out[i + j] = math::encodeValue(in[i + j]);
  }
  for (; i < n; ++i) out[i] = math::encodeValue(in[i]);
}

void decodeAll(const uint16_t* __restrict in, float* __restrict out, uint64_t n, bool accumulate) {
  uint64_t i = 0;
  if (accumulate) {
    for (; i + kBlock <= n; i += kBlock) {
      for (uint64_t j = 0; j < kBlock; ++j) out[i + j] += math::decodeValue(in[i + j]);
    }
    for (; i < n; ++i) out[i] += math::decodeValue(in[i]);
  } else {
    for (; i + kBlock <= n; i += kBlock) {
      for (uint64_t j = 0; j < kBlock; ++j) out[i + j] = math::decodeValue(in[i + j]);
    }
    for (; i < n; ++i) out[i] = math::decodeValue(in[i]);
  }
}

struct Traits {
  static constexpr sdk::PayloadFormat kFormat{"fp16", sdk::fourcc("FP16"), 1};
  static constexpr terse_dtype_v1 kWireDtype = TERSE_DTYPE_F16;
  static void encodeAll(const float* in, uint16_t* out, uint64_t n) {
#if TERSE_FP16_F16C
    if (math::hasF16c()) return math::encodeF16c(in, out, n);
#endif
    sdk::cpu::clones<::encodeAll>(in, out, n);
  }
  static void decodeAll(const uint16_t* in, float* out, uint64_t n, bool accumulate) {
#if TERSE_FP16_F16C
    if (math::hasF16c()) return math::decodeF16c(in, out, n, accumulate);
#endif
    sdk::cpu::clones<::decodeAll>(in, out, n, accumulate);
  }
#if TERSE_COMPRESSOR_CUDA
  static void encodeDevice(const float* in, uint16_t* out, uint64_t n, void* stream) {
    terse::compressors::fp16::cuda::encode(in, out, n, stream);
  }
  static void decodeDevice(const std::byte* payload, const terse::kit::device::Prefix& expected, float* out, uint64_t n,
                           bool accumulate, uint32_t* status, void* stream) {
    terse::compressors::fp16::cuda::decode(payload, expected, out, n, accumulate, status, stream);
  }
#endif
};

using Fp16 = terse::kit::Cast16<Traits>;

}  // namespace

TERSE_EXPORT_COMPRESSOR(Fp16, "fp16", "f32 cast to IEEE binary16 (RNE), summed across ranks in f16", "1.0.0");
