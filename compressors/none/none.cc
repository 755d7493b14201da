// none: the uncompressed baseline. Every result table compares against it (compression ratio 1, the accuracy a
// compressor should match), so in terse's own runs it goes through exactly the plugin path the others take: payload
// header, SUM aggregation in the core, decompress. It declares TERSE_CAP_IDENTITY (its body is the input unchanged),
// so the PyTorch hook, whose baseline is DDP's own allreduce on the bucket, sums the bucket in place as DDP does and
// calls neither compress nor decompress (experiments/python/ddp_aggregator.h).
//
// Equation: C(g) = g. The aggregate is sum_r g_r, which the core divides by world_size.
//
// Payload (SUM over f32, fixed size, 16 + 4N bytes):
//   [0, 16)        sdk::PayloadHeader {magic "NONE", version 1, dtype f32, numel N}; identical on every rank, so it is
//                  the sum header (sum_header_bytes = 16) the core carries through unsummed
//   [16, 16 + 4N)  N f32 values g_i
// f32 gradients in host memory, and in CUDA device memory when built with none.cu (the same bytes and values;
// decompress on CUDA synchronizes `stream` once to learn whether the header was valid, see
// terse/kit/device.hpp); other dtypes are refused with sdk::Unsupported.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "none_cuda.h"
#include "none_math.h"
#include "terse/kit/device.hpp"
#include "terse/kit/host_f32.hpp"
#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;
namespace math = terse::compressors::none;

constexpr sdk::PayloadFormat kFormat{"none", sdk::fourcc("NONE"), 1};

namespace device = terse::kit::device;

void requireSupported(const terse_tensor_info_v1& info) {
  terse::kit::requireF32OneRound(info, device::kDevices);
}

uint64_t payloadBytes(uint64_t numel) {
  return sdk::kPayloadHeaderBytes + sizeof(float) * numel;
}

class None final : public sdk::Compressor {
 public:
  None(sdk::Params& /*params*/, sdk::Host& /*host*/) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    terse::kit::requireF32(dtype);
    return sdk::Caps::sum(TERSE_DTYPE_F32, TERSE_CAP_FIXED_SIZE | TERSE_CAP_IDENTITY, device::kDevices);
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
    sdk::writeHeader(w, kFormat, args.info);
    const std::span<const float> in = args.input<float>();
    const std::span<float> out = w.putArray<float>(in.size());
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size_bytes());  // encodeValue is the identity
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireSupported(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, kFormat, args.info);
    const std::span<const float> values = r.getArray<float>(static_cast<size_t>(args.info.numel), "values");
    r.expectEnd();
    const std::span<float> out = args.output<float>();
    if (!args.accumulate) {
      if (!out.empty()) std::memcpy(out.data(), values.data(), out.size_bytes());
      return;
    }
    for (size_t i = 0; i < out.size(); ++i) out[i] = math::decodeValue(values[i], out[i], true);
  }

 private:
#if TERSE_COMPRESSOR_CUDA
  static device::Prefix prefixFor(const terse_tensor_info_v1& info) {
    return device::makePrefix([&](sdk::ByteWriter& w) { sdk::writeHeader(w, kFormat, info); });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const uint64_t total = payloadBytes(args.info.numel);
    device::requireCapacity(args.output, total, kFormat.plugin);
    const device::Scope scope(args.info);
    const device::Prefix prefix = prefixFor(args.info);
    device::writePrefix(prefix, args.output.data(), args.stream);
    terse::compressors::none::cuda::encode(args.input<float>().data(),
                                           reinterpret_cast<float*>(args.output.data() + prefix.size), args.info.numel,
                                           args.stream);
    return total;
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    // The decode kernel validates the header as it goes and writes nothing for a refused payload.
    device::checkedDecompress(
        args, status_, args.payload.size() == payloadBytes(args.info.numel),
        [&](uint32_t* status) {
          terse::compressors::none::cuda::decode(args.payload.data(), prefixFor(args.info), args.output<float>().data(),
                                                 args.info.numel, args.accumulate, status, args.stream);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); }, device::OwnPayload::kTrust);
  }

  mutable device::StatusWords status_;
#endif
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(None, "none", "uncompressed f32 baseline, summed across ranks", "1.0.0");
