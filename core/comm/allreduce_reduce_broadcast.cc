#include "core/comm/allreduce_reduce_broadcast.h"

#include <algorithm>

#include "core/comm/reduce.h"

namespace terse::comm {

void allreduceReduceBroadcast(CollectiveContext& ctx, std::span<std::byte> data, DType dtype) {
  const int n = ctx.size();
  if (n == 1 || data.empty()) return;
  const std::size_t elem = dtypeSize(dtype);
  const uint64_t seg = ctx.segmentFor(elem);
  RequestList sends;
  RequestList recvs;
  LengthList expected;
  if (ctx.rank() != 0) {
    ctx.sendSegments(0, data, seg, sends);
    // The result is received into `data`: the root must have taken all of it first.
    waitAll(sends);
    ctx.recvSegments(0, data, seg, recvs, expected);
    waitRecvs(recvs, expected, ctx);
    return;
  }
  const std::size_t bytes = data.size();
  const std::span<std::byte> tmp = ctx.scratchBytes(static_cast<std::size_t>(n - 1) * bytes);
  for (int w = 1; w < n; ++w)
    ctx.recvSegments(w, tmp.subspan(static_cast<std::size_t>(w - 1) * bytes, bytes), seg, recvs, expected);
  const std::size_t per_worker = segmentCount(bytes, seg);
  for (std::size_t off = 0, k = 0; off < bytes; off += seg, ++k) {
    const std::size_t len = std::min<std::size_t>(seg, bytes - off);
    for (int w = 1; w < n; ++w) {
      const std::size_t i = static_cast<std::size_t>(w - 1) * per_worker + k;
      ctx.waitRecv(recvs[i], expected[i]);
      sumInto(data.data() + off, tmp.data() + static_cast<std::size_t>(w - 1) * bytes + off, len / elem, dtype);
    }
  }
  recvs.clear();
  expected.clear();
  for (int w = 1; w < n; ++w) ctx.sendSegments(w, data, seg, sends);
  waitAll(sends);
}

}  // namespace terse::comm
