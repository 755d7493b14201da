// What the built-in compressors accept: f32 gradients in host memory (and, for those with CUDA kernels in a build with
// CUDA, device memory; see compressors/common/device.h), at most 2^40 elements (which keeps every byte count far below
// 2^64), one round. Shared so that every built-in refuses the same inputs with the same words.
#pragma once

#include <cstdint>
#include <string>

#include "terse/sdk.hpp"

namespace terse::compressors {

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

// The caps of a one-round f32 compressor whose payloads differ per rank (allgathered and decoded one by one), running
// on `devices`; `flags` adds e.g. TERSE_CAP_FIXED_SIZE.
inline terse_compressor_caps_v1 allgatherCaps(terse_dtype_v1 dtype, uint32_t flags, terse_device_v1 devices) {
  requireF32(dtype);
  terse_compressor_caps_v1 caps{};
  caps.devices = devices;
  caps.aggregation = TERSE_AGG_ALLGATHER;
  caps.flags = flags;
  caps.num_rounds = 1;
  return caps;
}

// The same for a host-only compressor.
inline terse_compressor_caps_v1 hostAllgatherCaps(terse_dtype_v1 dtype, uint32_t flags) {
  return allgatherCaps(dtype, flags, TERSE_DEVICE_HOST);
}

}  // namespace terse::compressors
