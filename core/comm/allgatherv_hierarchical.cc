#include "core/comm/allgatherv_hierarchical.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/comm/allgather_bruck.h"
#include "core/comm/allgatherv_ring.h"
#include "core/comm/broadcast_binomial.h"
#include "core/common/error.h"

namespace terse::comm {

void allgathervHierarchical(CollectiveContext& ctx, std::span<const std::byte> send, std::span<std::byte> recv,
                            std::span<const uint64_t> sizes, int ranks_per_node, AllgatherAlgorithm leaders) {
  TERSE_CHECK(ranks_per_node >= 1, InvalidArgument,
              "hierarchical allgatherv: ranks_per_node must be >= 1, got " << ranks_per_node);
  TERSE_CHECK(leaders == AllgatherAlgorithm::kRing || leaders == AllgatherAlgorithm::kBruck, InternalError,
              "hierarchical allgatherv: the leaders run the ring or Bruck, not " << allgatherAlgorithmName(leaders));
  TERSE_CHECK(ctx.group.empty(), InternalError, "hierarchical allgatherv inside a group");
  const int n = ctx.size();
  const int r = ctx.rank();
  const uint64_t total = checkAllgathervArguments(ctx, send, recv, sizes);
  std::vector<uint64_t> offsets(static_cast<std::size_t>(n) + 1, 0);
  std::inclusive_scan(sizes.begin(), sizes.end(), offsets.begin() + 1);
  const auto range = [&](int from, int to) {  // blocks [from, to) of the result
    return recv.subspan(
        static_cast<std::size_t>(offsets[static_cast<std::size_t>(from)]),
        static_cast<std::size_t>(offsets[static_cast<std::size_t>(to)] - offsets[static_cast<std::size_t>(from)]));
  };
  const std::span<std::byte> own = range(r, r + 1);
  if (!send.empty() && send.data() != own.data()) std::memmove(own.data(), send.data(), send.size());
  if (n == 1 || total == 0) return;
  const int per = std::min(ranks_per_node, n);
  const int first = r / per * per;
  const int end = std::min(first + per, n);
  std::vector<int> members(static_cast<std::size_t>(end - first));
  std::iota(members.begin(), members.end(), first);
  const uint64_t seg = ctx.segmentFor(1);
  RequestList sends;
  RequestList recvs;
  LengthList expected;

  if (members.size() > 1) {
    ctx.setGroup(members);
    if (r == first) {
      for (int g = 1; g < ctx.size(); ++g) ctx.recvSegments(g, range(first + g, first + g + 1), seg, recvs, expected);
      waitRecvs(recvs, expected, ctx);
    } else {
      ctx.sendSegments(0, own, seg, sends);
      waitAll(sends);
    }
    ctx.setGroup({});
  }
  if (r == first && n > per) {
    std::vector<int> heads;
    std::vector<uint64_t> node_bytes;
    for (int l = 0; l < n; l += per) {
      heads.push_back(l);
      node_bytes.push_back(offsets[static_cast<std::size_t>(std::min(l + per, n))] -
                           offsets[static_cast<std::size_t>(l)]);
    }
    ctx.setGroup(heads);
    // In place: this node's range is already where the leaders' allgatherv puts it.
    const std::span<std::byte> mine = range(first, end);
    if (leaders == AllgatherAlgorithm::kBruck) {
      allgathervBruck(ctx, mine, recv, node_bytes);
    } else {
      allgathervRing(ctx, mine, recv, node_bytes);
    }
    ctx.setGroup({});
  }
  if (members.size() > 1) {
    ctx.setGroup(members);
    broadcastBinomial(ctx, recv.first(static_cast<std::size_t>(total)), 0);
    ctx.setGroup({});
  }
}

}  // namespace terse::comm
