// The plugin shared by the 16-bit casting compressors (fp16, bf16): C(g)_i = cast(g_i), summed across ranks in the
// wire dtype. Only the cast differs, so each plugin supplies a Traits type and this template supplies the rest:
//
//   struct Traits {
//     static constexpr terse::sdk::PayloadFormat kFormat;   // name, magic, version
//     static constexpr terse_dtype_v1 kWireDtype;           // TERSE_DTYPE_F16 or TERSE_DTYPE_BF16
//     static void encodeAll(const float* in, uint16_t* out, uint64_t n);
//     static void decodeAll(const uint16_t* in, float* out, uint64_t n, bool accumulate);
//   };
//
// The loops stay in each plugin's source (compiled with TERSE_CPU_CLONES, which GCC does not offer for templates).
//
// Payload (SUM over the wire dtype, fixed size, 16 + 2N bytes):
//   [0, 16)        sdk::PayloadHeader {magic, version 1, dtype f32, numel N}; identical on every rank:
//                  sum_header_bytes = 16
//   [16, 16 + 2N)  N 16-bit values
// Decompress converts back to f32 (exactly: every 16-bit value is a float) and writes or adds. Host memory, f32
// gradients.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "compressors/common/host_f32.h"
#include "terse/sdk.hpp"

namespace terse::compressors {

template <class Traits>
class Cast16 final : public sdk::Compressor {
 public:
  Cast16(sdk::Params& /*params*/, sdk::Host& /*host*/) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    requireF32(dtype);
    terse_compressor_caps_v1 caps{};
    caps.devices = TERSE_DEVICE_HOST;
    caps.aggregation = TERSE_AGG_SUM;
    caps.wire_dtype = Traits::kWireDtype;
    caps.flags = TERSE_CAP_FIXED_SIZE;
    caps.num_rounds = 1;
    return caps;
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    requireSupported(info);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = sdk::kPayloadHeaderBytes + sizeof(uint16_t) * info.numel;
    sizes.sum_header_bytes = sdk::kPayloadHeaderBytes;
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireSupported(args.info);
    sdk::ByteWriter w(args.output);
    sdk::writeHeader(w, Traits::kFormat, args.info);
    const std::span<const float> in = args.input<float>();
    const std::span<uint16_t> out = w.putArray<uint16_t>(in.size());
    Traits::encodeAll(in.data(), out.data(), in.size());
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireSupported(args.info);
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, Traits::kFormat, args.info);
    const std::span<const uint16_t> values = r.getArray<uint16_t>(static_cast<size_t>(args.info.numel), "values");
    r.expectEnd();
    const std::span<float> out = args.output<float>();
    Traits::decodeAll(values.data(), out.data(), out.size(), args.accumulate);
  }

 private:
  static void requireSupported(const terse_tensor_info_v1& info) { requireHostF32OneRound(info); }
};

}  // namespace terse::compressors
