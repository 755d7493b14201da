#include "core/comm/allreduce_halving_doubling.h"

#include "core/comm/allreduce_recursive_doubling.h"
#include "core/comm/reduce.h"

namespace terse::comm {

void allreduceHalvingDoubling(CollectiveContext& ctx, std::span<std::byte> data, DType dtype) {
  if (ctx.size() == 1) return;
  const std::size_t elem = dtypeSize(dtype);
  const std::size_t count = data.size() / elem;
  const uint64_t seg = ctx.segmentFor(elem);
  const std::span<std::byte> tmp = ctx.scratchBytes(data.size());
  const PowerOfTwoFold fold = foldToPowerOfTwo(ctx, data, dtype, tmp);
  const int p = fold.p;
  const int v = fold.vrank;
  // Blocks [first, first + blocks) as bytes of `buf`.
  auto blockBytes = [&](std::span<std::byte> buf, int first, int blocks) {
    const std::size_t begin = ringChunk(count, p, first).begin;
    const Range last = ringChunk(count, p, first + blocks - 1);
    return buf.subspan(begin * elem, (last.begin + last.size - begin) * elem);
  };
  std::vector<Request> sends;
  std::vector<Request> recvs;
  std::vector<uint64_t> expected;
  if (v >= 0) {
    int lo = 0;
    for (int d = p / 2; d >= 1; d /= 2) {
      const int partner = fold.rankOf(v ^ d);
      const int keep = (v & d) == 0 ? lo : lo + d;
      const int give = (v & d) == 0 ? lo + d : lo;
      const std::span<std::byte> mine = blockBytes(data, keep, d);
      const std::span<std::byte> theirs = blockBytes(tmp, keep, d);
      ctx.recvSegments(partner, theirs, seg, recvs, expected);
      ctx.sendSegments(partner, blockBytes(data, give, d), seg, sends);
      waitRecvs(recvs, expected, ctx);
      sumInto(mine.data(), theirs.data(), mine.size() / elem, dtype);
      // The given-away half is received into during the allgather: the partner must be done reading it.
      waitAll(sends);
      lo = keep;
    }
    for (int d = 1; d < p; d *= 2) {
      const int partner = fold.rankOf(v ^ d);
      ctx.recvSegments(partner, blockBytes(data, (v ^ d) & ~(d - 1), d), seg, recvs, expected);
      ctx.sendSegments(partner, blockBytes(data, v & ~(d - 1), d), seg, sends);
      waitRecvs(recvs, expected, ctx);
      waitAll(sends);
    }
  }
  unfoldFromPowerOfTwo(ctx, data, dtype, fold);
}

}  // namespace terse::comm
