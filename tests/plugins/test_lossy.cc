// test_lossy: a deterministic lossy quantizer for tests of error feedback and of the SUM path.
//
// Each f32 value x becomes q(x) = trunc(x / step) * step, computed in double and rounded to f32: truncation toward
// zero to a multiple of `step` (parameter, default 0.5, > 0). The residual x - q(x) is what error feedback must carry
// to the next step, and it is easy to predict in a test.
//
// Payload (SUM over f32, fixed size): the SDK's 16-byte header (identical on every rank, so sum_header_bytes = 16)
// followed by numel f32 values q(x). Summed across ranks, the values are the sum of the quantized gradients, which
// decompress writes (or adds) as is. Host memory, f32 gradients only.
#include <cmath>
#include <cstdint>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

constexpr sdk::PayloadFormat kFormat{"test_lossy", sdk::fourcc("TLSY"), 1};

class TestLossy final : public sdk::Compressor {
 public:
  TestLossy(sdk::Params& params, sdk::Host& /*host*/)
      : step_(params.getDouble("step", 0.5, sdk::Range::greaterThan(0))) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    requireF32(dtype);
    terse_compressor_caps_v1 caps{};
    caps.devices = TERSE_DEVICE_HOST;
    caps.aggregation = TERSE_AGG_SUM;
    caps.wire_dtype = TERSE_DTYPE_F32;
    caps.flags = TERSE_CAP_FIXED_SIZE;
    caps.num_rounds = 1;
    return caps;
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    requireF32(info.dtype);
    requireHost(info.device);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = sdk::kPayloadHeaderBytes + sizeof(float) * info.numel;
    sizes.sum_header_bytes = sdk::kPayloadHeaderBytes;  // identical on every rank
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireHost(args.info.device);
    sdk::ByteWriter w(args.output);
    sdk::writeHeader(w, kFormat, args.info);
    std::span<const float> in = args.input<float>();
    std::span<float> out = w.putArray<float>(in.size());
    for (size_t i = 0; i < in.size(); ++i) out[i] = static_cast<float>(std::trunc(in[i] / step_) * step_);
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireHost(args.info.device);
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, kFormat, args.info);
    std::span<const float> values = r.getArray<float>(static_cast<size_t>(args.info.numel), "values");
    r.expectEnd();
    std::span<float> out = args.output<float>();
    if (args.accumulate) {
      for (size_t i = 0; i < out.size(); ++i) out[i] += values[i];
    } else {
      for (size_t i = 0; i < out.size(); ++i) out[i] = values[i];
    }
  }

 private:
  static void requireF32(terse_dtype_v1 dtype) {
    if (dtype != TERSE_DTYPE_F32)
      throw sdk::Unsupported("only f32 gradients are supported, got " + sdk::dtypeName(dtype));
  }
  static void requireHost(terse_device_v1 device) {
    if (device != TERSE_DEVICE_HOST) throw sdk::Unsupported("only host memory is supported");
  }

  double step_;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(TestLossy, "test_lossy", "test: truncates f32 to multiples of 'step', summed as f32", "1.0.0");
