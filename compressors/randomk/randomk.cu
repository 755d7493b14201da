// randomk's kernels: one thread per selected coordinate j, which computes its index pi(j) alone with randomk_math.h's
// selectedIndex (the Feistel permutation keyed from the host's Philox words, computed once on the host and passed by
// value), so the device picks the host's coordinates and the payload is the host's byte for byte:
//   compress   values[j] = scale * x[pi(j)] (one f32 multiply, as on the host), after the header.
//   validate   the header bytes (the host checks the header and the size, and the size is checked before this runs).
//   decode     out is zeroed unless accumulating, then out[pi(j)] += values[j], as the host does (also when writing:
//              0 + v, which turns a -0 into +0 on both paths). pi is a bijection, so no two threads share an element.
#include <cstddef>
#include <cstdint>

#include "randomk_cuda.h"
#include "randomk_math.h"
#include "terse/kit/device.cuh"
#include "terse/sdk/bytes.hpp"
#include "terse/sdk/cuda.hpp"

namespace terse::compressors::randomk::cuda {
namespace {

constexpr uint64_t kValuesOffset = sdk::kPayloadHeaderBytes;

__global__ void gatherKernel(const float* __restrict__ x, Permutation pi, uint64_t k, float scale,
                             float* __restrict__ values) {
  for (uint64_t j = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < k; j += uint64_t{gridDim.x} * blockDim.x) {
    values[j] = scale * x[selectedIndex(pi, j)];
  }
}

__global__ void validateKernel(const std::byte* __restrict__ payload, device::Prefix expected, uint32_t* status) {
  for (unsigned t = threadIdx.x; t < expected.size; t += blockDim.x) device::checkPrefix(payload, expected, t, status);
}

__global__ void scatterAddKernel(const float* __restrict__ values, Permutation pi, uint64_t k, float* __restrict__ out,
                                 const uint32_t* gate) {
  if (device::gateRaised(gate)) return;  // a deferred verdict refused the payload (terse/kit/device.hpp)
  for (uint64_t j = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < k; j += uint64_t{gridDim.x} * blockDim.x) {
    out[selectedIndex(pi, j)] += values[j];
  }
}

}  // namespace

void compress(const device::Prefix& prefix, const float* x, const Permutation& pi, uint64_t k, float scale,
              std::byte* payload, void* stream) {
  device::writePrefix(prefix, payload, stream);
  if (k == 0) return;
  gatherKernel<<<device::gridFor(k, device::kThreads), device::kThreads, 0, device::streamOf(stream)>>>(
      x, pi, k, scale, reinterpret_cast<float*>(payload + kValuesOffset));
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void validate(const device::Prefix& expected, const std::byte* payload, uint32_t* status, void* stream) {
  validateKernel<<<1, 64, 0, device::streamOf(stream)>>>(payload, expected, status);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

void decode(const std::byte* payload, const Permutation& pi, uint64_t k, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  const cudaStream_t st = device::streamOf(stream);
  if (!accumulate) device::clearOutput(out, pi.n, gate, stream);
  if (k == 0) return;
  scatterAddKernel<<<device::gridFor(k, device::kThreads), device::kThreads, 0, st>>>(
      reinterpret_cast<const float*>(payload + kValuesOffset), pi, k, out, gate);
  TERSE_COMPRESSOR_CHECK_LAUNCH();
}

}  // namespace terse::compressors::randomk::cuda
