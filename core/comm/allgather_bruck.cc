#include "core/comm/allgather_bruck.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/common/error.h"

namespace terse::comm {

void allgatherBruck(CollectiveContext& ctx, std::span<const std::byte> send, std::span<std::byte> recv) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const std::size_t b = send.size();
  TERSE_CHECK(recv.size() >= b * static_cast<std::size_t>(n), InvalidArgument,
              "allgather: receive buffer of " << recv.size() << " bytes for " << n << " blocks of " << b);
  // held[j] is rank (r + j) mod n's block: the blocks arrive in that order, each round's behind the last.
  std::vector<std::byte> held(b * static_cast<std::size_t>(n));
  if (b > 0) std::memcpy(held.data(), send.data(), b);
  const uint64_t seg = ctx.segmentFor(1);
  std::vector<Request> sends;
  std::vector<Request> recvs;
  std::vector<uint64_t> expected;
  int have = 1;
  for (int dist = 1; dist < n; dist *= 2) {
    const int count = std::min(dist, n - have);
    const std::span<std::byte> all(held);
    ctx.recvSegments(modRank(r + dist, n), all.subspan(b * static_cast<std::size_t>(have), b * count), seg, recvs,
                     expected);
    ctx.sendSegments(modRank(r - dist, n), all.first(b * static_cast<std::size_t>(count)), seg, sends);
    waitRecvs(recvs, expected, ctx);
    waitAll(sends);
    have += count;
  }
  for (int j = 0; j < n && b > 0; ++j) {
    std::memcpy(recv.data() + b * static_cast<std::size_t>(modRank(r + j, n)),
                held.data() + b * static_cast<std::size_t>(j), b);
  }
}

void exchangeWordsBruck(CollectiveContext& ctx, uint64_t mine, std::span<uint64_t> all) {
  exchangeWords(ctx, mine, all,
                [&](std::span<const std::byte> send, std::span<std::byte> recv) { allgatherBruck(ctx, send, recv); });
}

}  // namespace terse::comm
