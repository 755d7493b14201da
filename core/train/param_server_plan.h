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
//
// Row-sparse tensors (markRowSparse; an embedding table whose gradient touches few rows, ParamTensor::row_sparse).
// Their pushes and pulls name rows (slices along the first dimension) instead of carrying the whole piece. A piece may
// start or end inside a row (the cut above knows nothing of rows), so a row's part in a piece is the intersection of
// the row's elements with the piece's (rowSegment): both ends derive every length from the row ids alone.
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
  // Per tensor: the elements of one row when the tensor is row-sparse (markRowSparse), 0 when dense (the default).
  std::vector<uint64_t> row_length;
};

// Throws InvalidArgument for num_shards < 1.
PsPlan planShards(std::span<const uint64_t> tensor_numel, int num_shards);

// Marks tensor `tensor` row-sparse with rows of `row_length` elements. Throws InvalidArgument for a tensor out of
// range, a zero row length, one that does not divide the tensor, or more than 2^32 - 1 rows (ids travel as u32).
void markRowSparse(PsPlan& plan, uint32_t tensor, uint64_t row_length);
inline bool isRowSparse(const PsPlan& plan, const PsPiece& p) {
  return p.tensor < plan.row_length.size() && plan.row_length[p.tensor] > 0;
}
// Rows of a row-sparse piece's tensor.
inline uint64_t pieceTensorRows(const PsPlan& plan, const PsPiece& p) {
  return plan.tensor_numel[p.tensor] / plan.row_length[p.tensor];
}
// The part of row `row` of a row-sparse piece's tensor that lies in the piece: [begin, end) relative to the piece's
// first element; begin == end when the row lies outside the piece.
struct RowSegment {
  uint64_t begin = 0, end = 0;
};
RowSegment rowSegment(const PsPlan& plan, const PsPiece& p, uint64_t row);
// The first and one past the last row of the tensor that overlap the piece.
std::pair<uint64_t, uint64_t> pieceRows(const PsPlan& plan, const PsPiece& p);

inline int serverRank(int shard) {
  return shard;
}
inline int workerRank(int num_shards, int worker) {
  return num_shards + worker;
}

}  // namespace terse::train
