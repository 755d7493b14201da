// The allreduce algorithm `auto` picks for a flat world, by world size and message size, from a measured table.
//
// How the table was made: results/reference/collectives/study.py runs `terse bench allreduce --clock simulated`
// (SimGrid, so host CPU contention does not enter the times) for every algorithm, 2..8 ranks and 4 KiB..64 MiB, on
// single-port links of 10 Gbps / 5 us (per-pair wires with per-rank NIC egress and ingress caps of the same bandwidth),
// and allreduce_auto.cc keeps, for each world size, the fastest algorithm's size range (results/reference/collectives/
// README.md has the table and the measurements). Beyond 8 ranks the 8-rank row is used. It is a property of that
// network: on another one, name the algorithm (config `collectives.allreduce`, `--algo`) or rerun the study.
#pragma once

#include <cstdint>

#include "core/comm/communicator.h"

namespace terse::comm {

// A flat algorithm (never kAuto or kHierarchical) for `bytes` bytes among `world` ranks; the same on every rank.
AllreduceAlgorithm measuredAllreduceChoice(int world, uint64_t bytes) noexcept;

}  // namespace terse::comm
