// topk's kernels: the exact top-k of terse/kit/topk_select.hpp on the GPU, giving the host's payload byte for byte.
//
// The selection is a function of the input alone (topk.cc): every key above the k-th largest key `cut`, plus the first
// k - greater keys equal to it in index order, written in index order. terse/kit/topk_candidates.cuh's selectTopK
// finds that cut with the host's keys and digits and compacts by it in index order, as the host's selectTopK does:
// the top digit's histogram on the tensor, then, when the keys at or above its boundary bin fit the candidate buffer
// (normal data: about 1.2% of n at k = 1%), one DeviceSelect copies them out and everything else runs on those, so
// two passes over the input; otherwise (a crowded boundary bin) the remaining digits and the compaction run on the
// tensor, five passes. The state stays on the device, so compress never waits. A small tensor (oneBlockMaxNumel) is
// selected and decoded in one launch each instead (terse/kit/one_block.hpp). A full radix sort
// of (key, index) pairs moves far more (tests/bench measures both, and terse-bench-topk-cuda sweeps sizes and ratios).
//
// A non-finite input has the largest keys, so it is always selected and travels in the payload (the host refuses it at
// compress; the device would have to wait to know), and every decompress refuses the payload (topk.cc).
#include <cstddef>
#include <cstdint>

#include "terse/kit/device.cuh"
#include "terse/kit/sparse_kernels.cuh"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_candidates.cuh"
#include "terse/kit/topk_one_block.cuh"
#include "terse/sdk/cuda.hpp"
#include "topk_cuda.h"

namespace terse::compressors::topk::cuda {

namespace tc = kit::topk::cuda;

uint64_t workspaceBytes(uint64_t numel, uint64_t k) {
  if (k == 0 || k >= numel) return 0;
  return tc::topKLayoutFor(numel, k).total;
}

void compress(const device::Prefix& prefix, const float* x, uint64_t numel, uint64_t k, std::byte* workspace,
              std::byte* payload, void* stream) {
  const cudaStream_t st = device::streamOf(stream);
  device::writePrefix(prefix, payload, stream);
  if (k == 0) return;
  float* values = reinterpret_cast<float*>(payload + kit::sparse::kFixedBytes);
  uint32_t* indices = reinterpret_cast<uint32_t*>(payload + kit::sparse::kFixedBytes + sizeof(float) * k);
  if (k >= numel) {
    tc::takeAll(x, numel, values, indices, st);
    return;
  }
  tc::selectTopK(x, numel, k, tc::topKLayoutFor(numel, k), workspace, values, indices, st);
}

void compressOneBlock(const device::Prefix& prefix, const float* x, uint64_t numel, uint64_t k, std::byte* payload,
                      void* stream) {
  tc::selectOneBlock(prefix, x, numel, k, payload, device::streamOf(stream));
}

void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t* status, void* stream) {
  kit::sparse::launchValidateSparse<false>(expected, payload, count, numel, 0, status, stream);
}

void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream,
            const uint32_t* gate) {
  kit::sparse::launchScatter(payload, count, numel, out, accumulate, stream, gate);
}

void validateAndDecodeOneBlock(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
                               float* out, bool accumulate, uint32_t* status, void* stream) {
  kit::sparse::launchValidateAndScatterOneBlock<false>(expected, payload, count, numel, 0, out, accumulate, status,
                                                       stream);
}

}  // namespace terse::compressors::topk::cuda
