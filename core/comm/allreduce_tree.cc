#include "core/comm/allreduce_tree.h"

#include <algorithm>

#include "core/comm/reduce.h"

namespace terse::comm {

void allreduceTree(CollectiveContext& ctx, std::span<std::byte> data, DType dtype) {
  const int n = ctx.size();
  const int v = ctx.rank();
  if (n == 1 || data.empty()) return;
  const std::size_t elem = dtypeSize(dtype);
  const uint64_t seg = ctx.segmentFor(elem);
  const int parent = (v - 1) / 2;
  const int children = std::clamp(n - (2 * v + 1), 0, 2);
  // Each child's partial sums land in their own scratch half: added in a fixed order whatever order they arrive in.
  const std::span<std::byte> tmp = ctx.scratchBytes(static_cast<std::size_t>(children) * data.size());
  RequestList recvs[2];
  LengthList expected[2];
  RequestList sends[2];

  // Reduce: every segment's receives are posted up front.
  for (int c = 0; c < children; ++c)
    ctx.recvSegments(2 * v + 1 + c, tmp.subspan(static_cast<std::size_t>(c) * data.size(), data.size()), seg, recvs[c],
                     expected[c]);
  for (std::size_t off = 0, k = 0; off < data.size(); off += seg, ++k) {
    const std::size_t len = std::min<std::size_t>(seg, data.size() - off);
    for (int c = 0; c < children; ++c) {
      ctx.waitRecv(recvs[c][k], expected[c][k]);
      sumInto(data.data() + off, tmp.data() + static_cast<std::size_t>(c) * data.size() + off, len / elem, dtype);
    }
    if (v > 0) windowedSend(ctx, parent, data.subspan(off, len), sends[0]);
  }
  for (int c = 0; c < children; ++c) {
    recvs[c].clear();
    expected[c].clear();
  }
  // The broadcast receives into `data`: the parent must have taken every reduce segment first.
  waitAll(sends[0]);

  // Broadcast: the same tree downwards, a segment forwarded to both children as soon as it is in.
  if (v > 0) ctx.recvSegments(parent, data, seg, recvs[0], expected[0]);
  for (std::size_t off = 0, k = 0; off < data.size(); off += seg, ++k) {
    const std::size_t len = std::min<std::size_t>(seg, data.size() - off);
    if (v > 0) ctx.waitRecv(recvs[0][k], expected[0][k]);
    for (int c = 0; c < children; ++c) windowedSend(ctx, 2 * v + 1 + c, data.subspan(off, len), sends[c]);
  }
  for (auto& s : sends) waitAll(s);
}

}  // namespace terse::comm
