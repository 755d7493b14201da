// fp16: cast the gradient to IEEE 754 binary16 and let the core sum the halves across ranks. The simplest lossy
// compressor (2x), standard in mixed-precision data-parallel training (Micikevicius et al., "Mixed Precision
// Training", ICLR 2018; Horovod's and PyTorch DDP's fp16 compression hooks).
//
// Equation: C(g)_i = fp16(g_i), rounded to nearest even; |fp16(g) - g| <= 2^-11 |g| for normal halves, up to 2^-25
// absolute in the subnormal range; |g| >= 65520 becomes infinity; infinities and NaN are kept. The aggregate is
// sum_r C(g_r) summed in the wire dtype (the core adds 16-bit payloads in f32 per pair and rounds back).
//
// Payload (SUM over f16, fixed size, 16 + 2N bytes):
//   [0, 16)        sdk::PayloadHeader {magic "FP16", version 1, dtype f32, numel N}; identical on every rank:
//                  sum_header_bytes = 16
//   [16, 16 + 2N)  N binary16 values
// Decompress converts back to f32 (exactly: every half is a float) and writes or adds. Host memory, f32 gradients.
#include <cstdint>
#include <span>
#include <string>

#include "fp16_math.h"
#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;
namespace math = terse::compressors::fp16;

constexpr sdk::PayloadFormat kFormat{"fp16", sdk::fourcc("FP16"), 1};
constexpr uint64_t kMaxNumel = uint64_t{1} << 40;  // keeps every byte count far below 2^64
constexpr uint64_t kBlock = 64;  // fixed-length inner loops: GCC -O2 vectorizes only known trip counts

void requireSupported(const terse_tensor_info_v1& info) {
  if (info.dtype != TERSE_DTYPE_F32)
    throw sdk::Unsupported("only f32 gradients are supported, got " + sdk::dtypeName(info.dtype));
  if (info.device != TERSE_DEVICE_HOST) throw sdk::Unsupported("only host memory is supported (CUDA comes later)");
  if (info.numel > kMaxNumel)
    throw sdk::Unsupported("numel " + std::to_string(info.numel) + " exceeds the supported 2^40 elements");
  if (info.round != 0) throw sdk::InvalidArgument("round " + std::to_string(info.round) + " of a 1-round compressor");
}

TERSE_CPU_CLONES void encodeAll(const float* __restrict in, uint16_t* __restrict out, uint64_t n) {
  uint64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (uint64_t j = 0; j < kBlock; ++j) out[i + j] = math::encodeValue(in[i + j]);
  }
  for (; i < n; ++i) out[i] = math::encodeValue(in[i]);
}

TERSE_CPU_CLONES void decodeAll(const uint16_t* __restrict in, float* __restrict out, uint64_t n, bool accumulate) {
  uint64_t i = 0;
  if (accumulate) {
    for (; i + kBlock <= n; i += kBlock) {
      for (uint64_t j = 0; j < kBlock; ++j) out[i + j] += math::decodeValue(in[i + j]);
    }
    for (; i < n; ++i) out[i] += math::decodeValue(in[i]);
  } else {
    for (; i + kBlock <= n; i += kBlock) {
      for (uint64_t j = 0; j < kBlock; ++j) out[i + j] = math::decodeValue(in[i + j]);
    }
    for (; i < n; ++i) out[i] = math::decodeValue(in[i]);
  }
}

class Fp16 final : public sdk::Compressor {
 public:
  Fp16(sdk::Params& /*params*/, sdk::Host& /*host*/) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    if (dtype != TERSE_DTYPE_F32)
      throw sdk::Unsupported("only f32 gradients are supported, got " + sdk::dtypeName(dtype));
    terse_compressor_caps_v1 caps{};
    caps.devices = TERSE_DEVICE_HOST;
    caps.aggregation = TERSE_AGG_SUM;
    caps.wire_dtype = TERSE_DTYPE_F16;
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
    sdk::writeHeader(w, kFormat, args.info);
    const std::span<const float> in = args.input<float>();
    const std::span<uint16_t> out = w.putArray<uint16_t>(in.size());
    encodeAll(in.data(), out.data(), in.size());
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireSupported(args.info);
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, kFormat, args.info);
    const std::span<const uint16_t> values = r.getArray<uint16_t>(static_cast<size_t>(args.info.numel), "values");
    r.expectEnd();
    const std::span<float> out = args.output<float>();
    decodeAll(values.data(), out.data(), out.size(), args.accumulate);
  }
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(Fp16, "fp16", "f32 cast to IEEE binary16 (RNE), summed across ranks in f16", "1.0.0");
