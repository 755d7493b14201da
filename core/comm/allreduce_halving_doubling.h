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
// The message is cut into p blocks (ringChunk(count, p, b)). Reduce-scatter step at distance d = p/2, p/4, ..., 1:
// virtual rank v holds blocks [lo, lo + 2d); with partner v ^ d it keeps the half containing v (the lower half when
// bit d of v is clear), sends the other half and adds the partner's copy of the kept half into its own. After log2(p)
// steps v holds block v fully reduced. Allgather step at distance d = 1, 2, ..., p/2: v sends its blocks
// [v & ~(d-1), + d) to v ^ d and receives the partner's d blocks into place.
//
// Bytes on the wire per rank (frames of at most `segment` bytes, 32-byte headers each; A_d(v) = the bytes of blocks
// [v & ~(d-1), (v & ~(d-1)) + d), B_v = the bytes of block v, framed(x) = x + 32 * segmentCount(x)):
//   a virtual rank v sends  sum_{d=p/2..1} framed(A_{2d}(v) - A_d(v))  (halving: the half it gives away)
//                         + sum_{d=1..p/2} framed(A_d(v))               (doubling: what it holds)
//   and receives          sum_{d=p/2..1} framed(A_d(v)) + sum_{d=1..p/2} framed(A_{2d}(v) - A_d(v)),
//   which is 2 (p-1)/p S plus headers for equal blocks; a folded pair adds framed(S) each way to both of its ranks.
//
// Summation order of every element: the fold's x_{2i} + x_{2i+1}, then the butterfly w_v <- w_v + w_{v^d} for
// d = p/2 down to 1 (recursive doubling's tree with the distances reversed). Each pairwise add rounds once (reduce.h)
// and is commutative, so both partners of a step hold the same bits and every rank ends with the same result.
#pragma once

#include <span>

#include "core/comm/collective.h"
#include "core/common/dtype.h"

namespace terse::comm {

// data: count * dtypeSize(dtype) bytes, summed in place over all ranks. Every rank passes the same size.
void allreduceHalvingDoubling(CollectiveContext& ctx, std::span<std::byte> data, DType dtype);

}  // namespace terse::comm
