#include "core/comm/allreduce_auto.h"

#include <algorithm>
#include <bit>
#include <span>

namespace terse::comm {
namespace {

// One row per world size: messages below `below` bytes use `algo`, the first matching band wins, the last band of a
// row (below = kAll) covers the rest. The bands are results/reference/collectives/auto_table.csv, which `study.py
// derive` reads off the study's 10 Gbps / 5 us runs: per size (4 KiB x 4^k) the fastest median of three runs, a lone
// size won by less than 10% merged into the faster neighbouring band (tests/comm: AutoRowsAreTheStudysDerivedBands
// holds this table to that file). On two ranks the ring is halving-doubling, so the row has no hd band.
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
constexpr Band kWorld4[] = {{64 * kKiB, kRd}, {4096 * kKiB, kHd}, {kAll, kRing}};
constexpr Band kWorld5[] = {{16 * kKiB, kRd}, {kAll, kRing}};
constexpr Band kWorld6[] = {{16 * kKiB, kRd}, {kAll, kRing}};
constexpr Band kWorld7[] = {{16 * kKiB, kRd}, {kAll, kRing}};
constexpr Band kWorld8[] = {{16 * kKiB, kRd}, {4096 * kKiB, kHd}, {kAll, kRing}};
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
    // Several nodes keep the 8-rank row: its recursive-doubling and halving-doubling bands are where a flat
    // exchange's few steps beat the hierarchical allreduce's three phases (halving-doubling halves nearest partner
    // first, so its large exchanges stay inside a node); the extrapolation past 8 ranks weighs halving-doubling
    // against a flat ring only.
    flat = measuredAllreduceChoice(nodes ? std::min(world, 8) : world, bytes);
  }
  // Several nodes: the hierarchical allreduce where the flat choice is the bandwidth-bound ring.
  return flat == kRing && nodes ? AllreduceAlgorithm::kHierarchical : flat;
}

}  // namespace terse::comm
