// The allgatherv algorithm `auto` picks, by world size, node size and gathered bytes (the same on every rank, since
// every rank knows every block's size before the call).
//
// The latency-bandwidth argument (alpha per message: the link latency plus the communicator's CPU work per message,
// about 25 us in the simulated benches of results/reference/collectives/README.md; beta per byte on the wire; gamma
// per byte copied in memory; T gathered bytes over n ranks):
//   ring   (n - 1) alpha + (n - 1)/n T beta
//   Bruck  ceil(log2 n) alpha + (n - 1)/n T beta + T gamma   (the same bytes; the final rotation copies T)
// so on a flat, single-port network Bruck wins below T* = ((n - 1) - ceil(log2 n)) alpha / gamma: the crossover grows
// with the latencies Bruck saves, and bruckCrossover(n) is that count times a byte figure fitted on the simulated
// benches (allgather_auto.cc says which). MPICH makes the same choice for short messages (Bruck below 80 KB in all
// for non-powers of two).
//
// On several nodes (ranks_per_node > 1 and a world larger than one node) a flat algorithm crosses every node's NIC
// with more than the T bytes each node needs: Bruck's partners at distances >= the node size are all off-node, so a
// node of G workers takes in about G T through its NIC, and the ring, which crosses it once per block, pays n - 1
// latencies. The hierarchical allgatherv (allgatherv_hierarchical.h) takes in T per node once, with the node-level
// phases on the fast intra-node links, and its leaders run the flat rule among themselves; auto picks it there.
// Measured (results/reference/collectives/allgather.md, 64 workers in nodes of 8): it wins from 64 KiB (10 Gbps NICs)
// or 1 MiB (100 Gbps) to 4 MiB, by up to 7x; flat Bruck is up to 1.7x faster below 16 KiB and the ring 5-15% faster
// at 16 MiB, bands this rule does not have yet.
#pragma once

#include <cstdint>

#include "core/comm/communicator.h"

namespace terse::comm {

// Below how many gathered bytes a flat world of `world` ranks takes Bruck instead of the ring (0 for 1 or 2 ranks:
// there both take one round).
uint64_t bruckCrossover(int world) noexcept;

// kRing or kBruck for a flat world.
AllgatherAlgorithm flatAllgatherChoice(int world, uint64_t total_bytes) noexcept;

// Never kAuto: kHierarchical on more than one node of ranks_per_node (> 1) ranks, the flat choice otherwise.
AllgatherAlgorithm allgatherChoice(int world, int ranks_per_node, uint64_t total_bytes) noexcept;

}  // namespace terse::comm
