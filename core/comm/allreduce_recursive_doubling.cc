#include "core/comm/allreduce_recursive_doubling.h"

#include "core/comm/reduce.h"

namespace terse::comm {

void allreduceRecursiveDoubling(CollectiveContext& ctx, std::span<std::byte> data, DType dtype) {
  const int n = ctx.size();
  const int r = ctx.rank();
  if (n == 1) return;
  const std::size_t elem = dtypeSize(dtype);
  const std::size_t count = data.size() / elem;
  const uint64_t seg = ctx.segmentFor(elem);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  const std::span<std::byte> tmp = ctx.scratchBytes(data.size());
  std::vector<Request> sends;
  std::vector<Request> recvs;
  std::vector<uint64_t> expected;

  // Fold the extra ranks in: even ranks below 2*rem hand their data to the next odd rank and sit out the doubling.
  int vrank = r - rem;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      ctx.sendSegments(r + 1, data, seg, sends);
      waitAll(sends);
      vrank = -1;
    } else {
      ctx.recvSegments(r - 1, tmp, seg, recvs, expected);
      waitRecvs(recvs, expected, ctx);
      sumInto(data.data(), tmp.data(), count, dtype);
      vrank = r / 2;
    }
  }

  if (vrank >= 0) {
    for (int d = 1; d < p; d *= 2) {
      const int vpartner = vrank ^ d;
      const int partner = vpartner < rem ? 2 * vpartner + 1 : vpartner + rem;
      ctx.recvSegments(partner, tmp, seg, recvs, expected);
      ctx.sendSegments(partner, data, seg, sends);
      waitRecvs(recvs, expected, ctx);
      // The partner may still be reading `data` (a large frame is copied straight from it).
      waitAll(sends);
      sumInto(data.data(), tmp.data(), count, dtype);
    }
  }

  if (r < 2 * rem) {
    if (r % 2 == 1) {
      ctx.sendSegments(r - 1, data, seg, sends);
      waitAll(sends);
    } else {
      ctx.recvSegments(r + 1, data, seg, recvs, expected);
      waitRecvs(recvs, expected, ctx);
    }
  }
}

}  // namespace terse::comm
