// Recursive halving-doubling allreduce (sum), Rabenseifner's algorithm: a reduce-scatter by recursive halving followed
// by an allgather by recursive doubling (Thakur, Rabenseifner and Gropp 2005, "Optimization of Collective
// Communication Operations in MPICH", section 4.4; Rabenseifner 2004, ICCS). It takes 2 log2(p) round trips like
// recursive doubling's log2(p) and moves 2 (p-1)/p S bytes like the ring, so it sits between the two: fewer latencies
// than the ring's 2 (n-1), far fewer bytes than recursive doubling's S log2(p).
//
// A world that is not a power of two is folded first exactly as in allreduce_recursive_doubling.h (PowerOfTwoFold:
// the first 2*rem ranks pair up, the even ones hand their whole buffer to the odd ones before and get the result back
// after), the standard MPICH handling; the p = 2^floor(log2 n) remaining ranks run the power-of-two phase.
//
// The message is cut into p blocks (ringChunk(count, p, b)). Reduce-scatter step at distance d = 1, 2, ..., p/2,
// nearest partner first: virtual rank v and its partner v ^ d hold partial sums of the same range [lo, lo + 2h) of
// blocks, h = p / (2d); v keeps the half bit d of v names (the lower half when it is clear), sends the other half and
// adds the partner's copy of the kept half into its own. After log2(p) steps v holds one block fully reduced (block
// number bit-reverse(v)). Allgather: the same steps retraced, d = p/2 down to 1, each sending the kept half and
// receiving the given one. Nearest first because the large halves then travel between neighbouring ranks, which share a
// node or a rack on a cluster of consecutive ranks: only h = p / (2d) blocks, a 1/(2d) share of the message, cross
// distance d. Farthest first (the textbook's order) sends half the message across the widest cut in the first step: on
// the hook study's racks behind 4:1 uplinks that made dense ResNet-50 under auto 2.7x slower than rings at 256 workers
// (results/reference/collectives/README.md).
//
// Bytes on the wire per rank (frames of at most `segment` bytes, 32-byte headers each; K_d(v) and G_d(v) = the bytes
// of the h blocks v keeps and gives away at distance d, framed(x) = x + 32 * segmentCount(x)):
//   a virtual rank v sends  sum_{d=1..p/2} framed(G_d(v)) + framed(K_d(v))
//   and receives            sum_{d=1..p/2} framed(K_d(v)) + framed(G_d(v)),
//   which is 2 (p-1)/p S plus headers for equal blocks; a folded pair adds framed(S) each way to both of its ranks.
//
// Summation order of every element: the fold's x_{2i} + x_{2i+1}, then the butterfly w_v <- w_v + w_{v^d} for
// d = 1 up to p/2: recursive doubling's tree, so the two give the same bits. Each pairwise add rounds once (reduce.h)
// and is commutative, so both partners of a step hold the same bits and every rank ends with the same result.
#pragma once

#include <span>

#include "core/comm/collective.h"
#include "core/common/dtype.h"

namespace terse::comm {

// data: count * dtypeSize(dtype) bytes, summed in place over all ranks. Every rank passes the same size.
void allreduceHalvingDoubling(CollectiveContext& ctx, std::span<std::byte> data, DType dtype);

}  // namespace terse::comm
