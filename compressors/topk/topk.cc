// topk: exact top-k sparsification by magnitude.
//
// Paper: Aji and Heafield, "Sparse Communication for Distributed Gradient Descent", EMNLP 2017 (gradient dropping);
// analysed with error feedback by Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory", NeurIPS 2018, whose
// operator is
//     top_k(g)_i = g_i  if |g_i| is among the k largest of |g|,  0 otherwise            (Stich et al., Definition 2.1)
// Error feedback (the residual g - top_k(g) carried to the next step) is the core's decorator, not part of this plugin.
//
// k = min(numel, max(1, round(ratio * numel))) for numel > 0 (round half up; see terse/kit/topk_math.hpp), 0 for
// numel = 0. Ties at the k-th magnitude go to the lower index, so the selection is a function of the input alone, and a
// payload always holds exactly k entries: the size is fixed (TERSE_CAP_FIXED_SIZE), which lets the core size the
// allgather once.
//
// Selection: radix select over the bits of |g| (terse/kit/topk_select.hpp): a histogram pass, a branch-free copy of the
// few candidates, and the rest on the candidates; several times faster than std::nth_element (16M floats at 1%, one
// core: about 8x on normal data).
//
// Payload (terse/kit/sparse_payload.hpp), ALLGATHER (every rank sends different indices; the core decompresses each
// with accumulate = 1):
//     header (16 B, magic "TOPK", version 1) | u64 count = k | f32 values[k] | u32 indices[k] (strictly increasing)
//     = 24 + 8k bytes.
//
// Parameters: ratio in (0, 1], default 0.01.
// Workspace: a 128 KiB histogram and a candidate buffer of min(n, 2k + n/64 + 4096) 8-byte entries; no state.
// f32 gradients in host memory, fewer than 2^32 elements. A non-finite gradient element fails compress with
// InvalidArgument (such elements have the largest magnitudes, so top-k always meets them): a diverged step should stop
// the run, not travel the network as values every decompress must reject.
//
// CUDA (topk.cu, when built with CUDA): device tensors give the host's payload byte for byte (the same keys, digits,
// tie rule and candidate buffer; a radix select whose state stays on the device, the candidates copied out by a cub
// DeviceSelect when they fit, then a tile-scanned compaction in index order). Workspace on the device: the select's
// state and histogram, two u64 per tile of 4096 elements, cub's scan and select storage and the candidate buffer of
// min(n, 2k + n/64 + 4096) 8-byte entries (topk_cuda.h sizes it). A tensor of at most 2^16 elements (terse/kit/
// one_block.hpp; TERSE_SPARSE_ONE_BLOCK_MAX moves the cut, 0 turns it off) is selected by one block in one launch and
// decoded by one block in one launch, with no workspace (terse/kit/topk_one_block.cuh): the same payload, where the
// grid-wide way makes 18 launches a compress and 3 a decompress. Two differences, both for the sake of not
// waiting on the stream: compress does not refuse a non-finite gradient (it would have to read the selection back); the
// payload then carries it, and every decompress of it, the sender's own error feedback included, refuses it as
// InvalidPayload. And decompress synchronizes `stream` once, to learn the validation verdict (terse/kit/device.hpp).
#include <cstdint>
#include <string>

#include "terse/kit/device.hpp"
#include "terse/kit/one_block.hpp"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_math.hpp"
#include "terse/kit/topk_select.hpp"
#include "terse/sdk.hpp"
#include "topk_cuda.h"

namespace {

namespace sdk = terse::sdk;
namespace sparse = terse::kit::sparse;
namespace tk = terse::kit::topk;
namespace device = terse::kit::device;
namespace kernels = terse::compressors::topk::cuda;

constexpr const char* kName = "topk";
constexpr sdk::PayloadFormat kFormat{kName, sdk::fourcc("TOPK"), 1};

class TopK final : public sdk::Compressor {
 public:
  TopK(sdk::Params& params, sdk::Host& /*host*/)
      : ratio_(params.getDouble("ratio", 0.01, sdk::Range::openClosed(0, 1))) {}

  terse_compressor_caps_v1 caps(terse_dtype_v1 dtype) const override {
    sparse::requireF32(kName, dtype);
    return sdk::Caps::allgather(TERSE_CAP_FIXED_SIZE, device::kDevices);
  }

  terse_compressor_sizes_v1 sizes(const terse_tensor_info_v1& info) const override {
    check(info);
    const uint64_t k = tk::targetCount(ratio_, info.numel);
    terse_compressor_sizes_v1 sizes{};
    sizes.max_output_bytes = sparse::payloadBytes(k);
#if TERSE_COMPRESSOR_CUDA
    if (info.device == TERSE_DEVICE_CUDA) {
      const device::Scope scope(info);
      // A tensor selected in one block (terse/kit/one_block.hpp) needs none.
      sizes.workspace_bytes = one_block_.covers(info.numel) ? 0 : kernels::workspaceBytes(info.numel, k);
      return sizes;
    }
#endif
    sizes.workspace_bytes = workspaceBytes(info.numel, k);
    return sizes;
  }

