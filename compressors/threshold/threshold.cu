// threshold's kernels: the host's selection (threshold_math.h's keep on terse/kit/topk_math.hpp's magnitude keys,
// integer compares only) by cub::DeviceSelect::If, which keeps the input order, so values and indices come out in index
// order as the host writes them and the payload is the host's byte for byte:
//   select    one DeviceSelect::If over the indices with keep(key, min_key) (terse/kit/sparse_kernels.cuh's
//             selectEntries), each kept one written as its value into the payload's value section and, as its index, to
//             the payload buffer past n values (24 + 4 n: the output holds max_output_bytes = 24 + 8 n, so both fit
//             whatever the count); the count goes to the workspace, and a kernel bounded by that count raises the
//             status word for a non-finite sent value.
//   count     one synchronization reads the count (the ABI's rule for variable-size compressors on CUDA: output_bytes
//             must be known when compress returns) and the status.
//   indices   moved down to their final offset 24 + 4 * count, a copy of 4 count bytes, when the two ranges do not
//             overlap (count <= n / 2; at 1% of n always); otherwise a second DeviceSelect over the indices 0..n-1
//             with the same predicate (read through x) writes them there, which makes a send of more than half the
//             elements cost 8 n + 12 c bytes, against 8 n + 8 c before the parking (about 19% more at 62% sent): a
//             sparsifier that sends that much compresses less than fp16. Then the count is copied into the payload.
//             The bytes past the payload that held the indices on the way are the output's own (capacity >=
//             max_output_bytes); nothing past max_output_bytes is written.
// Decompress validates and scatters with terse/kit/sparse_kernels.cuh, with the tau check on.
#include <thrust/iterator/counting_iterator.h>

#include <cstddef>
#include <cstdint>
#include <cub/device/device_select.cuh>

#include "terse/kit/device.cuh"
#include "terse/kit/sparse_kernels.cuh"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_math.hpp"
#include "terse/sdk/cuda.hpp"
#include "threshold_cuda.h"
#include "threshold_math.h"

namespace terse::compressors::threshold::cuda {

// cub and thrust are wrapped in a namespace of this plugin's own (terse/kit/device.cuh says why).
namespace cub = CUB_NS_QUALIFIER;
namespace thrust = THRUST_NS_QUALIFIER;

namespace {

// Workspace: the u64 count at 0, cub's temporary storage from kTempOffset (cub's alignment).
constexpr uint64_t kTempOffset = 256;
// Blocks of the non-finite check: its bound (the count) is on the device, so the grid cannot be sized to it.
constexpr unsigned kCheckBlocks = 1024;

struct KeepIndex {
  const float* x;
  uint32_t min_key;
  __device__ bool operator()(uint32_t i) const { return keep(kit::topk::magnitudeKey(x[i]), min_key); }
};

__global__ void nonfiniteKernel(const float* __restrict__ values, const uint64_t* __restrict__ count,
                                uint32_t* status) {
  const uint64_t c = *count;
  for (uint64_t j = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < c; j += uint64_t{gridDim.x} * blockDim.x) {
    if (kit::topk::isNonFiniteKey(kit::topk::magnitudeKey(values[j]))) device::raiseStatus(status);
  }
}

size_t tempBytes(uint64_t numel) {
  size_t values = 0, indices = 0;
  const auto n = static_cast<int64_t>(numel);
  kit::sparse::selectEntries(nullptr, values, nullptr, numel, KeepIndex{}, nullptr, nullptr, nullptr, nullptr);
  TERSE_SDK_CUDA_CHECK(cub::DeviceSelect::If(nullptr, indices, thrust::counting_iterator<uint32_t>(0),
                                             static_cast<uint32_t*>(nullptr), static_cast<uint64_t*>(nullptr), n,
                                             KeepIndex{nullptr, 0}));
  return values > indices ? values : indices;
}

}  // namespace

uint64_t workspaceBytes(uint64_t numel) {
  if (numel == 0) return 0;
  return kTempOffset + tempBytes(numel);
}

Selection compress(const device::Prefix& header, const float* x, uint64_t numel, uint32_t min_key, std::byte* workspace,
                   std::byte* payload, const device::StatusWords::Lease& status, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(header, payload, stream);
  if (numel == 0) {
    TERSE_SDK_CUDA_CHECK(cudaMemsetAsync(payload + kit::sparse::kCountOffset, 0, sizeof(uint64_t), st));
    return {0, false};
  }
  auto* count = reinterpret_cast<uint64_t*>(workspace);
  size_t temp_bytes = tempBytes(numel);
  const auto n = static_cast<int64_t>(numel);
  auto* values = reinterpret_cast<float*>(payload + kit::sparse::kFixedBytes);
  // The indices wait where they would lie if every element were sent: past n values (see the top of this file).
  auto* parked = reinterpret_cast<uint32_t*>(payload + kit::sparse::kFixedBytes + sizeof(float) * numel);
  kit::sparse::selectEntries(workspace + kTempOffset, temp_bytes, x, numel, KeepIndex{x, min_key}, values, parked,
                             count, st);
  nonfiniteKernel<<<kCheckBlocks, device::kThreads, 0, st>>>(values, count, status.device());
  TERSE_COMPRESSOR_CHECK_LAUNCH();
  uint64_t c = 0;
  device::copyToHost(&c, count, sizeof c, stream);
  device::synchronize(stream);
  if (status.raised()) return {c, true};
  if (c > numel) {
    throw sdk::Error(TERSE_ERR_INTERNAL, "threshold: the device selected " + std::to_string(c) + " of " +
                                             std::to_string(numel) + " elements");
  }
  auto* indices = reinterpret_cast<uint32_t*>(payload + kit::sparse::kFixedBytes + sizeof(float) * c);
  if (c == numel) {
    // Every element sent: the parked indices are where they belong.
  } else if (2 * c <= numel) {
    // [24 + 4c, 24 + 8c) ends at or before [24 + 4n, ...) begins: a copy, not an overlapping move.
    TERSE_SDK_CUDA_CHECK(cudaMemcpyAsync(indices, parked, sizeof(uint32_t) * c, cudaMemcpyDeviceToDevice, st));
  } else {
    TERSE_SDK_CUDA_CHECK(cub::DeviceSelect::If(workspace + kTempOffset, temp_bytes,
                                               thrust::counting_iterator<uint32_t>(0), indices, count, n,
                                               KeepIndex{x, min_key}, st));
  }
  TERSE_SDK_CUDA_CHECK(
      cudaMemcpyAsync(payload + kit::sparse::kCountOffset, count, sizeof(uint64_t), cudaMemcpyDeviceToDevice, st));
  return {c, false};
}

void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t min_key, uint32_t* status, void* stream) {
  kit::sparse::launchValidateSparse<true>(expected, payload, count, numel, min_key, status, stream);
}

void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  kit::sparse::launchScatter(payload, count, numel, out, accumulate, stream, gate);
}

void validateAndDecodeOneBlock(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
                               uint32_t min_key, float* out, bool accumulate, uint32_t* status, void* stream) {
  kit::sparse::launchValidateAndScatterOneBlock<true>(expected, payload, count, numel, min_key, out, accumulate, status,
                                                      stream);
}

}  // namespace terse::compressors::threshold::cuda
