#include "core/comm/barrier_dissemination.h"

namespace terse::comm {

void barrierDissemination(CollectiveContext& ctx) {
  const int n = ctx.size();
  const int r = ctx.rank();
  RequestList sends;
  RequestList recvs;
  LengthList expected;
  for (int k = 1; k < n; k *= 2) {
    ctx.recv(modRank(r - k, n), {}, recvs, expected);
    ctx.send(modRank(r + k, n), {}, sends);
    waitRecvs(recvs, expected, ctx);
    waitAll(sends);
  }
}

}  // namespace terse::comm
