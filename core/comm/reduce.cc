#include "core/comm/reduce.h"

#include <cstdint>

#include "core/common/error.h"
#include "core/common/runtime.h"
#include "terse/sdk/cpu.hpp"
#include "terse/sdk/half.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TERSE_COMM_X86 1
#else
#define TERSE_COMM_X86 0
#endif

namespace terse::comm {
namespace {

// Plain loops over __restrict pointers: the compiler vectorizes them (this file is built with the dynamic vectorizer
// cost model, see CMakeLists.txt), so the ring allreduce's reduction runs at memory speed.
void sumF32(float* __restrict dst, const float* __restrict src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
}

// bf16: sdk::floatToBf16 written without its early return, so the loop vectorizes (the NaN case becomes a mask).
// Bit-identical to the SDK's conversion for every input (tests/comm checks it). Called through sdk::cpu::clones (one
// build per x86-64 level, picked under TERSE_CPU_ISA): with SSE2 alone (x86-64's baseline) the 16 <-> 32-bit widening
// and narrowing cost more than the memory traffic.
void sumBf16(uint16_t* __restrict dst, const uint16_t* __restrict src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t u = sdk::floatBits(sdk::bf16ToFloat(dst[i]) + sdk::bf16ToFloat(src[i]));
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    const uint32_t nan_mask = 0u - static_cast<uint32_t>((u & 0x7FFFFFFFu) > 0x7F800000u);  // all ones for a NaN
    dst[i] = static_cast<uint16_t>((rounded & ~nan_mask) | (quiet_nan & nan_mask));
  }
}

void sumF16Portable(uint16_t* __restrict dst, const uint16_t* __restrict src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = sdk::floatToHalf(sdk::halfToFloat(dst[i]) + sdk::halfToFloat(src[i]));
}

#if TERSE_COMM_X86
// F16C converts 8 halves at a time with IEEE round-to-nearest-even, handling subnormals, infinities and NaNs exactly
// as the SDK's integer conversions do, at a fraction of their cost (their branches defeat vectorization).
__attribute__((target("avx,f16c"))) void sumF16F16c(uint16_t* __restrict dst, const uint16_t* __restrict src,
                                                    std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dst + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
  }
  sumF16Portable(dst + i, src + i, n - i);
}

// F16C with AVX's registers, as the plugins see it: sdk::cpu, under the same TERSE_CPU_ISA cap.
bool hasF16c() {
  return sdk::cpu::has(sdk::cpu::Feature::kF16c);
}
#endif

void sumF16(uint16_t* __restrict dst, const uint16_t* __restrict src, std::size_t n) {
#if TERSE_COMM_X86
  if (hasF16c()) {
    sumF16F16c(dst, src, n);
    return;
  }
#endif
  sumF16Portable(dst, src, n);
}

}  // namespace

bool isSummable(DType dtype) noexcept {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

void sumInto(void* dst, const void* src, std::size_t count, DType dtype) {
  if (count == 0) return;
  // The FLOP model: one add per element; calibrated: the sum curve of the dtype at this count.
  const rt::Kernel kernel({.kind = rt::CostKind::kSum,
                           .size = static_cast<double>(count),
                           .flops = static_cast<double>(count),
                           .dtype = static_cast<int>(dtype)});
  switch (dtype) {
    case DType::kF32:
      sumF32(static_cast<float*>(dst), static_cast<const float*>(src), count);
      return;
    case DType::kF16:
      sumF16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count);
      return;
    case DType::kBF16:
      sdk::cpu::clones<sumBf16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count);
      return;
    default:
      break;
  }
  TERSE_THROW(Unsupported, "sum of " << dtypeName(dtype) << " is not supported (f32, f16, bf16)");
}

}  // namespace terse::comm
