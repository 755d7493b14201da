#include "core/comm/allreduce_ring.h"

namespace terse::comm {

void allreduceRing(CollectiveContext& ctx, std::span<std::byte> data, DType dtype) {
  const int n = ctx.size();
  const int r = ctx.rank();
  if (n == 1) return;
  const std::size_t elem = dtypeSize(dtype);
  const std::size_t count = data.size() / elem;
  const uint64_t seg = ctx.segmentFor(elem);
  const int right = modRank(r + 1, n);
  const int left = modRank(r - 1, n);
  const int steps = 2 * (n - 1);
  auto chunkBytes = [&](int c) {
    const Range rc = ringChunk(count, n, c);
    return data.subspan(rc.begin * elem, rc.size * elem);
  };
  // The chunk step t receives: reduce-scatter steps add into chunk r - t - 1, allgather step s = t - (n - 1)
  // overwrites chunk r - s. Step t + 1 sends exactly the chunk step t received (step 0 sends chunk r), which is what
  // lets a segment go on to the right as soon as it has been added (or has landed), instead of at the step's end.
  auto recvChunk = [&](int t) { return t < n - 1 ? modRank(r - t - 1, n) : modRank(r - (t - (n - 1)), n); };

  RequestList sends;
  std::vector<std::size_t> step_sends(static_cast<std::size_t>(steps) + 1, 0);  // sends[step_sends[t]..] are step t's
  RequestList recvs[2];
  LengthList expected[2];
  auto postRecvs = [&](int t) {
    if (t >= n - 1) {
      // Allgather step s lands in chunk r - s, which reduce-scatter step s sent: those frames must be out of the
      // buffer first (with zero-copy sends the transport reads them from it until they complete).
      const int s = t - (n - 1);
      for (std::size_t i = step_sends[static_cast<std::size_t>(s)]; i < step_sends[static_cast<std::size_t>(s) + 1];
           ++i) {
        sends[i].wait();
        sends[i] = Request();
      }
    }
    auto& rv = recvs[t % 2];
    auto& ex = expected[t % 2];
    if (t < n - 1) {
      ctx.recvReduceSegments(left, chunkBytes(recvChunk(t)), dtype, seg, rv, ex);
    } else {
      ctx.recvSegments(left, chunkBytes(recvChunk(t)), seg, rv, ex);
    }
  };

  // Pipelined across steps: step t + 1's receives are posted before step t's are waited on (so its frames land in
  // place rather than being staged), and each of step t's segments is forwarded as soon as it is complete, so the
  // link carries the next step's frames while this rank still adds the current step's. The frames, their sizes and
  // the order of every addition are those of the step-by-step ring (the wire accounting above is unchanged).
  postRecvs(0);
  ctx.sendSegments(right, chunkBytes(r), seg, sends);
  step_sends[1] = sends.size();
  for (int t = 0; t < steps; ++t) {
    const auto ut = static_cast<std::size_t>(t);
    if (t + 1 < steps) postRecvs(t + 1);
    // Step t - 2's frames have landed by now, as a rule: let go of those that have (a test, never a wait), so the
    // operation holds a few steps' requests instead of all 2 (n - 1) to the end (CollectiveContext::track).
    if (t >= 2)
      for (std::size_t i = step_sends[ut - 2]; i < step_sends[ut - 1]; ++i)
        if (sends[i].test()) sends[i] = Request();
    auto& rv = recvs[t % 2];
    auto& ex = expected[t % 2];
    const std::span<std::byte> chunk = chunkBytes(recvChunk(t));
    for (std::size_t i = 0; i < rv.size(); ++i) {
      ctx.waitRecv(rv[i], ex[i]);
      if (t + 1 < steps) {
        const std::size_t off = i * seg;
        ctx.send(right, chunk.subspan(off, std::min<std::size_t>(seg, chunk.size() - off)), sends);
      }
    }
    rv.clear();
    ex.clear();
    if (t + 1 < steps) step_sends[ut + 2] = sends.size();
  }
  waitAll(sends);
}

}  // namespace terse::comm
