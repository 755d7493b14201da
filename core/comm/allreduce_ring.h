// Ring allreduce (sum): a reduce-scatter followed by an allgather around the ring rank -> rank + 1 (Patarasuk and
// Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations"; Gloo's allreduce_ring.h).
//
// The message of `count` elements is cut into n chunks (ringChunk: the first count % n one element longer). In
// reduce-scatter step s (0 <= s < n-1) rank r sends chunk (r - s) mod n to r + 1 and adds the chunk (r - s - 1) mod n
// it receives from r - 1 into its own, so after n - 1 steps rank r holds the full sum of chunk (r + 1) mod n. In
// allgather step s it sends chunk (r + 1 - s) mod n and receives chunk (r - s) mod n straight into place.
//
// Bytes on the wire per rank: each step moves one chunk, split into frames of at most segment bytes, so rank r sends
//   sum over s of [bytes(chunk (r-s)) + 32 * frames(chunk (r-s))]   (reduce-scatter)
// + sum over s of [bytes(chunk (r+1-s)) + 32 * frames(chunk (r+1-s))] (allgather)
// = 2 (n-1)/n * S plus the remainder chunks' extra elements and the frame headers (tests/comm checks it exactly).
//
// Pipelining: each step's segments are forwarded as they complete (a reduce-scatter segment once added, an allgather
// segment once landed), and the next step's receives are posted before the current step's are waited on, so the link
// carries step t + 1 while step t is still being added; the frames and the order of additions are the ones above.
//
// Summation order of chunk c: ((x_c + x_{c+1}) + x_{c+2}) + ... + x_{c+n-1} (ranks mod n), every pairwise add rounded
// once in the element type (reduce.h); every rank ends with the same bits because the owner's result is copied.
#pragma once

#include <span>

#include "core/comm/collective.h"
#include "core/common/dtype.h"

namespace terse::comm {

// data: count * dtypeSize(dtype) bytes, summed in place over all ranks. Every rank passes the same size.
void allreduceRing(CollectiveContext& ctx, std::span<std::byte> data, DType dtype);

}  // namespace terse::comm
