// What the built-in CPU compressors accept until the GPU issue adds their CUDA paths: f32 gradients in host memory,
// at most 2^40 elements (which keeps every byte count far below 2^64), one round. Shared so that every built-in
// refuses the same inputs with the same words.
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

// The checks every call of a one-round, host-only f32 compressor makes on its tensor info.
inline void requireHostF32OneRound(const terse_tensor_info_v1& info) {
  requireF32(info.dtype);
  if (info.device != TERSE_DEVICE_HOST) throw sdk::Unsupported("only host memory is supported (CUDA comes later)");
  if (info.numel > kMaxNumel)
    throw sdk::Unsupported("numel " + std::to_string(info.numel) + " exceeds the supported 2^40 elements");
  if (info.round != 0) throw sdk::InvalidArgument("round " + std::to_string(info.round) + " of a 1-round compressor");
}

// The caps of a host-only, one-round f32 compressor whose payloads differ per rank (allgathered and decoded one by
// one); `flags` adds e.g. TERSE_CAP_FIXED_SIZE.
inline terse_compressor_caps_v1 hostAllgatherCaps(terse_dtype_v1 dtype, uint32_t flags) {
  requireF32(dtype);
  terse_compressor_caps_v1 caps{};
  caps.devices = TERSE_DEVICE_HOST;
  caps.aggregation = TERSE_AGG_ALLGATHER;
  caps.flags = flags;
  caps.num_rounds = 1;
  return caps;
}

}  // namespace terse::compressors
