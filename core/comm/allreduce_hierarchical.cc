#include "core/comm/allreduce_hierarchical.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/comm/allreduce_ring.h"
#include "core/common/error.h"

namespace terse::comm {
namespace {

// The node phases over `members` (transport ranks, leader first). Both keep every segment's receive posted ahead and
// forward a segment as soon as it is complete (windowedSend), so a chain of G members costs about S / B + (G - 1)
// segment times.
void chainReduceToLeader(CollectiveContext& ctx, std::span<std::byte> data, DType dtype, std::span<const int> members) {
  ctx.setGroup(members);
  const int g = ctx.rank();
  const int last = ctx.size() - 1;
  const uint64_t seg = ctx.segmentFor(dtypeSize(dtype));
  RequestList recvs, sends;
  LengthList expected;
  if (g < last) ctx.recvReduceSegments(g + 1, data, dtype, seg, recvs, expected);
  for (std::size_t off = 0, k = 0; off < data.size(); off += seg, ++k) {
    const std::size_t len = std::min<std::size_t>(seg, data.size() - off);
    if (g < last) ctx.waitRecv(recvs[k], expected[k]);
    if (g > 0) windowedSend(ctx, g - 1, data.subspan(off, len), sends);
  }
  waitAll(sends);
  ctx.setGroup({});
}

void chainBroadcastFromLeader(CollectiveContext& ctx, std::span<std::byte> data, DType dtype,
                              std::span<const int> members) {
  ctx.setGroup(members);
  const int g = ctx.rank();
  const int last = ctx.size() - 1;
  const uint64_t seg = ctx.segmentFor(dtypeSize(dtype));
  RequestList recvs, sends;
  LengthList expected;
  if (g > 0) ctx.recvSegments(g - 1, data, seg, recvs, expected);
  for (std::size_t off = 0, k = 0; off < data.size(); off += seg, ++k) {
    const std::size_t len = std::min<std::size_t>(seg, data.size() - off);
    if (g > 0) ctx.waitRecv(recvs[k], expected[k]);
    if (g < last) windowedSend(ctx, g + 1, data.subspan(off, len), sends);
  }
  waitAll(sends);
  ctx.setGroup({});
}

}  // namespace

void allreduceHierarchical(CollectiveContext& ctx, std::span<std::byte> data, DType dtype, int ranks_per_node) {
  TERSE_CHECK(ranks_per_node >= 1, InvalidArgument,
              "hierarchical allreduce: ranks_per_node must be >= 1, got " << ranks_per_node);
  TERSE_CHECK(ctx.group.empty(), InternalError, "hierarchical allreduce inside a group");
  const int n = ctx.size();
  const int r = ctx.rank();
  if (n == 1 || data.empty()) return;
  const int per = std::min(ranks_per_node, n);
  const int node = r / per;
  const int first = node * per;
  std::vector<int> members(static_cast<std::size_t>(std::min(per, n - first)));
  std::iota(members.begin(), members.end(), first);

  if (members.size() > 1) chainReduceToLeader(ctx, data, dtype, members);
  if (r == first && n > per) {
    std::vector<int> leaders;
    for (int l = 0; l < n; l += per) leaders.push_back(l);
    ctx.setGroup(leaders);
    allreduceRing(ctx, data, dtype);
    ctx.setGroup({});
  }
  if (members.size() > 1) chainBroadcastFromLeader(ctx, data, dtype, members);
}

}  // namespace terse::comm
