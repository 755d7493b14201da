// Hierarchical allreduce (sum) for clusters of multi-worker nodes: reduce inside each node to its leader, a ring
// allreduce among the leaders, a broadcast inside each node from its leader -- the two-level scheme of NCCL's trees
// and Horovod's hierarchical allreduce (Sergeev and Del Balso 2018), which crosses the slow inter-node network with one
// message per node instead of one per worker.
//
// Nodes are blocks of `ranks_per_node` consecutive ranks (the last one shorter when the world is not a multiple); a
// node's leader is its first rank. Inside a node both phases are pipelined chains over segments, the bandwidth-optimal
// shape for a fast intra-node link: in the reduce, member g (g = G-1 down to 1) adds member g+1's partial sum of each
// segment into its own as it arrives and passes it on to g-1; the broadcast runs the other way. The leaders run
// allreduce_ring.h among themselves (CollectiveContext::setGroup).
//
// Bytes on the wire per rank (S = the message, frames of at most `segment` bytes, 32-byte headers each): a member sends
// S once (reduce, members 1..G-1) and receives it once (broadcast, members 1..G-1), and a member g < G-1 also receives
// S in the reduce and sends it in the broadcast; a leader additionally sends and receives the ring's
// 2 (m-1)/m S among m leaders. Summation order of every element: x_{G-1} + x_{G-2} + ... + x_0 inside a node (each
// add rounded once, reduce.h), then the ring's order over the nodes' sums; every rank ends with the leader's bits. The
// result differs in rounding from the flat ring's (another order), identical across ranks and runs.
#pragma once

#include <span>

#include "core/comm/collective.h"
#include "core/common/dtype.h"

namespace terse::comm {

// data: count * dtypeSize(dtype) bytes, summed in place over all ranks. Every rank passes the same size and the same
// ranks_per_node (>= 1; 1, or a value >= the world size, gives one level: the ring, or the chains alone).
void allreduceHierarchical(CollectiveContext& ctx, std::span<std::byte> data, DType dtype, int ranks_per_node);

}  // namespace terse::comm
