// Binary-tree allreduce (sum): a reduce to rank 0 up a binary tree followed by a broadcast down the same tree, both
// pipelined in segments (MPICH's and NCCL's tree allreduce; Sanders, Speck and Traff 2009, "Two-tree algorithms for
// full bandwidth broadcast, reduction and scan", give the analysis). Rank v's children are 2v+1 and 2v+2 (heap order),
// so the depth is floor(log2 n). Every segment is added and forwarded as soon as both children's copies are in, and a
// parent forwards each broadcast segment the moment it arrives, so a message of k segments of s bytes takes about
// (depth + k - 1) segment times per phase instead of depth * S: latency-bound messages pay 2 depth round trips, large
// ones about 2 S / B per phase on a single-port link (a node sends every byte to two children, or receives it from
// two), twice the ring's 2 (n-1)/n S / B in all.
//
// Bytes on the wire per rank (S = the message, frames of at most `segment` bytes, 32-byte headers each, c(v) = the
// number of children of v, framed(S) = S + 32 * segmentCount(S)): rank v sends framed(S) to its parent (v > 0) and
// framed(S) to each child, and receives the same: (c(v) + [v > 0]) * framed(S) each way.
//
// Summation order: the partial sum of v's subtree is (x_v + T_{2v+1}) + T_{2v+2}, each pairwise add rounded once
// (reduce.h); every rank ends with rank 0's bits, identical across runs.
#pragma once

#include <span>

#include "core/comm/collective.h"
#include "core/common/dtype.h"

namespace terse::comm {

// data: count * dtypeSize(dtype) bytes, summed in place over all ranks. Every rank passes the same size.
void allreduceTree(CollectiveContext& ctx, std::span<std::byte> data, DType dtype);

}  // namespace terse::comm
