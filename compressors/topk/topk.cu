// topk's kernels: the exact top-k of terse/kit/topk_select.hpp on the GPU, giving the host's payload byte for byte.
//
// The selection is a function of the input alone (topk.cc): every key above the k-th largest key `cut`, plus the first
// k - greater keys equal to it in index order, written in index order. terse/kit/topk_select_kernels.cuh finds that cut
// with the host's keys and digits (a three-round radix select whose state stays on the device) and compacts by it in
// index order (per-tile counts, a cub scan over the tiles, a block scan within each): five passes over the input (three
// histograms, count, write) plus small work, against the eight or so of a full radix sort of (key, index) pairs, which
// also moves twice the bytes per pass (tests/bench measures both).
//
// A non-finite input has the largest keys, so it is always selected and travels in the payload (the host refuses it at
// compress; the device would have to wait to know), and every decompress refuses the payload (topk.cc).
#include <cstddef>
#include <cstdint>

#include "terse/kit/device.cuh"
#include "terse/kit/sparse_kernels.cuh"
#include "terse/kit/sparse_payload.hpp"
#include "terse/kit/topk_select_kernels.cuh"
#include "terse/sdk/cuda.hpp"
#include "topk_cuda.h"

namespace terse::compressors::topk::cuda {

namespace tc = kit::topk::cuda;

uint64_t workspaceBytes(uint64_t numel, uint64_t k) {
  if (k == 0 || k >= numel) return 0;
  return tc::layoutFor(numel).total;
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
  const tc::Layout l = tc::layoutFor(numel);
  tc::radixSelect(x, numel, k, reinterpret_cast<tc::State*>(workspace), reinterpret_cast<uint32_t*>(workspace + l.hist),
                  st);
  tc::compactByCut(x, numel, k, l, workspace, values, indices, st);
}

void validate(const device::Prefix& expected, const std::byte* payload, uint64_t count, uint64_t numel,
              uint32_t* status, void* stream) {
  kit::sparse::launchValidateSparse<false>(expected, payload, count, numel, 0, status, stream);
}

void decode(const std::byte* payload, uint64_t count, uint64_t numel, float* out, bool accumulate, void* stream) {
  kit::sparse::launchScatter(payload, count, numel, out, accumulate, stream);
}

}  // namespace terse::compressors::topk::cuda
