// bf16: cast the gradient to bfloat16 (the upper half of an f32) and let the core sum across ranks in bf16. Same
// exponent range as f32, so no overflow or underflow that f32 would not have, at 8 bits of precision (Kalamkar et
// al., "A Study of BFLOAT16 for Deep Learning Training", 2019; PyTorch DDP's bf16 compression hook).
//
// Equation: C(g)_i = bf16(g_i), rounded to nearest even: |bf16(g) - g| <= 2^-8 |g| for normal values; values above
// the largest bf16 (about 3.39e38) round to infinity; infinities and NaN are kept. The aggregate is sum_r C(g_r) in
// the wire dtype (the core adds 16-bit payloads in f32 per pair and rounds back).
//
// Payload and plugin: terse/kit/cast16.hpp.

#include <cstddef>
#include <cstdint>

#include "bf16_avx2.h"
#include "bf16_cuda.h"
#include "bf16_math.h"
#include "terse/kit/cast16.hpp"
#include "terse/kit/device.hpp"
#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;
namespace math = terse::compressors::bf16;

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

#if TERSE_BF16_AVX2
constexpr uint64_t kAvx2MinFloats = uint64_t{4} << 20;
#endif

struct Traits {
  static constexpr sdk::PayloadFormat kFormat{"bf16", sdk::fourcc("BF16"), 1};
  static constexpr terse_dtype_v1 kWireDtype = TERSE_DTYPE_BF16;
  static void encodeAll(const float* in, uint16_t* out, uint64_t n) {
#if TERSE_BF16_AVX2
    // Only for tensors beyond the caches: in cache, GCC's own loop of the select form (AVX-512 where the host has it)
    // was the faster one (4 MiB: 0.89x memcpy against the AVX2 loop's 0.81x; the quickstart MLP's step 0.087 against
    // 0.099 ms), at 64 MiB the AVX2 loop (1.18x against 0.76x). The crossover between 4 and 64 MiB was not measured:
    // kAvx2MinFloats (16 MiB) is placed above the size known to lose.
    if (n >= kAvx2MinFloats && math::hasAvx2()) return math::encodeAvx2(in, out, n);
#endif
    sdk::cpu::clones<::encodeAll>(in, out, n);
  }
  static void decodeAll(const uint16_t* in, float* out, uint64_t n, bool accumulate) {
#if TERSE_BF16_AVX2
    // Beyond the caches, streaming stores (decodeStreamAvx2); accumulating reads the output anyway.
    if (!accumulate && n >= kAvx2MinFloats && math::hasAvx2()) return math::decodeStreamAvx2(in, out, n);
#endif
    sdk::cpu::clones<::decodeAll>(in, out, n, accumulate);
  }
#if TERSE_COMPRESSOR_CUDA
  static void encodeDevice(const float* in, uint16_t* out, uint64_t n, void* stream) {
    terse::compressors::bf16::cuda::encode(in, out, n, stream);
  }
  static void decodeDevice(const std::byte* payload, const terse::kit::device::Prefix& expected, float* out, uint64_t n,
                           bool accumulate, uint32_t* status, void* stream) {
    terse::compressors::bf16::cuda::decode(payload, expected, out, n, accumulate, status, stream);
  }
#endif
};

using Bf16 = terse::kit::Cast16<Traits>;

}  // namespace

TERSE_EXPORT_COMPRESSOR(Bf16, "bf16", "f32 cast to bfloat16 (RNE), summed across ranks in bf16", "1.0.0");
