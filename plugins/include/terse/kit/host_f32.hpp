// The input checks of a one-round f32 compressor, as every built-in makes them: f32 gradients in host memory (and, for
// a plugin built with CUDA kernels, device memory; see terse/kit/device.hpp), at most 2^40 elements (which keeps every
// byte count far below 2^64), one round. Shared so that every built-in refuses the same inputs with the same words; a
// new compressor that calls them refuses them alike. Pair with sdk::Caps (terse/sdk/caps.hpp) for caps().
#pragma once

#include <cstdint>
#include <string>

#include "terse/sdk.hpp"

namespace terse::kit {

inline constexpr uint64_t kMaxNumel = uint64_t{1} << 40;

inline void requireF32(terse_dtype_v1 dtype) {
  if (dtype != TERSE_DTYPE_F32)
    throw sdk::Unsupported("only f32 gradients are supported, got " + sdk::dtypeName(dtype));
}

// The checks every call of a one-round f32 compressor makes on its tensor info; `devices` is the TERSE_DEVICE_* mask
// the plugin advertises in its caps.
inline void requireF32OneRound(const terse_tensor_info_v1& info, terse_device_v1 devices) {
  requireF32(info.dtype);
  if (info.device != TERSE_DEVICE_HOST && info.device != TERSE_DEVICE_CUDA)
    throw sdk::Unsupported("unknown device " + std::to_string(info.device));
  if ((info.device & devices) == 0) {
    throw sdk::Unsupported(devices == TERSE_DEVICE_HOST
                               ? "only host memory is supported (this build of the plugin has no CUDA kernels)"
                               : "only CUDA device memory is supported");
  }
  if (info.numel > kMaxNumel)
    throw sdk::Unsupported("numel " + std::to_string(info.numel) + " exceeds the supported 2^40 elements");
  if (info.round != 0) throw sdk::InvalidArgument("round " + std::to_string(info.round) + " of a 1-round compressor");
}

// The same for a compressor without CUDA kernels.
inline void requireHostF32OneRound(const terse_tensor_info_v1& info) {
  requireF32OneRound(info, TERSE_DEVICE_HOST);
}

}  // namespace terse::kit
