// dgc: the gradient sparsification of Deep Gradient Compression.
//
// Paper: Lin, Han, Mao, Wang and Dally, "Deep Gradient Compression: Reducing the Communication Bandwidth for
// Distributed Training", ICLR 2018. Algorithm 1 line 7-8: thr <- s% of |G|, Mask <- |G| > thr; section 3.1: "we use
// top-k selection ... sampling to reduce the top-k selection time: only 0.1% to 1% of the gradients are sampled, and
// top-k selection is performed on the samples to estimate the threshold for the entire population". This plugin is
// that selection: the k of |g| estimated from a Philox-chosen sample, refined over a bounded number of counting passes
// until the selected count lies in [0.8k, 1.3k], with an exact top-k as the last resort that guarantees the band
// (dgc_select.h has the algorithm). Ties at the threshold go to the lower index.
//
// NOT here, by design: momentum correction, momentum factor masking and local gradient accumulation (DGC sections
// 3.1-3.2) are the core's momentum correction and error feedback decorators (core/compress/momentum_correction.h),
// which wrap any compressor; gradient clipping and warm-up training (sections 3.3-3.4) belong to the trainer.
//
// k = min(numel, max(1, round(ratio * numel))) for numel > 0, 0 for numel = 0 (compressors/topk/topk_math.h).
// Payload (compressors/topk/sparse_payload.h), ALLGATHER, variable size (count depends on the data):
//     header (16 B, magic "DGCS", version 1) | u64 count | f32 values[count] | u32 indices[count] (strictly increasing)
//     with count in [ceil(0.8k), floor(1.3k)], which decompress enforces: 24 + 8 count <= 24 + 8 floor(1.3k) bytes.
//
// Parameters: ratio in (0, 1] (default 0.01); sample_ratio in (0, 1] (default 0.01; at least 1024 samples, and a
// tensor no larger than its sample is selected exactly); max_passes in [1, 32] (default 4): counting passes before
// the exact fallback. Workspace: a 128 KiB histogram and the sample's keys (4 bytes each); no state. The seed is this
// rank's own (no TERSE_CAP_SHARED_SEED): every rank samples independently. f32 gradients in host memory, fewer than
// 2^32 elements. A non-finite gradient element fails compress with InvalidArgument.
#include <cstdint>
#include <string>

#include "compressors/dgc/dgc_math.h"
#include "compressors/dgc/dgc_select.h"
#include "compressors/topk/sparse_payload.h"
#include "compressors/topk/topk_math.h"
#include "compressors/topk/topk_select.h"
#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;
namespace sparse = terse::compressors::sparse;
namespace tk = terse::compressors::topk;
namespace dg = terse::compressors::dgc;

constexpr const char* kName = "dgc";
constexpr sdk::PayloadFormat kFormat{kName, sdk::fourcc("DGCS"), 1};

class Dgc final : public sdk::Compressor {
 public:
  Dgc(sdk::Params& params, sdk::Host& /*host*/)
      : ratio_(params.getDouble("ratio", 0.01, sdk::Range::openClosed(0, 1))),
        sample_ratio_(params.getDouble("sample_ratio", 0.01, sdk::Range::openClosed(0, 1))),
        max_passes_(static_cast<int>(params.getInt("max_passes", 4, sdk::Range::closed(1, 32)))) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    sparse::requireF32(kName, dtype);
    terse_compressor_caps_v1 caps{};
    caps.devices = TERSE_DEVICE_HOST;
    caps.aggregation = TERSE_AGG_ALLGATHER;
    caps.flags = 0;  // variable size
    caps.num_rounds = 1;
    return caps;
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    check(info);
    const uint64_t k = tk::targetCount(ratio_, info.numel);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = sparse::payloadBytes(dg::maxCount(k));
    sizes.workspace_bytes = workspaceBytes(info.numel, k);
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    check(args.info);
    const std::span<const float> g = args.input<float>();
    const uint64_t n = g.size();
    const uint64_t k = tk::targetCount(ratio_, n);
    if (k == 0) {
      sparse::writeSparse(args.output, kFormat, args.info, 0);
      return sparse::payloadBytes(0);
    }
    const uint64_t need = workspaceBytes(n, k);
    if (args.workspace.size() < need) {
      throw sdk::InvalidArgument("workspace of " + std::to_string(args.workspace.size()) +
                                 " bytes, sizes() asked for " + std::to_string(need));
    }
    tk::SelectScratch select{};
    std::span<uint32_t> sample;
    if (need > 0) {
      select = tk::SelectScratch::carve(args.workspace.data(), 0);
      if (dg::samples(sample_ratio_, n)) {
        sample = {reinterpret_cast<uint32_t*>(args.workspace.data() + tk::kHistogramBytes),
                  static_cast<size_t>(dg::sampleCount(sample_ratio_, n))};
      }
    }
    const sdk::PhiloxStream stream(args.info.seed, args.info.step, args.info.tensor_id);
    const dg::Plan p = dg::plan(g, k, sample_ratio_, max_passes_, stream, sample, select.hist);
    bool nonfinite = p.nonfinite;
    if (!nonfinite) {
      const sparse::SparseSections out = sparse::writeSparse(args.output, kFormat, args.info, p.count);
      if (p.exact) {
        nonfinite = tk::selectTopK(g, k, select, out.values.data(), out.indices.data());
      } else {
        const float* data = g.data();
        nonfinite = tk::compactByCut(
            g.size(), [data](size_t i) { return data[i]; }, [](size_t i) { return static_cast<uint32_t>(i); }, p.cut,
            p.count, out.values.data(), out.indices.data());
      }
    }
    if (nonfinite) throw sdk::InvalidArgument("the gradient holds a non-finite value (inf or NaN); dgc would send it");
    return sparse::payloadBytes(p.count);
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    check(args.info);
    const uint64_t k = tk::targetCount(ratio_, args.info.numel);
    const sparse::SparseView v = sparse::readSparse(args.payload, kFormat, args.info, dg::minCount(k), dg::maxCount(k));
    sparse::scatter(v, args.output<float>(), args.accumulate);
  }

 private:
  static void check(const terse_tensor_info_v1& info) {
    sparse::requireF32(kName, info.dtype);
    sparse::requireHost(kName, info.device);
    sparse::requireIndexable(kName, info.numel);
  }

  // The histogram (sample threshold and exact fallback; the fallback runs on the full tensor, no candidate buffer) and
  // the sample's keys.
  uint64_t workspaceBytes(uint64_t numel, uint64_t k) const {
    if (k == 0 || k >= numel) return 0;  // everything is sent, nothing to select
    const uint64_t sample = dg::samples(sample_ratio_, numel) ? dg::sampleCount(sample_ratio_, numel) : 0;
    return tk::selectWorkspaceBytes(0) + sizeof(uint32_t) * sample;
  }

  double ratio_;
  double sample_ratio_;
  int max_passes_;
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(Dgc, "dgc",
                        "DGC sampled-threshold top-k (ratio, sample_ratio, max_passes), count in [0.8k, 1.3k], "
                        "values + sorted u32 indices",
                        "1.0.0");
