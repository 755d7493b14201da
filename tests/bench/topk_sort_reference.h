// The reference an exact GPU top-k is measured against (issue 9's target: top-k 1% of 64M floats >= 3x faster than
// this): a full cub::DeviceRadixSort::SortPairsDescending of (|g| key, index) pairs over the 31 key bits
// (terse/kit/topk_math.hpp's magnitudeKey), after which the first k pairs are the top k. The sort is stable, so equal
// keys keep index order and the first k are exactly the plugin's selection (ties to the lower index), which the
// benchmark checks after its timed loop. Everything is sized and allocated once (cub's two-phase temporary storage).
#pragma once

#include <cstdint>
#include <vector>

#include "core/common/device_buffer.h"

namespace terse::bench {

class TopKSortReference {
 public:
  // Allocates keys, indices and cub's temporary storage for `numel` (< 2^31) elements on `stream`'s device.
  TopKSortReference(uint64_t numel, cudaStream_t stream);

  // Queues the keys and indices of x and their sort on `stream`; does not wait.
  void run(const float* x, cudaStream_t stream);

  // After run: the indices of the k largest keys, sorted ascending (the payload's order). Synchronizes `stream`.
  std::vector<uint32_t> topIndices(uint64_t k, cudaStream_t stream) const;

 private:
  uint64_t numel_;
  cuda::DeviceBuffer keys_in_, keys_out_, indices_in_, indices_out_, temp_;
};

}  // namespace terse::bench
