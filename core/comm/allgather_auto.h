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
// Measured (results/reference/collectives/allgather.md: 16, 64 and 256 workers in nodes of 8, 10 and 100 Gbps NICs,
// 4 KiB to 16 MiB gathered): it is the fastest or within 7% of it in 34 of the 42 cells, and the flat bands that a
// 64-worker measurement suggested do not hold across world sizes, so auto has none. Flat Bruck beats it by 1.2-1.5x
// in scattered cells from 4 to 256 KiB at 16 and 64 workers (not at 16 KiB, where hierarchical wins everywhere), but
// at 256 workers only at 4 KiB on 10 Gbps (1.3x), and is 2.1x slower there on 100 Gbps; the ring wins at 4 and 16 MiB
// on two nodes of 100 Gbps (1.2x, 1.4x) and nowhere else (at 256 workers it is 20-70x slower at 16 MiB). The ring's
// band turns on the NIC's speed, which this rule does not see. The bench's simulated times include the communicator's
// measured CPU work per message (runtime.h), so a rerun moves them (the ring at 64 workers by up to 2x between the
// 64-worker study and this one); the cells where a flat algorithm wins are among those that moved.
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
