#include "core/comm/allgather_auto.h"

#include <bit>

namespace terse::comm {
namespace {

// Bytes of crossover per latency Bruck saves: alpha / gamma of allgather_auto.h, fitted on the simulated benches
// (results/reference/collectives/allgather.md).
constexpr uint64_t kBytesPerSavedLatency = 64 * 1024;

}  // namespace

uint64_t bruckCrossover(int world) noexcept {
  if (world <= 2) return 0;
  const auto n = static_cast<uint64_t>(world);
  const auto rounds = static_cast<uint64_t>(std::bit_width(n - 1));  // ceil(log2 n)
  return (n - 1 - rounds) * kBytesPerSavedLatency;
}

AllgatherAlgorithm flatAllgatherChoice(int world, uint64_t total_bytes) noexcept {
  return total_bytes < bruckCrossover(world) ? AllgatherAlgorithm::kBruck : AllgatherAlgorithm::kRing;
}

AllgatherAlgorithm allgatherChoice(int world, int ranks_per_node, uint64_t total_bytes) noexcept {
  if (ranks_per_node > 1 && world > ranks_per_node) return AllgatherAlgorithm::kHierarchical;
  return flatAllgatherChoice(world, total_bytes);
}

}  // namespace terse::comm
