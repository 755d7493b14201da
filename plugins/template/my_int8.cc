// my_int8: per-tensor linear (min-max) 8-bit quantization, the plain uint8 baseline for gradient compression.
//
// The affine map of Jacob et al., "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
// Inference" (CVPR 2018), r = S (q - Z), with the scale and offset taken from the tensor's own range; Dettmers, "8-Bit
// Approximations for Parallelism in Deep Learning" (ICLR 2016), studies 8-bit data types for exchanging gradients.
// With L levels (parameter `levels`, 2..256, default 256) and n = numel:
//
//   lo = min_i x_i,   hi = max_i x_i,   s = (hi - lo) / (L - 1)                      (s = 0 for a constant tensor)
//   q_i = clamp(round((x_i - lo) / s), 0, L - 1)        x^_i = lo + s * q_i,        |x_i - x^_i| <= s / 2
//
// Payload, n + 32 bytes whatever the data (ALLGATHER, fixed size; f32 gradients in host memory):
//   [ 0, 16)  sdk::PayloadHeader: magic "MI8Q", format version 1, dtype f32, numel n
//   [16, 32)  f32 lo, f32 s, u32 L, u32 reserved (0)
//   [32, 32+n) u8 codes q_i
// Every rank's lo and s differ, so payloads are not summable: the core allgathers them and decompresses each with
// accumulate = 1. decompress checks every field before writing anything, because a payload comes from the network.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <terse/sdk.hpp>

namespace {

namespace sdk = terse::sdk;

constexpr sdk::PayloadFormat kFormat{"my_int8", sdk::fourcc("MI8Q"), 1};
constexpr uint64_t kScalesBytes = 16;  // lo, s, L, reserved: keeps the codes 16-byte aligned

class MyInt8 final : public sdk::Compressor {
 public:
  MyInt8(sdk::Params& params, sdk::Host& /*host*/)
      : levels_(static_cast<uint32_t>(params.getInt("levels", 256, sdk::Range::closed(2, 256)))) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    requireF32(dtype);
    // Payloads differ per rank (each has its own lo and s): allgathered; host memory and one round are the defaults.
    return sdk::Caps::allgather(TERSE_CAP_FIXED_SIZE);
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    requireF32(info.dtype);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = sdk::kPayloadHeaderBytes + kScalesBytes + info.numel;
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    requireHost(args.info.device);
    const std::span<const float> x = args.input<float>();
    // A NaN or an infinity has no place on a finite 8-bit grid: refuse it rather than send garbage.
    float lo = x.empty() ? 0.0f : x[0];
    float hi = lo;
    for (float v : x) {
      if (!std::isfinite(v))
        throw sdk::InvalidArgument("the gradient holds a non-finite value (" + sdk::formatNumber(v) + ")");
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (!std::isfinite(hi - lo)) throw sdk::InvalidArgument("the gradient's range exceeds f32");
    const float s = (hi - lo) / static_cast<float>(levels_ - 1);

    sdk::ByteWriter w(args.output);
    sdk::writeHeader(w, kFormat, args.info);
    w.put(lo);
    w.put(s);
    w.put(levels_);
    w.put(uint32_t{0});
    const std::span<uint8_t> q = w.putArray<uint8_t>(x.size());
    const double max_code = levels_ - 1;
    for (size_t i = 0; i < x.size(); ++i) {
      const double code = s > 0 ? std::nearbyint((static_cast<double>(x[i]) - lo) / s) : 0.0;
      q[i] = static_cast<uint8_t>(std::clamp(code, 0.0, max_code));
    }
    return w.offset();
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    requireHost(args.info.device);
    sdk::ByteReader r(args.payload);
    sdk::readHeader(r, kFormat, args.info);
    const auto lo = r.get<float>("lo");
    const auto s = r.get<float>("scale");
    const auto levels = r.get<uint32_t>("levels");
    r.get<uint32_t>("reserved");
    if (!std::isfinite(lo) || !std::isfinite(s) || s < 0) {
      throw sdk::InvalidPayload("payload range lo = " + sdk::formatNumber(lo) + ", scale = " + sdk::formatNumber(s) +
                                " is not finite and non-negative");
    }
    if (levels < 2 || levels > 256) {
      throw sdk::InvalidPayload("payload says " + std::to_string(levels) + " levels, expected 2..256");
    }
    const std::span<const uint8_t> q = r.getArray<uint8_t>(static_cast<size_t>(args.info.numel), "codes");
    r.expectEnd();
    for (uint8_t code : q) {
      if (code >= levels) {
        throw sdk::InvalidPayload("payload code " + std::to_string(code) + " is not below its " +
                                  std::to_string(levels) + " levels");
      }
    }
    const std::span<float> out = args.output<float>();
    for (size_t i = 0; i < out.size(); ++i) {
      const float v = lo + s * static_cast<float>(q[i]);
      out[i] = args.accumulate ? out[i] + v : v;
    }
  }

 private:
  static void requireF32(terse_dtype_v1 dtype) {
    if (dtype != TERSE_DTYPE_F32) throw sdk::Unsupported("only f32 gradients, got " + sdk::dtypeName(dtype));
  }
  static void requireHost(terse_device_v1 device) {
    if (device != TERSE_DEVICE_HOST) throw sdk::Unsupported("only host memory (no CUDA path yet)");
  }

  uint32_t levels_;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(MyInt8, "my_int8", "per-tensor linear 8-bit quantization (min-max scale), allgathered",
                        "0.1.0");
