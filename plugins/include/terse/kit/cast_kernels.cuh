// Kernels of the elementwise compressors (none, fp16, bf16): every element is encoded to one wire value on its own,
// and decoded back (written or added). `Math` supplies the compressor's TERSE_HD functions, the ones its CPU loops
// call:
//
//   struct Math {
//     using Wire = uint16_t;                              // or float
//     static __host__ __device__ Wire encode(float g);
//     static __host__ __device__ float decode(Wire w);
//   };
//
// Each thread handles 4 consecutive elements: one 16-byte load of floats and one 8-byte (16-bit wires) or 16-byte (f32
// wires) access on the wire side, the widest accesses that keep every thread's elements together. A quad that is short
// (the tail) or whose pointers are not aligned for the wide access goes element by element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "terse/kit/device.cuh"

namespace terse::kit::device {
inline namespace TERSE_KIT_KERNEL_NS {  // unique per plugin: device.cuh

template <class Wire>
__device__ __forceinline__ void loadQuad(const Wire* src, uint64_t i, uint64_t n, Wire (&w)[4]) {
  const Wire* p = src + i;
  if (i + 4 <= n && aligned(p, 4 * sizeof(Wire))) {
    if constexpr (sizeof(Wire) == 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      std::memcpy(w, &v, sizeof v);
    } else {
      static_assert(sizeof(Wire) == 4, "wires are 16 or 32 bits");
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      std::memcpy(w, &v, sizeof v);
    }
  } else {
    for (unsigned j = 0; j < 4; ++j) w[j] = i + j < n ? p[j] : Wire{};
  }
}

template <class Wire>
__device__ __forceinline__ void storeQuad(Wire* dst, uint64_t i, uint64_t n, const Wire (&w)[4]) {
  Wire* p = dst + i;
  if (i + 4 <= n && aligned(p, 4 * sizeof(Wire))) {
    if constexpr (sizeof(Wire) == 2) {
      uint2 v;
      std::memcpy(&v, w, sizeof v);
      *reinterpret_cast<uint2*>(p) = v;
    } else {
      static_assert(sizeof(Wire) == 4, "wires are 16 or 32 bits");
      uint4 v;
      std::memcpy(&v, w, sizeof v);
      *reinterpret_cast<uint4*>(p) = v;
    }
  } else {
    for (unsigned j = 0; j < 4 && i + j < n; ++j) p[j] = w[j];
  }
}

template <class Math>
__global__ void encodeKernel(const float* __restrict__ in, typename Math::Wire* __restrict__ out, uint64_t n) {
  using Wire = typename Math::Wire;
  const uint64_t quads = (n + 3) / 4;
  for (uint64_t q = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; q < quads; q += uint64_t{gridDim.x} * blockDim.x) {
    float g[4];
    loadQuad(in, 4 * q, n, g);
    Wire w[4];
    for (unsigned j = 0; j < 4; ++j) w[j] = Math::encode(g[j]);
    storeQuad(out, 4 * q, n, w);
  }
}

// Decodes the wire values that follow `expected` in the payload, but only if the payload starts with exactly the
// expected prefix: every block checks it (thread i byte i, served from cache after the first block) and the grid
// either writes every element or none, so a refused payload leaves the output untouched. Block 0 raises `status`.
template <class Math>
__global__ void decodeKernel(const std::byte* __restrict__ payload, Prefix expected, float* __restrict__ out,
                             uint64_t n, bool accumulate, uint32_t* status) {
  using Wire = typename Math::Wire;
  static_assert(sizeof(Prefix::bytes) <= kThreads, "every prefix byte needs a thread of the block");
  const bool mine = threadIdx.x >= expected.size || payload[threadIdx.x] == prefixByte(expected, threadIdx.x);
  if (!__syncthreads_and(mine)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) raiseStatus(status);
    return;
  }
  const Wire* in = reinterpret_cast<const Wire*>(payload + expected.size);
  const uint64_t quads = (n + 3) / 4;
  for (uint64_t q = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; q < quads; q += uint64_t{gridDim.x} * blockDim.x) {
    Wire w[4];
    loadQuad(in, 4 * q, n, w);
    float o[4];
    if (accumulate) loadQuad(out, 4 * q, n, o);
    for (unsigned j = 0; j < 4; ++j) {
      const float v = Math::decode(w[j]);
      o[j] = accumulate ? o[j] + v : v;
    }
    storeQuad(out, 4 * q, n, o);
  }
}

template <class Math>
void launchEncode(const float* in, typename Math::Wire* out, uint64_t n, void* stream) {
  if (n == 0) return;
  encodeKernel<Math><<<gridFor((n + 3) / 4, kThreads), kThreads, 0, streamOf(stream)>>>(in, out, n);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

// Launches the checked decode; the caller synchronizes `stream` and reads `status`. Launched even for n == 0, since
// the header still has to be checked.
template <class Math>
void launchDecode(const std::byte* payload, const Prefix& expected, float* out, uint64_t n, bool accumulate,
                  uint32_t* status, void* stream) {
  decodeKernel<Math><<<gridFor((n + 3) / 4, kThreads), kThreads, 0, streamOf(stream)>>>(payload, expected, out, n,
                                                                                        accumulate, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace TERSE_KIT_KERNEL_NS
}  // namespace terse::kit::device
