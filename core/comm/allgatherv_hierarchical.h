// Hierarchical allgatherv for clusters of multi-worker nodes: gather inside each node to its leader, an allgatherv
// among the leaders of the nodes' contiguous byte ranges, a broadcast inside each node from its leader -- the
// two-level scheme of MPICH's MPIR_Allgather_intra_smp and Open MPI's coll/han, which sends every byte through every
// node's NIC once (a flat Bruck sends each of a node's G workers its own copy: G times the NIC bytes; a flat ring
// crosses the NIC once per block too, but with n - 1 latencies).
//
// Nodes are blocks of `ranks_per_node` consecutive ranks (the last one shorter when the world is not a multiple), the
// leader a node's first rank, as in allreduce_hierarchical.h. Since a node's ranks are consecutive, its blocks are one
// contiguous range of the result: the members send their blocks straight into place at the leader, the leaders run
// `leaders` (the ring or Bruck; CollectiveContext::setGroup) on those ranges, and each leader broadcasts the whole
// result along broadcast_binomial.h's tree inside its node.
//
// Bytes on the wire per rank (T = the gathered total, frames of at most `segment` bytes, 32-byte headers each): a
// member sends its own block to its leader and receives T from its parent in the node's tree; a leader receives its
// members' blocks, runs the leaders' algorithm on node-sized blocks, and sends T to each of its tree children.
#pragma once

#include <cstdint>
#include <span>

#include "core/comm/collective.h"
#include "core/comm/communicator.h"

namespace terse::comm {

// As allgathervRing (allgatherv_ring.h); every rank passes the same sizes, ranks_per_node (>= 1; 1 gives the flat
// `leaders` algorithm, a value >= the world size one node: the gather and the broadcast alone) and `leaders` (kRing or
// kBruck).
void allgathervHierarchical(CollectiveContext& ctx, std::span<const std::byte> send, std::span<std::byte> recv,
                            std::span<const uint64_t> sizes, int ranks_per_node, AllgatherAlgorithm leaders);

}  // namespace terse::comm
