#include "core/comm/allreduce_halving_doubling.h"

#include <array>

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
    // Reduce-scatter, nearest partner first: at distance d the range [lo, lo + 2h) of h = p / (2d) blocks is split,
    // and v keeps the half that bit d of v names. Each step's halves are recorded for the allgather, which retraces
    // the steps farthest first.
    struct Step {
      int keep, give, blocks;
    };
    std::array<Step, 32> steps{};  // log2(p) <= 30: no allocation on the collective's path
    int taken = 0;
    int lo = 0;
    for (int d = 1; d < p; d *= 2) {
      const int h = p / (2 * d);
      const int partner = fold.rankOf(v ^ d);
      const Step step{(v & d) == 0 ? lo : lo + h, (v & d) == 0 ? lo + h : lo, h};
      // The partner's half is added into ours as it is received (Transport::irecvReduce: on tcp each piece is added
      // right after it is read, while in cache), instead of landing in scratch and being read back by one sumInto
      // after the whole step: one pass over the half less, and the additions overlap the transfer. The kept and the
      // given-away blocks are disjoint, so the sends (read from `data` in place) never see a half-added element.
      ctx.recvReduceSegments(partner, blockBytes(data, step.keep, h), dtype, seg, recvs, expected);
      ctx.sendSegments(partner, blockBytes(data, step.give, h), seg, sends);
      waitRecvs(recvs, expected, ctx);
      // The given-away half is received into during the allgather: the partner must be done reading it.
      waitAll(sends);
      steps[static_cast<std::size_t>(taken++)] = step;
      lo = step.keep;
    }
    for (int d = p / 2; d >= 1; d /= 2) {
      const Step step = steps[static_cast<std::size_t>(--taken)];
      const int partner = fold.rankOf(v ^ d);
      ctx.recvSegments(partner, blockBytes(data, step.give, step.blocks), seg, recvs, expected);
      ctx.sendSegments(partner, blockBytes(data, step.keep, step.blocks), seg, sends);
      waitRecvs(recvs, expected, ctx);
      waitAll(sends);
    }
  }
  unfoldFromPowerOfTwo(ctx, data, dtype, fold);
}

}  // namespace terse::comm
