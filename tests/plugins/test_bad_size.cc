// test_bad_size: a plugin written with the SDK, valid to load and query, whose compress reports a size that breaks its
// promises, so tests see that such a size reaches the user as the plugin's error (PluginError, status
// TERSE_ERR_INTERNAL, tagged "[plugin error]") naming the plugin, the call and the sizes, whichever side catches it.
// Parameter `mode`:
//   too_many     more bytes than the output buffer holds: the SDK's own check catches it
//   too_big      more than its max_output_bytes, within a larger buffer: the core's check catches it
//   short_fixed  fewer than max_output_bytes although the caps say fixed size: the core's check catches it
// Built into the fixture directory only, so it never shows up in a default plugin search.
#include <cstdint>
#include <string>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

class TestBadSize final : public sdk::Compressor {
 public:
  TestBadSize(sdk::Params& params, sdk::Host& /*host*/)
      : mode_(params.getChoice("mode", "too_many", {"too_many", "too_big", "short_fixed"})) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    if (dtype != TERSE_DTYPE_F32)
      throw sdk::Unsupported("only f32 gradients are supported, got " + sdk::dtypeName(dtype));
    terse_compressor_caps_v1 caps{};
    caps.devices = TERSE_DEVICE_HOST;
    caps.aggregation = TERSE_AGG_ALLGATHER;
    caps.flags = TERSE_CAP_FIXED_SIZE;
    caps.num_rounds = 1;
    return caps;
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = maxOutputBytes(info);
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    if (mode_ == "too_many") return args.output.size() + 1;
    if (mode_ == "too_big") return maxOutputBytes(args.info) + 4;
    return maxOutputBytes(args.info) - 4;  // short_fixed
  }

  void decompress(const sdk::DecompressArgs& /*args*/) const override {
    throw sdk::Unsupported("test_bad_size never writes a payload to decompress");
  }

 private:
  static uint64_t maxOutputBytes(const terse_tensor_info_v1& info) {
    return sdk::kPayloadHeaderBytes + sizeof(float) * info.numel;
  }

  std::string mode_;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(TestBadSize, "test_bad_size", "fixture: compress reports sizes that break its promises",
                        "1.0.0");
