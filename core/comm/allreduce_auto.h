// The allreduce algorithm `auto` picks for a flat world, by world size and message size, from a measured table.
//
// How the table was made: results/reference/collectives/study.py runs `terse bench allreduce --clock simulated`
// (SimGrid, so host CPU contention does not enter the times) for every algorithm, 2..8 ranks and 4 KiB..64 MiB, on
// single-port links of 10 Gbps / 5 us (per-pair wires with per-rank NIC egress and ingress caps of the same bandwidth),
// and allreduce_auto.cc keeps, for each world size, the fastest algorithm's size range (results/reference/collectives/
// README.md has the table and the measurements). It is a property of that network: on another one, name the algorithm
// (config `collectives.allreduce`, `--algo`) or rerun the study.
//
// Beyond 8 ranks (no row: the study stops there, a simulated world does not) halving-doubling is picked below
// halvingDoublingCrossover(n) and the ring above. In the latency-bandwidth model both move 2 (n-1)/n of the message
// per rank, and halving-doubling saves ((n - 1) - ceil(log2 n)) latencies over the ring; what the ring wins back at
// large messages grows with the message. So the crossover is taken proportional to the latencies saved, scaled from
// the 8-rank row's (1 MiB for 4 latencies saved): 2.75 MiB at 16 ranks, 6.5 MiB at 32, 253 MiB at 1,024. Simulated
// benches on the study's network put the measured crossover at 2 MiB (16 ranks) and 8 MiB (32 ranks).
// Below 16 KiB recursive doubling is picked instead: it takes ceil(log2 n) steps (one more pair of fold exchanges off a
// power of two) where halving-doubling takes twice as many, and at these sizes the steps' latency is the time. The
// same simulated benches (`terse bench allreduce --clock simulated --algo rd|hd -b 4K -e 32K`, 10 Gbps / 5 us,
// single-port) had it faster at 4 and 8 KiB on 9, 12, 16, 32 and 64 ranks (4 KiB: 1.27-1.54x, 8 KiB: 1.07-1.27x)
// and slower from 16 KiB (results/reference/collectives/README.md). At 8 ranks the study had the two within the noise
// at 4 KiB and the row keeps the table's choice.
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
// hierarchical allreduce where that is the bandwidth-bound ring. HostCommunicator::algorithmFor and the replay of a
// step trace at another world size (core/sim/replay.h) both ask here, so the two cannot drift apart.
AllreduceAlgorithm autoAllreduceChoice(int world, int ranks_per_node, uint64_t bytes,
                                       uint64_t small_allreduce_bytes = 0) noexcept;

}  // namespace terse::comm
