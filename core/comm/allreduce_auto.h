// The allreduce algorithm `auto` picks for a flat world, by world size and message size, from a measured table.
//
// How the table was made: results/reference/collectives/study.py runs `terse bench allreduce --clock simulated`
// (SimGrid, so host CPU contention does not enter the times) for every algorithm, 2..8 ranks and 4 KiB..64 MiB, on
// single-port links of 10 Gbps / 5 us (per-pair wires with per-rank NIC egress and ingress caps of the same bandwidth),
// three times; `study.py derive` keeps, for each world size, the size range each algorithm was fastest in
// (auto_table.csv there, which allreduce_auto.cc must match; README.md there has the measurements). It is a property
// of that network and of the communicator's CPU cost per message when it was run: on another network, name the
// algorithm (config `collectives.allreduce`, `--algo`) or rerun the study.
//
// Beyond 8 ranks (no row: the study stops there, a simulated world does not) halving-doubling is picked below
// halvingDoublingCrossover(n) and the ring above. In the latency-bandwidth model both move 2 (n-1)/n of the message
// per rank, and halving-doubling saves ((n - 1) - ceil(log2 n)) latencies over the ring; what the ring wins back at
// large messages grows with the message. So the crossover is taken proportional to the latencies saved, 1 MiB for the
// 4 that an 8-rank world saves: 2.75 MiB at 16 ranks, 6.5 MiB at 32, 253 MiB at 1,024. That is the 8-rank row's
// crossover of the first study; the rerun puts it between 1 and 4 MiB (the two within 4% there), and simulated benches
// on the study's network (`--algo ring|hd -b 512K -e 16M -f 2`) between 4 and 8 MiB at 16 ranks and near 16 MiB at 32,
// the two within 5% from 2 to 16 MiB. The lower anchor is kept on purpose: where ranks share racks behind
// oversubscribed uplinks the ring's neighbour-to-neighbour traffic keeps more of its bytes inside a rack than
// halving-doubling's farther exchanges do. In the hook study's replays (results/reference/replay/hook_study: racks of
// 16 behind 4:1 uplinks) a 2 MiB anchor made dense at 64 workers and 10 Gbps 4-5% slower under auto (ResNet-50 252
// against 242 ms a step, GPT-2 1,326 against 1,262), and no faster at 256 and 1,024. Below 16 KiB recursive
// doubling is picked instead: it takes ceil(log2 n) steps (one more pair of fold exchanges off a power of two) where
// halving-doubling takes twice as many, and at these sizes the steps' latency is the time. The same simulated benches
// (`terse bench allreduce --clock simulated --algo rd|hd -b 4K -e 32K`, 10 Gbps / 5 us, single-port) had it faster at 4
// KiB on 9, 12, 16, 32 and 64 ranks (1.1-1.34x), ahead or even at 8 KiB, and slower from 16 KiB
// (results/reference/collectives/README.md), as the 8-rank row has it.
#pragma once

#include <cstdint>

#include "core/comm/communicator.h"

namespace terse::comm {

// A flat algorithm (never kAuto or kHierarchical) for `bytes` bytes among `world` ranks; the same on every rank.
AllreduceAlgorithm measuredAllreduceChoice(int world, uint64_t bytes) noexcept;

// Below how many bytes a flat world of more than 8 ranks takes halving-doubling (see above).
uint64_t halvingDoublingCrossover(int world) noexcept;
// Below how many bytes a flat world of more than 8 ranks takes recursive doubling (see above); 0 up to 8 ranks.
uint64_t recursiveDoublingBelow(int world) noexcept;

// What `auto` runs (never kAuto): the flat choice above, or, with small_allreduce_bytes != 0, recursive doubling below
// it and the ring above; on several nodes of ranks_per_node (> 1) ranks, the 8-rank row's flat choice and the
// hierarchical allreduce where that is the bandwidth-bound ring. Simulated on the two-level preset
// 8xA100-4x200G,oversubscription=2 with 16 ranks (`terse bench allreduce --clock simulated --topology ... -n 16 -b 16K
// -e 16M -f 4 --algo rd|hd|hierarchical`, results/reference/collectives/README.md), halving-doubling beats the
// hierarchical allreduce at every size from 64 KiB to 16 MiB (4 MiB: 431 against 681 us), so the ring band's
// hierarchical choice is the one to measure next. HostCommunicator::algorithmFor and the replay of a step trace at
// another world size (core/sim/replay.h) both ask here, so the two cannot drift apart.
AllreduceAlgorithm autoAllreduceChoice(int world, int ranks_per_node, uint64_t bytes,
                                       uint64_t small_allreduce_bytes = 0) noexcept;

}  // namespace terse::comm
