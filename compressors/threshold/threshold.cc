// threshold: send every gradient element whose magnitude reaches a fixed threshold tau.
//
// Paper: Strom, "Scalable Distributed DNN Training Using Commodity GPU Cloud Computing", Interspeech 2015, section 2:
// elements with |g_i| >= tau are sent (Strom quantizes them to +-tau; this plugin sends the values themselves, as in
// the "threshold-v" variant of Aji and Heafield, EMNLP 2017), the rest stays behind:
//     T_tau(g)_i = g_i  if |g_i| >= tau,  0 otherwise
// Strom's residual (g - T_tau(g) carried to the next step) is the core's error feedback decorator, not part of this
// plugin. How many elements pass depends on the data, so the payload size varies (no TERSE_CAP_FIXED_SIZE): from 24
// bytes (nothing passed: a valid payload that decodes to zeros) to 24 + 8 * numel.
//
// Payload (terse/kit/sparse_payload.hpp), ALLGATHER:
//     header (16 B, magic "THRS", version 1) | u64 count | f32 values[count] | u32 indices[count] (strictly increasing)
// decompress also checks that every value reaches tau (no honest sender sends less).
//
// Parameters: tau > 0, REQUIRED: there is no default that suits gradients of every scale; a config must say it.
// No workspace, no state. f32 gradients in host memory, fewer than 2^32 elements. A non-finite gradient element fails
// compress with InvalidArgument (inf passes any tau; NaN is treated as passing too, so it is never dropped silently).
//
// Compress is one pass: values are written from offset 24 forward and indices, whose final offset depends on the
// count, forward from offset 24 + 4 * numel (the output's capacity is 24 + 8 * numel, which compress requires), then
// moved down once the count is known. The device path parks its indices at the same place (threshold.cu).
//
// CUDA (threshold.cu, when built with CUDA): device tensors give the host's payload byte for byte (cub::DeviceSelect
// with the same integer key compare keeps index order). Compress synchronizes `stream` once, as a variable-size
// compressor must to report its output bytes, and so refuses a non-finite gradient as the host does; its workspace is
// a counter and cub's selection storage. Decompress takes the count from the payload's size (sparse::countForSize)
// and synchronizes once, to learn the validation verdict (terse/kit/device.hpp); a tensor of at most
// terse/kit/one_block.hpp's cut (2^16 elements) is validated and decoded in one launch of one block.
#include <cstdint>
#include <cstring>
#include <string>

#include "terse/kit/device.hpp"
#include "terse/kit/one_block.hpp"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_select.hpp"
#include "terse/sdk.hpp"
#include "threshold_cuda.h"
#include "threshold_math.h"

namespace {

namespace sdk = terse::sdk;
namespace sparse = terse::kit::sparse;
namespace tk = terse::kit::topk;
namespace th = terse::compressors::threshold;
namespace device = terse::kit::device;

constexpr const char* kName = "threshold";
constexpr sdk::PayloadFormat kFormat{kName, sdk::fourcc("THRS"), 1};

double requiredTau(sdk::Params& params) {
  if (!params.has("tau")) {
    throw sdk::InvalidArgument(std::string(kName) +
                               ": 'tau' is required (the magnitude an element must reach to be "
                               "sent, > 0); there is no default that suits every gradient scale");
  }
  return params.getDouble("tau", 0, sdk::Range::greaterThan(0));
}

class Threshold final : public sdk::Compressor {
 public:
  Threshold(sdk::Params& params, sdk::Host& /*host*/) : tau_(requiredTau(params)), min_key_(th::minKeyFor(tau_)) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    sparse::requireF32(kName, dtype);
    return sdk::Caps::allgather(/*flags=*/0, device::kDevices);  // variable size
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    check(info);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = sparse::payloadBytes(info.numel);
#if TERSE_COMPRESSOR_CUDA
    if (info.device == TERSE_DEVICE_CUDA) {
      const device::Scope scope(info);
      sizes.workspace_bytes = th::cuda::workspaceBytes(info.numel);
    }
#endif
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    check(args.info);
    requireOutput(args);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    const std::span<const float> g = args.input<float>();
    const size_t n = g.size();
    {
      sdk::ByteWriter w(args.output);
      sdk::writeHeader(w, kFormat, args.info);
    }
    std::byte* base = args.output.data();
    // The output is 16-byte aligned and both sections start at multiples of 4 bytes.
    auto* values = reinterpret_cast<float*>(base + sparse::kFixedBytes);
    auto* far_indices = reinterpret_cast<uint32_t*>(base + sparse::kFixedBytes + sizeof(float) * n);
    const float* data = g.data();
    uint64_t c = 0;
    uint32_t nonfinite = 0;
    float sink_value;
    uint32_t sink_index;
    tk::scanBlocks(
        n, [data](size_t i) { return tk::magnitudeKey(data[i]); }, min_key_,
        [&](size_t i) {
          const float v = data[i];
          const uint32_t key = tk::magnitudeKey(v);
          const bool take = th::keep(key, min_key_);
          *(take ? values + c : &sink_value) = v;
          *(take ? far_indices + c : &sink_index) = static_cast<uint32_t>(i);
          nonfinite |= take && tk::isNonFiniteKey(key) ? 1u : 0u;
          c += take ? 1 : 0;
        },
        [] { return false; });
    if (nonfinite != 0) refuseNonFinite();
    std::memmove(base + sparse::kFixedBytes + sizeof(float) * c, far_indices, sizeof(uint32_t) * c);
    std::memcpy(base + sparse::kCountOffset, &c, sizeof c);
    return sparse::payloadBytes(c);
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    check(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    const sparse::SparseView v = sparse::readSparse(args.payload, kFormat, args.info, 0, args.info.numel, min_key_);
    sparse::scatter(v, args.output<float>(), args.accumulate);
  }

