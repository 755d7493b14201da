#include "core/comm/allreduce_auto.h"

#include <algorithm>
#include <array>

namespace terse::comm {
namespace {

// One row per world size: messages below `below` bytes use `algo`, the first matching entry wins; the last entry of a
// row covers everything above. The boundaries are the measured crossovers (allreduce_auto.h), rounded to the sizes
// the study ran (powers of 4 from 4 KiB).
struct Band {
  uint64_t below;
  AllreduceAlgorithm algo;
};
constexpr uint64_t kAll = ~uint64_t{0};
constexpr int kRows = 7;  // worlds 2..8
constexpr std::size_t kBands = 3;
constexpr AllreduceAlgorithm kRd = AllreduceAlgorithm::kRecursiveDoubling;
constexpr AllreduceAlgorithm kHd = AllreduceAlgorithm::kHalvingDoubling;
constexpr AllreduceAlgorithm kRing = AllreduceAlgorithm::kRing;
constexpr std::array<std::array<Band, kBands>, kRows> kTable = {{
    /* 2 */ {{{kAll, kRd}, {kAll, kRd}, {kAll, kRd}}},
    /* 3 */ {{{64 << 10, kRd}, {kAll, kRing}, {kAll, kRing}}},
    /* 4 */ {{{64 << 10, kRd}, {kAll, kHd}, {kAll, kHd}}},
    /* 5 */ {{{64 << 10, kRd}, {kAll, kRing}, {kAll, kRing}}},
    /* 6 */ {{{64 << 10, kRd}, {kAll, kRing}, {kAll, kRing}}},
    /* 7 */ {{{64 << 10, kRd}, {kAll, kRing}, {kAll, kRing}}},
    /* 8 */ {{{64 << 10, kRd}, {16 << 20, kHd}, {kAll, kRing}}},
}};

}  // namespace

AllreduceAlgorithm measuredAllreduceChoice(int world, uint64_t bytes) noexcept {
  if (world <= 1) return kRing;
  const auto& row = kTable[static_cast<std::size_t>(std::min(world, kRows + 1) - 2)];
  for (const Band& b : row)
    if (bytes < b.below) return b.algo;
  return row.back().algo;
}

}  // namespace terse::comm
