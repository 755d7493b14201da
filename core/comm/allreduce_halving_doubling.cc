#include "core/comm/allreduce_halving_doubling.h"

#include "core/comm/allreduce_recursive_doubling.h"

namespace terse::comm {

void allreduceHalvingDoubling(CollectiveContext& ctx, std::span<std::byte> data, DType dtype) {
  if (ctx.size() == 1) return;
  const std::size_t elem = dtypeSize(dtype);
  const std::size_t count = data.size() / elem;
  const uint64_t seg = ctx.segmentFor(elem);
  // Scratch only for the fold of a world that is not a power of two: the halving adds into place (below).
  const int n = ctx.size();
  const std::span<std::byte> tmp = (n & (n - 1)) != 0 ? ctx.scratchBytes(data.size()) : std::span<std::byte>{};
  const PowerOfTwoFold fold = foldToPowerOfTwo(ctx, data, dtype, tmp);
  const int p = fold.p;
  const int v = fold.vrank;
  // Blocks [first, first + blocks) as bytes of `buf`.
  auto blockBytes = [&](std::span<std::byte> buf, int first, int blocks) {
    const std::size_t begin = ringChunk(count, p, first).begin;
    const Range last = ringChunk(count, p, first + blocks - 1);
    return buf.subspan(begin * elem, (last.begin + last.size - begin) * elem);
  };
  RequestList sends;
  RequestList recvs;
  LengthList expected;
  if (v >= 0) {
    // Reduce-scatter, nearest partner first: at distance d, v and v ^ d hold the same range [lo, lo + 2h) of blocks,
    // h = p / (2d); v keeps the half bit d of v names. The ranges are aligned to their size, so the allgather, which
    // retraces the steps farthest first, finds the half v kept at distance d as the final block rounded down to h, and
    // the half it gave away as that one's sibling.
    int lo = 0;
    for (int d = 1; d < p; d *= 2) {
      const int h = p / (2 * d);
      const int partner = fold.rankOf(v ^ d);
      const int keep = (v & d) == 0 ? lo : lo + h;
      // The partner's half is added into ours as it is received (Transport::irecvReduce: on tcp each piece is added
      // right after it is read, while in cache), instead of landing in scratch and being read back by one sumInto
      // after the whole step: one pass over the half less, and the additions overlap the transfer. The kept and the
      // given-away blocks are disjoint, so the sends (read from `data` in place) never see a half-added element.
      ctx.recvReduceSegments(partner, blockBytes(data, keep, h), dtype, seg, recvs, expected);
      ctx.sendSegments(partner, blockBytes(data, keep ^ h, h), seg, sends);
      waitRecvs(recvs, expected, ctx);
      // The given-away half is received into during the allgather: the partner must be done reading it.
      waitAll(sends);
      lo = keep;
    }
    for (int d = p / 2; d >= 1; d /= 2) {
      const int h = p / (2 * d);
      const int keep = lo & ~(h - 1);
      const int partner = fold.rankOf(v ^ d);
      ctx.recvSegments(partner, blockBytes(data, keep ^ h, h), seg, recvs, expected);
      ctx.sendSegments(partner, blockBytes(data, keep, h), seg, sends);
      waitRecvs(recvs, expected, ctx);
      waitAll(sends);
    }
  }
  unfoldFromPowerOfTwo(ctx, data, dtype, fold);
}

}  // namespace terse::comm
