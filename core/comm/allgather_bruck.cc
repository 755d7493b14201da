#include "core/comm/allgather_bruck.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace terse::comm {

void allgathervBruck(CollectiveContext& ctx, std::span<const std::byte> send, std::span<std::byte> recv,
                     std::span<const uint64_t> sizes) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const uint64_t total = checkAllgathervArguments(ctx, send, recv, sizes);
  // held[j] is the byte offset, at the front of recv, of rank (r + j) mod n's block: blocks arrive in that order,
  // each round's behind the last, so what a round sends is always a prefix.
  std::vector<uint64_t> held(static_cast<std::size_t>(n) + 1, 0);
  for (int j = 0; j < n; ++j)
    held[static_cast<std::size_t>(j) + 1] =
        held[static_cast<std::size_t>(j)] + sizes[static_cast<std::size_t>(modRank(r + j, n))];
  const std::span<std::byte> all = recv.first(static_cast<std::size_t>(total));
  // memmove: in place, the own block lies somewhere in recv and may overlap its new place.
  if (!send.empty() && send.data() != all.data()) std::memmove(all.data(), send.data(), send.size());
  const uint64_t seg = ctx.segmentFor(1);
  RequestList sends;
  RequestList recvs;
  LengthList expected;
  // At the start of every round this rank holds exactly `dist` blocks.
  for (int dist = 1; dist < n; dist *= 2) {
    const auto have = static_cast<std::size_t>(dist);
    const auto count = static_cast<std::size_t>(std::min(dist, n - dist));
    const auto sz = [](uint64_t b) { return static_cast<std::size_t>(b); };
    ctx.recvSegments(modRank(r + dist, n), all.subspan(sz(held[have]), sz(held[have + count] - held[have])), seg, recvs,
                     expected);
    ctx.sendSegments(modRank(r - dist, n), all.first(sz(held[count])), seg, sends);
    waitRecvs(recvs, expected, ctx);
    waitAll(sends);
  }
  // Rank order: rank 0's block is held at position (n - r) mod n, so the held bytes rotate left by its offset.
  // Through the scratch, the shorter side: std::rotate on bytes moves one byte per step.
  const auto left = static_cast<std::size_t>(held[static_cast<std::size_t>(modRank(n - r, n))]);
  const std::size_t right = all.size() - left;
  // A rotation by 0 or by the whole moves nothing; returning also keeps memcpy off the empty scratch's null pointer.
  if (left == 0 || right == 0) return;
  const std::span<std::byte> tmp = ctx.scratchBytes(std::min(left, right));
  if (left <= right) {
    std::memcpy(tmp.data(), all.data(), left);
    std::memmove(all.data(), all.data() + left, right);
    std::memcpy(all.data() + right, tmp.data(), left);
  } else {
    std::memcpy(tmp.data(), all.data() + left, right);
    std::memmove(all.data() + right, all.data(), left);
    std::memcpy(all.data(), tmp.data(), right);
  }
}

void exchangeWordsBruck(CollectiveContext& ctx, uint64_t mine, std::span<uint64_t> all) {
  const std::vector<uint64_t> sizes(static_cast<std::size_t>(ctx.size()), 8);
  exchangeWords(ctx, mine, all, [&](std::span<const std::byte> send, std::span<std::byte> recv) {
    allgathervBruck(ctx, send, recv, sizes);
  });
}

}  // namespace terse::comm
