// terse plugin SDK: a compressor's capabilities in one expression, with the defaults most compressors want (host
// memory, one round, no flags), so that caps() states only what differs:
//
//   return sdk::Caps::allgather(TERSE_CAP_FIXED_SIZE);                     // top-k style: payloads differ per rank
//   return sdk::Caps::sum(TERSE_DTYPE_F16, TERSE_CAP_FIXED_SIZE);         // fp16 casting: payloads summed as f16
//   return sdk::Caps::sum(TERSE_DTYPE_F32, TERSE_CAP_FIXED_SIZE | TERSE_CAP_STATEFUL, devices, 2);  // PowerSGD
//   return sdk::Caps::custom(TERSE_CAP_FIXED_SIZE);                        // the plugin's own reduce (signSGD vote)
//
// The meaning of each field is in terse/compressor_v1.h; struct_size is the export macro's job.
#pragma once

#include <cstdint>

#include "terse/compressor_v1.h"

namespace terse::sdk {

struct Caps {
  // TERSE_AGG_ALLGATHER: the core allgathers the payloads and decompresses each with accumulate = 1.
  static constexpr terse_compressor_caps_v1 allgather(uint32_t flags = 0, terse_device_v1 devices = TERSE_DEVICE_HOST,
                                                      int32_t num_rounds = 1) {
    return make(TERSE_AGG_ALLGATHER, TERSE_DTYPE_F32, flags, devices, num_rounds);
  }
  // TERSE_AGG_SUM: payloads summed elementwise as `wire_dtype` after sizes' sum_header_bytes (needs
  // TERSE_CAP_FIXED_SIZE, which the core checks).
  static constexpr terse_compressor_caps_v1 sum(terse_dtype_v1 wire_dtype, uint32_t flags = 0,
                                                terse_device_v1 devices = TERSE_DEVICE_HOST, int32_t num_rounds = 1) {
    return make(TERSE_AGG_SUM, wire_dtype, flags, devices, num_rounds);
  }
  // TERSE_AGG_CUSTOM: the core folds the payloads with the plugin's reduce().
  static constexpr terse_compressor_caps_v1 custom(uint32_t flags = 0, terse_device_v1 devices = TERSE_DEVICE_HOST,
                                                   int32_t num_rounds = 1) {
    return make(TERSE_AGG_CUSTOM, TERSE_DTYPE_F32, flags, devices, num_rounds);
  }

 private:
  // wire_dtype is ignored unless the aggregation is SUM; it stays 0 (TERSE_DTYPE_F32) otherwise, as a
  // zero-initialized struct has it.
  static constexpr terse_compressor_caps_v1 make(terse_aggregation_v1 aggregation, terse_dtype_v1 wire_dtype,
                                                 uint32_t flags, terse_device_v1 devices, int32_t num_rounds) {
    terse_compressor_caps_v1 caps{};
    caps.devices = devices;
    caps.aggregation = aggregation;
    caps.wire_dtype = wire_dtype;
    caps.flags = flags;
    caps.num_rounds = num_rounds;
    return caps;
  }
};

}  // namespace terse::sdk
