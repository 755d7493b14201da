#include "core/comm/broadcast_binomial.h"

#include "core/common/error.h"

namespace terse::comm {

void broadcastBinomial(CollectiveContext& ctx, std::span<std::byte> data, int root) {
  const int n = ctx.size();
  TERSE_CHECK(root >= 0 && root < n, InvalidArgument, "broadcast: root must be in [0, " << n << "), got " << root);
  if (n == 1) return;
  const int vr = modRank(ctx.rank() - root, n);
  const uint64_t seg = ctx.segmentFor(1);
  RequestList sends;
  RequestList recvs;
  LengthList expected;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      ctx.recvSegments(modRank(vr - mask + root, n), data, seg, recvs, expected);
      waitRecvs(recvs, expected, ctx);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) ctx.sendSegments(modRank(vr + mask + root, n), data, seg, sends);
  }
  waitAll(sends);
}

}  // namespace terse::comm
