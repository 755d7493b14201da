// Reduce-to-root-then-broadcast allreduce (sum), the master-worker (parameter-server) baseline: every rank sends its
// whole buffer to rank 0, which adds them in rank order and sends the sum back to every rank (Li et al. 2014, "Scaling
// distributed machine learning with the parameter server", with one server). The root's link carries (n-1) S in
// each direction, so on a single-port network it costs about 2 (n-1) S / B against the ring's 2 (n-1)/n S / B, and
// two latencies against the ring's 2 (n-1): it is only competitive for tiny messages, and it is the reference the
// other algorithms are measured against.
//
// Bytes on the wire per rank (framed(S) = S + 32 * segmentCount(S), frames of at most `segment` bytes): rank v > 0
// sends framed(S) and receives framed(S); rank 0 receives and sends (n-1) framed(S).
//
// Summation order: ((x_0 + x_1) + x_2) + ... + x_{n-1}, each pairwise add rounded once (reduce.h), segment by segment
// as the workers' segments arrive; every rank ends with rank 0's bits. Rank 0 holds (n-1) S bytes of scratch, one
// buffer per worker, so that the order is fixed whatever order the workers' frames arrive in.
#pragma once

#include <span>

#include "core/comm/collective.h"
#include "core/common/dtype.h"

namespace terse::comm {

// data: count * dtypeSize(dtype) bytes, summed in place over all ranks. Every rank passes the same size.
void allreduceReduceBroadcast(CollectiveContext& ctx, std::span<std::byte> data, DType dtype);

}  // namespace terse::comm
