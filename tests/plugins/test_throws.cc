// test_throws: a plugin that is valid to load and query but broken on purpose when used. compress throws a
// std::runtime_error and decompress throws an int, so tests see both exception paths of the SDK's C boundary come back
// as TERSE_ERR_INTERNAL with a logged message instead of a crash. Built into the fixture directory only, so it never
// shows up in a default plugin search.
#include <cstdint>
#include <stdexcept>

#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;

class TestThrows final : public sdk::Compressor {
 public:
  TestThrows(sdk::Params& /*params*/, sdk::Host& /*host*/) {}

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
    sizes.max_output_bytes = sdk::kPayloadHeaderBytes + sizeof(float) * info.numel;
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& /*args*/) const override {
    throw std::runtime_error("deliberate failure in compress");
  }

  void decompress(const sdk::DecompressArgs& /*args*/) const override {
    throw 42;  // not a std::exception: the SDK's catch (...) path
  }
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(TestThrows, "test_throws", "fixture: compress and decompress throw", "1.0.0");
