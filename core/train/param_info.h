// What a compressor sees of a parameter tensor (TensorInfo), and of a chunk a scheduler cut from it. Kept in core so
// that every front end (the in-process runner, the multi-process runner, tests) builds codecs for the same tensors with
// the same ids: a chunk's id decides its random streams (random-k's shared seed, stochastic rounding), so two rules
// would give two results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/plugin/compressor.h"
#include "core/train/workload.h"

namespace terse::train {

// The chunk_index-th chunk of tensor `id` gets the id id + (chunk_index + 1) << 32: the chunks' random streams stay
// apart from each other and from the whole tensor's (whose id is `id`, below 2^32 for any workload).
uint64_t chunkTensorId(std::size_t id, int chunk_index);

// Parameter tensor `id` of rank `rank` of `world`, f32; at most 4 dimensions (the ABI's shape), more folded into the
// last, which keeps a matrix view (rows = first dimension) for PowerSGD. On CUDA device `device` when it is >= 0 (a
// device workload's tensor), on the host otherwise.
TensorInfo paramTensorInfo(const ParamTensor& p, std::size_t id, int rank, int world, int device = -1);

// A scheduler's chunk of that tensor: numel elements from `offset`, the chunk_index-th. Whole rows of the tensor's
// matrix view keep the matrix shape (PowerSGD factors it), anything else is a vector; its id is chunkTensorId's.
TensorInfo chunkTensorInfo(const ParamTensor& p, std::size_t id, uint64_t offset, uint64_t numel, int chunk_index,
                           int rank, int world, int device = -1);

}  // namespace terse::train
