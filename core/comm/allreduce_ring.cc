#include "core/comm/allreduce_ring.h"

namespace terse::comm {

void allreduceRing(CollectiveContext& ctx, std::span<std::byte> data, DType dtype) {
  const int n = ctx.size();
  const int r = ctx.rank();
  if (n == 1) return;
  const std::size_t elem = dtypeSize(dtype);
  const std::size_t count = data.size() / elem;
  const uint64_t seg = ctx.segmentFor(elem);
  const int right = modRank(r + 1, n);
  const int left = modRank(r - 1, n);
  auto chunkBytes = [&](int c) {
    const Range rc = ringChunk(count, n, c);
    return data.subspan(rc.begin * elem, rc.size * elem);
  };
  std::vector<Request> sends;
  std::vector<Request> recvs;
  std::vector<uint64_t> expected;

  // Reduce-scatter. The chunk sent and the chunk added into differ in every step, so all of a step's segments go out
  // and are received at once; each received segment is added into place as it is delivered (irecvReduce), without
  // landing in a scratch buffer first.
  for (int s = 0; s < n - 1; ++s) {
    ctx.recvReduceSegments(left, chunkBytes(modRank(r - s - 1, n)), dtype, seg, recvs, expected);
    ctx.sendSegments(right, chunkBytes(modRank(r - s, n)), seg, sends);
    // The chunk added into here is the one sent next step: all of it must have arrived.
    waitRecvs(recvs, expected, ctx);
    waitAll(sends);
  }

  // Allgather: each fully reduced chunk travels on around the ring, received straight into place.
  for (int s = 0; s < n - 1; ++s) {
    ctx.recvSegments(left, chunkBytes(modRank(r - s, n)), seg, recvs, expected);
    ctx.sendSegments(right, chunkBytes(modRank(r + 1 - s, n)), seg, sends);
    waitRecvs(recvs, expected, ctx);
    waitAll(sends);
  }
}

}  // namespace terse::comm
