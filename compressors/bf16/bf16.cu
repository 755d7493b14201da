// bf16's kernels: the elementwise cast kernels of terse/kit/cast_kernels.cuh over bf16_math.h's encodeValue
// and decodeValue, the functions the host loops in bf16.cc call, so the device payload is the host payload bit for bit.
#include <cstddef>
#include <cstdint>

#include "bf16_cuda.h"
#include "bf16_math.h"
#include "terse/kit/cast_kernels.cuh"

namespace terse::compressors::bf16::cuda {
namespace {

struct Math {
  using Wire = uint16_t;
  static TERSE_HD uint16_t encode(float g) { return encodeValue(g); }
  static TERSE_HD float decode(uint16_t w) { return decodeValue(w); }
};

}  // namespace

void encode(const float* in, uint16_t* out, uint64_t n, void* stream) {
  device::launchEncode<Math>(in, out, n, stream);
}

void decode(const std::byte* payload, const device::Prefix& expected, float* out, uint64_t n, bool accumulate,
            uint32_t* status, void* stream) {
  device::launchDecode<Math>(payload, expected, out, n, accumulate, status, stream);
}

}  // namespace terse::compressors::bf16::cuda
