#include "core/comm/allreduce_auto.h"

#include <algorithm>
#include <bit>
#include <span>

namespace terse::comm {
namespace {

// One row per world size: messages below `below` bytes use `algo`, the first matching band wins, the last band of a
// row (below = kAll) covers the rest. Read off the study's 10 Gbps / 5 us table (results/reference/collectives/
// table.md, column `best`) at the sizes it ran (4 KiB x 4^k): each band is a run of sizes one algorithm won, where
// a winner by less than the small messages' noise (their times are mostly the ranks' measured CPU time per message)
// was merged into its neighbours' band. On two ranks the ring is halving-doubling, and both sum each pair once.
struct Band {
  uint64_t below;
  AllreduceAlgorithm algo;
};
constexpr uint64_t kAll = ~uint64_t{0};
constexpr uint64_t kKiB = 1024;
constexpr AllreduceAlgorithm kRd = AllreduceAlgorithm::kRecursiveDoubling;
constexpr AllreduceAlgorithm kHd = AllreduceAlgorithm::kHalvingDoubling;
constexpr AllreduceAlgorithm kRing = AllreduceAlgorithm::kRing;
constexpr Band kWorld2[] = {{256 * kKiB, kRd}, {kAll, kRing}};
constexpr Band kWorld3[] = {{kAll, kRing}};
constexpr Band kWorld4[] = {{256 * kKiB, kRd}, {kAll, kRing}};
constexpr Band kWorld5[] = {{256 * kKiB, kHd}, {kAll, kRing}};
constexpr Band kWorld6[] = {{64 * kKiB, kRd}, {256 * kKiB, kHd}, {kAll, kRing}};
constexpr Band kWorld7[] = {{64 * kKiB, kRd}, {256 * kKiB, kHd}, {kAll, kRing}};
constexpr Band kWorld8[] = {{1024 * kKiB, kHd}, {kAll, kRing}};
constexpr std::span<const Band> kTable[] = {kWorld2, kWorld3, kWorld4, kWorld5, kWorld6, kWorld7, kWorld8};

}  // namespace

uint64_t recursiveDoublingBelow(int world) noexcept {
  return world > 8 ? 16 * kKiB : 0;
}

uint64_t halvingDoublingCrossover(int world) noexcept {
  const auto n = static_cast<uint64_t>(world);
  const auto rounds = static_cast<uint64_t>(std::bit_width(n - 1));  // ceil(log2 n)
  return (uint64_t{1024} * kKiB) * (n - 1 - rounds) / 4;
}

AllreduceAlgorithm measuredAllreduceChoice(int world, uint64_t bytes) noexcept {
  if (world <= 1) return kRing;
  if (world > 8) {
    if (bytes < recursiveDoublingBelow(world)) return kRd;
    return bytes < halvingDoublingCrossover(world) ? kHd : kRing;
  }
  const std::span<const Band> row = kTable[static_cast<std::size_t>(world - 2)];
  for (const Band& b : row)
    if (bytes < b.below) return b.algo;
  return row.back().algo;
}

AllreduceAlgorithm autoAllreduceChoice(int world, int ranks_per_node, uint64_t bytes,
                                       uint64_t small_allreduce_bytes) noexcept {
  const bool nodes = ranks_per_node > 1 && world > ranks_per_node;
  AllreduceAlgorithm flat = kRing;
  if (small_allreduce_bytes != 0) {
    if (bytes < small_allreduce_bytes) flat = kRd;
  } else {
    // Several nodes keep the 8-rank row: its halving-doubling band is where a flat exchange beats the hierarchical
    // allreduce's three phases; the extrapolation past 8 ranks weighs halving-doubling against a flat ring only.
    flat = measuredAllreduceChoice(nodes ? std::min(world, 8) : world, bytes);
  }
  // Several nodes: the hierarchical allreduce where the flat choice is the bandwidth-bound ring.
  return flat == kRing && nodes ? AllreduceAlgorithm::kHierarchical : flat;
}

}  // namespace terse::comm
