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
// which wrap any compressor; gradient clipping (section 3.3) is the trainer's (optimizer.clip_grad_norm).
//
// Warm-up training (section 3.4) is here: with warmup_steps > 0 the ratio starts less aggressive and falls
// exponentially, in warmup_stages stages of equal length, to `ratio` at step warmup_steps (dgc_math.h, warmupRatios:
// stage s keeps ratio^((s + 1) / (warmup_stages + 1)); the paper's 25%, 6.25%, 1.56%, 0.4% and then 0.1% over its
// first four epochs is ratio 0.001, warmup_stages 4 and warmup_steps four epochs' steps). It lives in the plugin, not
// as pipelines per stage, so that error feedback's residual and momentum correction's velocity carry across the
// stages as they do in the paper: only k changes, by the step every call carries. A decompress checks the count
// against the band of its own step's k. The stages' first steps and the warm-up's end are the plugin's phases
// (phaseSteps, terse/phases_v1.h), so a CALIBRATED simulation times a step of each stage and charges each step its
// own stage's time. What to know before using it:
//   - The payload and workspace bounds are the first stage's (sizes cannot depend on the step): the buffers, the
//     allgather's receive buffers (world x the bound) and what a fusion or priority scheduler groups by (the pipeline's
//     maximum payload) are the densest stage's all run long, so after the warm-up a run groups its tensors as a run
//     without one would not. At the default ratio 0.01 four stages start at 39.8% kept, whose bound (8 B x 1.3 x
//     0.398, 4.1 B an element) outweighs the dense f32 tensor; the paper's schedule is for ratio 0.001 (25.1%).
//   - `step` is the caller's: natively the run's step from 0 (a dense warm-up's steps, compression_start_step,
//     included: the runner warns when they cover the whole ramp), in the PyTorch hook its backward passes (under
//     terse.torch.LocalSGD, its averagings), counted from 0 again by a new hook state, a restarted job's too.
//
// k = min(numel, max(1, round(ratio * numel))) for numel > 0, 0 for numel = 0 (terse/kit/topk_math.hpp).
// Payload (terse/kit/sparse_payload.hpp), ALLGATHER, variable size (count depends on the data):
//     header (16 B, magic "DGCS", version 1) | u64 count | f32 values[count] | u32 indices[count] (strictly increasing)
//     with count in [ceil(0.8k), floor(1.3k)], which decompress enforces: 24 + 8 count <= 24 + 8 floor(1.3k) bytes.
//
// Parameters: ratio in (0, 1] (default 0.01); sample_ratio in (0, 1] (default 0.01; at least 1024 samples, and a
// tensor no larger than its sample is selected exactly); max_passes in [1, 32] (default 4): counting passes before
// the exact fallback; warmup_steps in [0, 2^40] (default 0: no warm-up) and warmup_stages in [1, 32], at most
// warmup_steps (default 4, the paper's, or warmup_steps when fewer; refused without warmup_steps): the warm-up above,
// k taken from the step's ratio wherever k appears here. Workspace: a 128 KiB histogram
// and the sample's keys (4 bytes each); no state. The seed is this rank's own (no TERSE_CAP_SHARED_SEED): every rank
// samples independently. f32 gradients, fewer than 2^32 elements. A non-finite gradient element fails compress with
// InvalidArgument.
//
// CUDA (dgc.cu, when built with CUDA): device tensors give the host's payload byte for byte: the same Philox sample,
// the same thresholds (the plan's decisions run on the host from counts the device reads back, with dgc_math.h's
// functions), and topk's device radix select and compaction (terse/kit/topk_select_kernels.cuh) for the sample's
// threshold, the exact fallback and the output. Compress synchronizes `stream` once per counting pass (usually one),
// as a variable-size compressor must to report its output bytes, and so refuses a non-finite gradient as the host does.
// Workspace on the device: topk's select workspace (state, histogram, two u64 per tile of 4096 elements, cub's scan
// storage), the pass counts and the sample's values (4 bytes each). Decompress takes the count from the payload's size
// (sparse::countForSize) and synchronizes once, to learn the validation verdict (terse/kit/device.hpp). A tensor of at
// most terse/kit/one_block.hpp's cut (2^16 elements) is decoded in one launch of one block, and, where its selection is
// exact from the start (not sampled: at most 1,024 elements by default), selected in one launch too, no workspace.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dgc_cuda.h"
#include "dgc_math.h"
#include "dgc_select.h"
#include "terse/kit/device.hpp"
#include "terse/kit/one_block.hpp"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_select.hpp"
#include "terse/sdk.hpp"

