// Cuts the flat parameter vector into shards and pieces (param_server_plan.h).
#include "core/train/param_server_plan.h"

#include <algorithm>
#include <limits>

#include "core/common/error.h"

namespace terse::train {

PsPlan planShards(std::span<const uint64_t> tensor_numel, int num_shards) {
  TERSE_CHECK(num_shards >= 1, InvalidArgument, "parameter server: num_shards must be >= 1, got " << num_shards);
  PsPlan plan;
  plan.tensor_numel.assign(tensor_numel.begin(), tensor_numel.end());
  plan.num_shards = num_shards;
  std::vector<uint64_t> starts;  // flat start of every tensor, plus the end
  for (uint64_t n : tensor_numel) {
    starts.push_back(plan.total_numel);
    plan.total_numel += n;
  }
  starts.push_back(plan.total_numel);
  const uint64_t total = plan.total_numel;
  const uint64_t S = static_cast<uint64_t>(num_shards);
  const uint64_t tolerance = total / (4 * S);
  std::vector<uint64_t> cuts{0};
  for (uint64_t k = 1; k < S; ++k) {
    // round(k * total / S) without overflow for any realistic total.
    uint64_t ideal = static_cast<uint64_t>((static_cast<long double>(total) * k) / S + 0.5L);
    // The nearest tensor boundary; take it when close enough (keeps a tensor on one shard).
    auto it = std::lower_bound(starts.begin(), starts.end(), ideal);
    uint64_t best = ideal, dist = std::numeric_limits<uint64_t>::max();
    for (auto c : {it, it == starts.begin() ? it : it - 1}) {
      if (c == starts.end()) continue;
      const uint64_t d = *c > ideal ? *c - ideal : ideal - *c;
      if (d < dist) dist = d, best = *c;
    }
    uint64_t cut = dist <= tolerance ? best : ideal;
    cut = std::max(cut, cuts.back());  // monotone: a shard may be empty, never negative
    cuts.push_back(cut);
  }
  cuts.push_back(total);
  plan.shard_pieces.resize(S);
  for (uint64_t k = 0; k < S; ++k) plan.ranges.emplace_back(cuts[k], cuts[k + 1]);
  for (uint32_t t = 0; t < tensor_numel.size(); ++t) {
    const uint64_t tb = starts[t], te = starts[t + 1];
    for (uint64_t k = 0; k < S; ++k) {
      const uint64_t b = std::max(tb, cuts[k]), e = std::min(te, cuts[k + 1]);
      if (b >= e) continue;
      PsPiece p;
      p.id = plan.pieces.size();
      p.tensor = t;
      p.offset = b - tb;
      p.numel = e - b;
      p.flat_begin = b;
      p.shard = static_cast<int>(k);
      plan.shard_pieces[k].push_back(p.id);
      plan.pieces.push_back(p);
    }
  }
  return plan;
}

void markRowSparse(PsPlan& plan, uint32_t tensor, uint64_t row_length) {
  TERSE_CHECK(tensor < plan.tensor_numel.size(), InvalidArgument,
              "parameter server: row-sparse tensor " << tensor << " outside 0.." << plan.tensor_numel.size() - 1);
  const uint64_t n = plan.tensor_numel[tensor];
  TERSE_CHECK(row_length > 0 && n % row_length == 0, InvalidArgument,
              "parameter server: row length " << row_length << " does not divide tensor " << tensor << "'s " << n
                                              << " elements");
  TERSE_CHECK(n / row_length <= std::numeric_limits<uint32_t>::max(), InvalidArgument,
              "parameter server: tensor " << tensor << " has " << n / row_length << " rows; row ids travel as u32");
  plan.row_length.resize(plan.tensor_numel.size(), 0);
  plan.row_length[tensor] = row_length;
}

RowSegment rowSegment(const PsPlan& plan, const PsPiece& p, uint64_t row) {
  const uint64_t len = plan.row_length[p.tensor];
  const uint64_t b = std::max(row * len, p.offset), e = std::min((row + 1) * len, p.offset + p.numel);
  if (b >= e) return {};
  return {b - p.offset, e - p.offset};
}

std::pair<uint64_t, uint64_t> pieceRows(const PsPlan& plan, const PsPiece& p) {
  const uint64_t len = plan.row_length[p.tensor];
  return {p.offset / len, (p.offset + p.numel + len - 1) / len};
}

}  // namespace terse::train
