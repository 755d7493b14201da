#include "core/comm/allreduce_recursive_doubling.h"

#include "core/comm/reduce.h"

namespace terse::comm {

PowerOfTwoFold foldToPowerOfTwo(CollectiveContext& ctx, std::span<std::byte> data, DType dtype,
                                std::span<std::byte> tmp) {
  const int n = ctx.size();
  const int r = ctx.rank();
  PowerOfTwoFold f;
  while (f.p * 2 <= n) f.p *= 2;
  f.rem = n - f.p;
  f.vrank = r - f.rem;
  if (r >= 2 * f.rem) return f;
  const uint64_t seg = ctx.segmentFor(dtypeSize(dtype));
  RequestList requests;
  LengthList expected;
  // Even ranks below 2*rem hand their data to the next odd rank and sit out the power-of-two phase.
  if (r % 2 == 0) {
    ctx.sendSegments(r + 1, data, seg, requests);
    waitAll(requests);
    f.vrank = -1;
  } else {
    ctx.recvSegments(r - 1, tmp, seg, requests, expected);
    waitRecvs(requests, expected, ctx);
    sumInto(data.data(), tmp.data(), data.size() / dtypeSize(dtype), dtype);
    f.vrank = r / 2;
  }
  return f;
}

void unfoldFromPowerOfTwo(CollectiveContext& ctx, std::span<std::byte> data, DType dtype, const PowerOfTwoFold& fold) {
  const int r = ctx.rank();
  if (r >= 2 * fold.rem) return;
  const uint64_t seg = ctx.segmentFor(dtypeSize(dtype));
  RequestList requests;
  LengthList expected;
  if (r % 2 == 1) {
    ctx.sendSegments(r - 1, data, seg, requests);
    waitAll(requests);
  } else {
    ctx.recvSegments(r + 1, data, seg, requests, expected);
    waitRecvs(requests, expected, ctx);
  }
}

void allreduceRecursiveDoubling(CollectiveContext& ctx, std::span<std::byte> data, DType dtype) {
  if (ctx.size() == 1) return;
  const std::size_t count = data.size() / dtypeSize(dtype);
  const uint64_t seg = ctx.segmentFor(dtypeSize(dtype));
  const std::span<std::byte> tmp = ctx.scratchBytes(data.size());
  const PowerOfTwoFold fold = foldToPowerOfTwo(ctx, data, dtype, tmp);
  RequestList sends;
  RequestList recvs;
  LengthList expected;
  if (fold.vrank >= 0) {
    for (int d = 1; d < fold.p; d *= 2) {
      const int partner = fold.rankOf(fold.vrank ^ d);
      ctx.recvSegments(partner, tmp, seg, recvs, expected);
      ctx.sendSegments(partner, data, seg, sends);
      waitRecvs(recvs, expected, ctx);
      // The partner may still be reading `data` (a large frame is copied straight from it).
      waitAll(sends);
      sumInto(data.data(), tmp.data(), count, dtype);
    }
  }
  unfoldFromPowerOfTwo(ctx, data, dtype, fold);
}

}  // namespace terse::comm