namespace {

namespace sdk = terse::sdk;
namespace sparse = terse::kit::sparse;
namespace tk = terse::kit::topk;
namespace dg = terse::compressors::dgc;
namespace device = terse::kit::device;

constexpr const char* kName = "dgc";
constexpr sdk::PayloadFormat kFormat{kName, sdk::fourcc("DGCS"), 1};

class Dgc final : public sdk::Compressor {
 public:
  Dgc(sdk::Params& params, sdk::Host& /*host*/)
      : ratio_(params.getDouble("ratio", 0.01, sdk::Range::openClosed(0, 1))),
        sample_ratio_(params.getDouble("sample_ratio", 0.01, sdk::Range::openClosed(0, 1))),
        max_passes_(static_cast<int>(params.getInt("max_passes", 4, sdk::Range::closed(1, 32)))),
        warmup_steps_(params.getUint("warmup_steps", 0, sdk::Range::closed(0, kMaxWarmupSteps))),
        warmup_ratios_(warmupRatios(params, ratio_, warmup_steps_)) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    sparse::requireF32(kName, dtype);
    return sdk::Caps::allgather(/*flags=*/0, device::kDevices);  // variable size
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    check(info);
    // The largest over the steps' k: the warm-up's first stage, its densest, else `ratio`'s (the only one).
    terse_compressor_sizes_v1 sizes{};
    for (const uint64_t k : distinctCounts(info.numel)) {
      sizes.max_output_bytes = std::max(sizes.max_output_bytes, sparse::payloadBytes(dg::maxCount(k)));
#if TERSE_COMPRESSOR_CUDA
      if (info.device == TERSE_DEVICE_CUDA) {
        const device::Scope scope(info);
        if (!oneBlock(info.numel, k)) {
          sizes.workspace_bytes = std::max<uint64_t>(sizes.workspace_bytes,
                                                     dg::cuda::workspaceBytes(info.numel, k, sampleSize(info.numel)));
        }
        continue;
      }
#endif
      sizes.workspace_bytes = std::max(sizes.workspace_bytes, workspaceBytes(info.numel, k));
    }
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    check(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    const std::span<const float> g = args.input<float>();
    const uint64_t n = g.size();
    const uint64_t k = targetCount(args.info.step, n);
    if (k == 0) {
      sparse::writeSparse(args.output, kFormat, args.info, 0);
      return sparse::payloadBytes(0);
    }
    const uint64_t need = workspaceBytes(n, k);
    requireWorkspace(args, need);
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
    if (nonfinite) refuseNonFinite();
    return sparse::payloadBytes(p.count);
  }