  uint64_t compress(const sdk::CompressArgs& args) const override {
    check(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return compressDevice(args);
#endif
    const std::span<const float> g = args.input<float>();
    const uint64_t k = tk::targetCount(ratio_, g.size());
    const sparse::SparseSections out = sparse::writeSparse(args.output, kFormat, args.info, k);
    if (k == 0) return sparse::payloadBytes(0);
    const uint64_t need = workspaceBytes(g.size(), k);
    requireWorkspace(args, need);
    tk::SelectScratch scratch{};  // unused when k == numel (everything is sent)
    if (need > 0) scratch = tk::SelectScratch::carve(args.workspace.data(), tk::candidateCapacity(g.size(), k));
    if (tk::selectTopK(g, k, scratch, out.values.data(), out.indices.data())) {
      throw sdk::InvalidArgument("the gradient holds a non-finite value (inf or NaN); top-k would send it");
    }
    return sparse::payloadBytes(k);
  }

  void decompress(const sdk::DecompressArgs& args) const override {
    check(args.info);
#if TERSE_COMPRESSOR_CUDA
    if (args.info.device == TERSE_DEVICE_CUDA) return decompressDevice(args);
#endif
    const uint64_t k = tk::targetCount(ratio_, args.info.numel);
    const sparse::SparseView v = sparse::readSparse(args.payload, kFormat, args.info, k, k);
    sparse::scatter(v, args.output<float>(), args.accumulate);
  }

 private:
  static void check(const terse_tensor_info_v1& info) {
    sparse::requireF32(kName, info.dtype);
    sparse::requireDevice(kName, info.device, device::kDevices);
    sparse::requireIndexable(kName, info.numel);
  }

  static uint64_t workspaceBytes(uint64_t numel, uint64_t k) {
    if (k == 0 || k >= numel) return 0;  // nothing to select: every element (or none) is sent
    return tk::selectWorkspaceBytes(tk::candidateCapacity(numel, k));
  }

  static void requireWorkspace(const sdk::CompressArgs& args, uint64_t need) {
    if (args.workspace.size() < need) {
      throw sdk::InvalidArgument("workspace of " + std::to_string(args.workspace.size()) +
                                 " bytes, sizes() asked for " + std::to_string(need));
    }
  }

#if TERSE_COMPRESSOR_CUDA
  // The header and the count: everything before the values, as sparse::writeSparse writes them.
  static device::Prefix prefix(const terse_tensor_info_v1& info, uint64_t k) {
    return device::makePrefix([&](sdk::ByteWriter& w) {
      sdk::writeHeader(w, kFormat, info);
      w.put(k);
    });
  }

  uint64_t compressDevice(const sdk::CompressArgs& args) const {
    const uint64_t k = tk::targetCount(ratio_, args.info.numel);
    device::requireCapacity(args.output, sparse::payloadBytes(k), kName);
    const device::Scope scope(args.info);
    if (one_block_.covers(args.info.numel)) {
      kernels::compressOneBlock(prefix(args.info, k), args.input<float>().data(), args.info.numel, k,
                                args.output.data(), args.stream);
      return sparse::payloadBytes(k);
    }
    requireWorkspace(args, kernels::workspaceBytes(args.info.numel, k));
    kernels::compress(prefix(args.info, k), args.input<float>().data(), args.info.numel, k, args.workspace.data(),
                      args.output.data(), args.stream);
    return sparse::payloadBytes(k);
  }

  void decompressDevice(const sdk::DecompressArgs& args) const {
    const uint64_t k = tk::targetCount(ratio_, args.info.numel);
    if (one_block_.covers(args.info.numel)) {  // the kernel validates before it writes: one call does both
      device::checkedDecompress(
          args, status_, args.payload.size() == sparse::payloadBytes(k),
          [&](uint32_t* status) {
            kernels::validateAndDecodeOneBlock(prefix(args.info, k), args.payload.data(), k, args.info.numel,
                                               args.output<float>().data(), args.accumulate, status, args.stream);
          },
          [this](const sdk::DecompressArgs& host) { decompress(host); });
      return;
    }
    device::checkedDecompress(
        args, status_, args.payload.size() == sparse::payloadBytes(k),
        [&](uint32_t* status) {
          kernels::validate(prefix(args.info, k), args.payload.data(), k, args.info.numel, status, args.stream);
        },
        [&](const uint32_t* gate) {
          kernels::decode(args.payload.data(), k, args.info.numel, args.output<float>().data(), args.accumulate,
                          args.stream, gate);
        },
        [this](const sdk::DecompressArgs& host) { decompress(host); });
  }

  mutable device::StatusWords status_;
#endif

  double ratio_;
#if TERSE_COMPRESSOR_CUDA
  terse::kit::OneBlockCut one_block_;
#endif
};

}  // namespace

TERSE_EXPORT_COMPRESSOR(TopK, "topk", "exact top-k by magnitude (ratio), values + sorted u32 indices, allgather",
                        "1.0.0");
