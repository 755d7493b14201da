// How a parameter-server job (param_server_shard.h) is laid out: which rank is which shard or worker, and how the flat
// parameter vector is cut into the pieces that shards own and workers push.
//
// Ranks. In a job of S + W ranks, server shard k is rank k and worker w is rank S + w (serverRank / workerRank).
//
// Sharding (planShards). The flat vector (tensors concatenated in order, numel elements each) is cut into S
// contiguous ranges balanced by element count: cut k ideally sits at round(k * total / S); it is snapped to the
// nearest tensor boundary when one lies within total / (4 S) of it (a tensor then lives on one shard, one push per
// tensor), otherwise the tensor is split there (a large tensor must not unbalance the shards by more than that). The
// part of tensor t on shard k is a piece: the unit of push, of codec state, of versioning. Empty tensors have no piece.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace terse::train {

struct PsPiece {
  uint64_t id = 0;          // index into PsPlan::pieces (the codec's tensor id, the frame's accounting label)
  uint32_t tensor = 0;      // which tensor
  uint64_t offset = 0;      // first element inside the tensor
  uint64_t numel = 0;       // > 0
  uint64_t flat_begin = 0;  // first element in the flat vector
  int shard = 0;
};

struct PsPlan {
  std::vector<uint64_t> tensor_numel;
  int num_shards = 0;
  uint64_t total_numel = 0;
  std::vector<PsPiece> pieces;                        // in flat order
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // per shard: [begin, end) of the flat vector
  std::vector<std::vector<uint64_t>> shard_pieces;    // per shard: its piece ids in flat order
};

// Throws InvalidArgument for num_shards < 1.
PsPlan planShards(std::span<const uint64_t> tensor_numel, int num_shards);

inline int serverRank(int shard) {
  return shard;
}
inline int workerRank(int num_shards, int worker) {
  return num_shards + worker;
}

}  // namespace terse::train