  // The warm-up's stage boundaries and its end (terse/phases_v1.h): where k changes, so that a CALIBRATED simulation
  // times a step of each stage.
  std::vector<uint64_t> phaseSteps() const override {
    // Stage s's first step is ceil(s x warmup_steps / stages) (dgc_math.h, warmupStage), and s = stages is the end.
    // warmup_stages <= warmup_steps, so every stage has a step and the steps strictly increase.
    std::vector<uint64_t> steps;
    const auto stages = static_cast<uint64_t>(warmup_ratios_.size());
    for (uint64_t s = 1; s <= stages; ++s) steps.push_back((s * warmup_steps_ + stages - 1) / stages);
    return steps;
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    check(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    const uint64_t k = targetCount(args.info.step, args.info.numel);
    const sparse::SparseView v = sparse::readSparse(args.payload, kFormat, args.info, dg::minCount(k), dg::maxCount(k));
    sparse::scatter(v, args.output<float>(), args.accumulate);
  }

 private:
  static void check(const terse_tensor_info_v1& info) {
    sparse::requireF32(kName, info.dtype);
    sparse::requireDevice(kName, info.device, device::kDevices);
    sparse::requireIndexable(kName, info.numel);
  }

  // warmup_steps' bound: 2^40 steps, so that step x warmup_stages (dgc_math.h, warmupStage) cannot overflow.
  static constexpr uint64_t kMaxWarmupSteps = uint64_t{1} << 40;

  // The warm-up's stage ratios (empty without a warm-up). warmup_stages without warmup_steps would be a ramp that
  // never runs: refused by name.
  static std::vector<double> warmupRatios(sdk::Params& params, double ratio, uint64_t warmup_steps) {
    if (warmup_steps == 0) {
      // has() counts as reading the key, so a plugin without a warm-up reports no warmup_stages among its resolved
      // parameters (which `plugins show` offers back as settable).
      if (params.has("warmup_stages")) {
        throw sdk::InvalidArgument(
            "'warmup_stages' is set but 'warmup_steps' is 0: set warmup_steps to the "
            "warm-up's length in steps, or drop warmup_stages");
      }
      return {};
    }
    // The paper's four stages, or one a step for a shorter warm-up; more stages than steps would leave a stage empty.
    const auto fit = static_cast<int64_t>(std::min<uint64_t>(4, warmup_steps));
    const int stages = static_cast<int>(params.getInt("warmup_stages", fit, sdk::Range::closed(1, 32)));
    if (static_cast<uint64_t>(stages) > warmup_steps) {
      throw sdk::InvalidArgument("'warmup_stages' " + std::to_string(stages) + " is above 'warmup_steps' " +
                                 std::to_string(warmup_steps) + ": a stage would have no step");
    }
    return dg::warmupRatios(ratio, stages);
  }

  // The ratio at `step`: its warm-up stage's, or `ratio` from step warmup_steps on.
  double ratioAt(uint64_t step) const {
    if (step >= warmup_steps_) return ratio_;
    const auto stages = static_cast<int>(warmup_ratios_.size());
    return warmup_ratios_[static_cast<size_t>(dg::warmupStage(step, warmup_steps_, stages))];
  }

  // k at `step` for a tensor of numel elements.
  uint64_t targetCount(uint64_t step, uint64_t numel) const {
    return tk::targetCount(ratioAt(step), numel);
  }

  // Every k a step of this tensor may take: `ratio`'s and each warm-up stage's.
  std::vector<uint64_t> distinctCounts(uint64_t numel) const {
    std::vector<uint64_t> ks{tk::targetCount(ratio_, numel)};
    for (const double r : warmup_ratios_) ks.push_back(tk::targetCount(r, numel));
    return ks;
  }

  // The sample's size, 0 when the tensor is not sampled (exact top-k from the start).
  uint64_t sampleSize(uint64_t numel) const {
    return dg::samples(sample_ratio_, numel) ? dg::sampleCount(sample_ratio_, numel) : 0;
  }

  // The histogram (sample threshold and exact fallback; the fallback runs on the full tensor, no candidate buffer) and
  // the sample's keys.
  uint64_t workspaceBytes(uint64_t numel, uint64_t k) const {
    if (k == 0 || k >= numel) return 0;  // everything is sent, nothing to select
    return tk::selectWorkspaceBytes(0) + sizeof(uint32_t) * sampleSize(numel);
  }

  static void requireWorkspace(const sdk::CompressArgs& args, uint64_t need) {
    if (args.workspace.size() < need) {
      throw sdk::InvalidArgument("workspace of " + std::to_string(args.workspace.size()) +
                                 " bytes, sizes() asked for " + std::to_string(need));
    }
  }

  [[noreturn]] static void refuseNonFinite() {
    throw sdk::InvalidArgument("the gradient holds a non-finite value (inf or NaN); dgc would send it");
  }

#if TERSE_COMPRESSOR_CUDA
  // The header and the count: everything before the values, as sparse::writeSparse writes them.
  static device::Prefix prefix(const terse_tensor_info_v1& info, uint64_t count) {
    return device::makePrefix([&](sdk::ByteWriter& w) {
      sdk::writeHeader(w, kFormat, info);
      w.put(count);
    });
  }

  // Whether a tensor's selection runs in one block, in one launch (terse/kit/one_block.hpp): an exact one from the
  // start (not sampled, or everything sent) of a small tensor. The sampled plan decides on the host between passes.
  bool oneBlock(uint64_t n, uint64_t k) const {
    return one_block_.covers(n) && k > 0 && (k >= n || sampleSize(n) == 0);
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const uint64_t n = args.info.numel;
    const uint64_t k = targetCount(args.info.step, n);
    const device::Scope scope(args.info);
    if (k == 0) {
      device::requireCapacity(args.output, sparse::payloadBytes(0), kName);
      device::writePrefix(prefix(args.info, 0), args.output.data(), args.stream);
      return sparse::payloadBytes(0);
    }
    const float* x = args.input<float>().data();
    if (oneBlock(n, k)) {
      device::requireCapacity(args.output, sparse::payloadBytes(k), kName);
      const auto nonfinite = status_.acquire();
      nonfinite.clear();
      dg::cuda::selectOneBlock(prefix(args.info, k), x, n, k, nonfinite.device(), args.output.data(), args.stream);
      device::synchronize(args.stream);  // as the plan's counting pass does, for the host's refusal
      if (nonfinite.raised()) refuseNonFinite();
      return sparse::payloadBytes(k);
    }
    const dg::cuda::Shape shape{n, k, sampleSize(n), max_passes_};
    requireWorkspace(args, dg::cuda::workspaceBytes(n, k, shape.s));
    const dg::cuda::Plan p =
        dg::cuda::plan(x, shape, sdk::PhiloxStream(args.info.seed, args.info.step, args.info.tensor_id),
                       args.workspace.data(), args.stream);
    if (p.nonfinite) refuseNonFinite();
    device::requireCapacity(args.output, sparse::payloadBytes(p.count), kName);
    dg::cuda::write(prefix(args.info, p.count), x, shape, p, args.workspace.data(), args.output.data(), args.stream);
    return sparse::payloadBytes(p.count);
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    const uint64_t numel = args.info.numel;
    const uint64_t k = targetCount(args.info.step, numel);
    const device::Scope scope(args.info);
    // The count is the one the payload's size implies (sparse::countForSize); the validation checks the count field
    // against it with the rest of the prefix, so a payload the host would refuse is refused here too, without a
    // synchronization to read the field first.
    uint64_t count = 0;
    const bool size_ok = sparse::countForSize(args.payload.size(), &count) && count <= numel &&
                         count >= dg::minCount(k) && count <= dg::maxCount(k);
    if (one_block_.covers(numel)) {  // the kernel validates before it writes: one call does both
      device::checkedDecompress(
          args, status_, size_ok,
          [&](uint32_t* status) {
            dg::cuda::validateAndDecodeOneBlock(prefix(args.info, count), args.payload.data(), count, numel,
                                                args.output<float>().data(), args.accumulate, status, args.stream);
          },
          [this](const sdk::DecompressArgs& host) { decompress(host); }, device::OwnPayload::kTrust);
      return;
    }
    device::checkedDecompress(
        args, status_, size_ok,
        [&](uint32_t* status) {
          dg::cuda::validate(prefix(args.info, count), args.payload.data(), count, numel, status, args.stream);
        },
        [&](const uint32_t* gate) {
          dg::cuda::decode(args.payload.data(), count, numel, args.output<float>().data(), args.accumulate, args.stream,
                           gate);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); }, device::OwnPayload::kTrust);
  }

  mutable device::StatusWords status_;
#endif

  double ratio_;
  double sample_ratio_;
  int max_passes_;
  uint64_t warmup_steps_;
  std::vector<double> warmup_ratios_;  // the warm-up's stages, largest first; empty without one
#if TERSE_COMPRESSOR_CUDA
  terse::kit::OneBlockCut one_block_;
#endif
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(Dgc, "dgc",
                        "DGC sampled-threshold top-k (ratio, sample_ratio, max_passes, warmup_steps, warmup_stages), "
                        "count in [0.8k, 1.3k], "
                        "values + sorted u32 indices",
                        "1.0.0");
