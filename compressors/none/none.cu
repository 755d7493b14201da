// none's kernels: the payload values are the gradient, so compress is a device-to-device copy, and decompress is the
// elementwise decode of terse/kit/cast_kernels.cuh over none_math.h's decodeValue (with accumulate, the same
// single f32 addition the host loop makes).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "none_cuda.h"
#include "none_math.h"
#include "terse/kit/cast_kernels.cuh"

namespace terse::compressors::none::cuda {
namespace {

// Only the decode half: encodeValue is the identity, which compress does as one copy.
struct Math {
  using Wire = float;
  // Added to the output by the kernel when accumulating, which is decodeValue(wire, out, true) = out + wire.
  static TERSE_HD float decode(float wire) { return decodeValue(wire, 0.0f, false); }
};

}  // namespace

void encode(const float* in, float* out, uint64_t n, void* stream) {
  if (n == 0) return;
  TERSE_SDK_CUDA_CHECK(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, device::streamOf(stream)));
}

void decode(const std::byte* payload, const device::Prefix& expected, float* out, uint64_t n, bool accumulate,
            uint32_t* status, void* stream) {
  device::launchDecode<Math>(payload, expected, out, n, accumulate, status, stream);
}

}  // namespace terse::compressors::none::cuda
