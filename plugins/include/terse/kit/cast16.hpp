// The whole plugin of a 16-bit casting compressor (the built-ins fp16 and bf16): C(g)_i = cast(g_i), summed across
// ranks in the wire dtype. Only the cast differs, so each plugin supplies a Traits type and this template supplies the
// rest:
//
//   struct Traits {
//     static constexpr terse::sdk::PayloadFormat kFormat;   // name, magic, version
//     static constexpr terse_dtype_v1 kWireDtype;           // TERSE_DTYPE_F16 or TERSE_DTYPE_BF16
//     static void encodeAll(const float* in, uint16_t* out, uint64_t n);
//     static void decodeAll(const uint16_t* in, float* out, uint64_t n, bool accumulate);
//     // With CUDA kernels (TERSE_COMPRESSOR_CUDA), the same on device memory, queued on `stream`; decodeDevice
//     // decodes only a payload that starts with `expected` and raises `status` otherwise (see device.hpp):
//     static void encodeDevice(const float* in, uint16_t* out, uint64_t n, void* stream);
//     static void decodeDevice(const std::byte* payload, const device::Prefix& expected, float* out, uint64_t n,
//                              bool accumulate, uint32_t* status, void* stream);
//   };
//
// The loops stay in each plugin's source (each called through sdk::cpu::clones, compiled per x86-64 level there).
//
// Parameter: threads   host compress of one tensor on this many threads, in [1, 64] (default 1); the same bytes for
//                      any value (sdk/parallel.hpp).
//
// Payload (SUM over the wire dtype, fixed size, 16 + 2N bytes):
//   [0, 16)        sdk::PayloadHeader {magic, version 1, dtype f32, numel N}; identical on every rank:
//                  sum_header_bytes = 16
//   [16, 16 + 2N)  N 16-bit values
// Decompress converts back to f32 (exactly: every 16-bit value is a float) and writes or adds. f32 gradients in host
// memory, and in CUDA device memory when the plugin is built with its kernels: the device gives the host's bytes and
// values bit for bit (the same encode/decode functions, exact integer and IEEE operations). On CUDA, decompress
// synchronizes `stream` once to learn whether the header was valid (device.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "terse/kit/device.hpp"
#include "terse/kit/host_f32.hpp"
#include "terse/sdk.hpp"
#include "terse/sdk/parallel.hpp"

namespace terse::kit {

template <class Traits>
class Cast16 final : public sdk::Compressor {
 public:
  Cast16(sdk::Params& params, sdk::Host& /*host*/)
      : threads_(params.getInt("threads", 1, sdk::Range::closed(1, sdk::kMaxThreads))) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    requireF32(dtype);
    return sdk::Caps::sum(Traits::kWireDtype, TERSE_CAP_FIXED_SIZE, device::kDevices);
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    requireSupported(info);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = payloadBytes(info.numel);
    sizes.sum_header_bytes = sdk::kPayloadHeaderBytes;
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    sdk::ByteWriter w(args.output);
    sdk::writeHeader(w, Traits::kFormat, args.info);
    const std::span<const float> in = args.input<float>();
    const std::span<uint16_t> out = w.putArray<uint16_t>(in.size());
    // Elementwise, so any cut gives the same bytes; 16 elements keep each thread's output on its own cache lines.
    sdk::forEachRange(
        in.size(), 16, threads_,
        [&](uint64_t begin, uint64_t end) { Traits::encodeAll(in.data() + begin, out.data() + begin, end - begin); },
        sdk::kMinCastElementsPerThread);
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, Traits::kFormat, args.info);
    const std::span<const uint16_t> values = r.getArray<uint16_t>(static_cast<size_t>(args.info.numel), "values");
    r.expectEnd();
    const std::span<float> out = args.output<float>();
    Traits::decodeAll(values.data(), out.data(), out.size(), args.accumulate);
  }

 private:
  int64_t threads_;  // host compress on this many threads (sdk/parallel.hpp); 1 by default
  static void requireSupported(const terse_tensor_info_v1& info) {
    requireF32OneRound(info, device::kDevices);
  }
  static uint64_t payloadBytes(uint64_t numel) {
    return sdk::kPayloadHeaderBytes + sizeof(uint16_t) * numel;
  }

#if TERSE_COMPRESSOR_CUDA
  static device::Prefix prefixFor(const terse_tensor_info_v1& info) {
    return device::makePrefix([&](sdk::ByteWriter& w) { sdk::writeHeader(w, Traits::kFormat, info); });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const uint64_t total = payloadBytes(args.info.numel);
    device::requireCapacity(args.output, total, Traits::kFormat.plugin);
    const device::Scope scope(args.info);
    const device::Prefix prefix = prefixFor(args.info);
    device::writePrefix(prefix, args.output.data(), args.stream);
    Traits::encodeDevice(args.input<float>().data(), reinterpret_cast<uint16_t*>(args.output.data() + prefix.size),
                         args.info.numel, args.stream);
    return total;
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    // The decode kernel validates the header as it goes and writes nothing for a refused payload.
    device::checkedDecompress(
        args, status_, args.payload.size() == payloadBytes(args.info.numel),
        [&](uint32_t* status) {
          Traits::decodeDevice(args.payload.data(), prefixFor(args.info), args.output<float>().data(), args.info.numel,
                               args.accumulate, status, args.stream);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); }, device::OwnPayload::kTrust);
  }

  mutable device::StatusWords status_;
#endif
};

}  // namespace terse::kit