 private:
  static void check(const terse_tensor_info_v1& info) {
    sparse::requireF32(kName, info.dtype);
    sparse::requireDevice(kName, info.device, device::kDevices);
    sparse::requireIndexable(kName, info.numel);
  }

  static void requireOutput(const sdk::CompressArgs& args) {
    const uint64_t need = sparse::payloadBytes(args.info.numel);
    if (args.output.size() < need) {
      throw sdk::InvalidArgument("output of " + std::to_string(args.output.size()) + " bytes, sizes() asked for " +
                                 std::to_string(need));
    }
  }

  [[noreturn]] static void refuseNonFinite() {
    throw sdk::InvalidArgument("the gradient holds a non-finite value (inf or NaN); threshold would send it");
  }

#if TERSE_COMPRESSOR_CUDA
  // The payload's prefix: the header, and (for validation) the count.
  static device::Prefix prefix(const terse_tensor_info_v1& info, const uint64_t* count) {
    return device::makePrefix([&](sdk::ByteWriter& w) {
      sdk::writeHeader(w, kFormat, info);
      if (count != nullptr) w.put(*count);
    });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const device::Scope scope(args.info);
    const uint64_t need = th::cuda::workspaceBytes(args.info.numel);
    if (args.workspace.size() < need) {
      throw sdk::InvalidArgument("workspace of " + std::to_string(args.workspace.size()) +
                                 " bytes, sizes() asked for " + std::to_string(need));
    }
    const auto status = status_.acquire();
    status.clear();
    const th::cuda::Selection s =
        th::cuda::compress(prefix(args.info, nullptr), args.input<float>().data(), args.info.numel, min_key_,
                           args.workspace.data(), args.output.data(), status, args.stream);
    if (s.nonfinite) refuseNonFinite();
    return sparse::payloadBytes(s.count);
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    // The count is the one the payload's size implies (sparse::countForSize); the device checks the count field
    // against it with the rest of the prefix, so a payload the host would refuse is refused here too, without a
    // synchronization to read the field first. Its own payloads always validate (compress refuses a non-finite
    // gradient), so they are trusted.
    uint64_t count = 0;
    const bool size_ok = sparse::countForSize(args.payload.size(), &count) && count <= args.info.numel;
    const auto host = [this](const sdk::DecompressArgs& h) { decompress(h); };
    float* out = args.output<float>().data();
    if (one_block_.covers(args.info.numel)) {  // the kernel validates before it writes: one call does both
      device::checkedDecompress(
          args, status_, size_ok,
          [&](uint32_t* status) {
            th::cuda::validateAndDecodeOneBlock(prefix(args.info, &count), args.payload.data(), count, args.info.numel,
                                                min_key_, out, args.accumulate, status, args.stream);
          },
          host, device::OwnPayload::kTrust);
      return;
    }
    device::checkedDecompress(
        args, status_, size_ok,
        [&](uint32_t* status) {
          th::cuda::validate(prefix(args.info, &count), args.payload.data(), count, args.info.numel, min_key_, status,
                             args.stream);
        },
        [&](const uint32_t* gate) {
          th::cuda::decode(args.payload.data(), count, args.info.numel, out, args.accumulate, args.stream, gate);
        },
        host, device::OwnPayload::kTrust);
  }

  mutable device::StatusWords status_;
#endif

  double tau_;
  uint32_t min_key_;
#if TERSE_COMPRESSOR_CUDA
  terse::kit::OneBlockCut one_block_;
#endif
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(Threshold, "threshold", "elements with |g| >= tau (required), values + sorted u32 indices",
                        "1.0.0");
