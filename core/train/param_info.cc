#include "core/train/param_info.h"

#include <algorithm>

#include "terse/compressor_v1.h"

namespace terse::train {

uint64_t chunkTensorId(std::size_t id, int chunk_index) {
  return id + (static_cast<uint64_t>(chunk_index + 1) << 32);
}

TensorInfo paramTensorInfo(const ParamTensor& p, std::size_t id, int rank, int world, int device) {
  TensorInfo info;
  info.dtype = DType::kF32;
  info.numel = p.numel();
  const std::size_t nd = std::min<std::size_t>(p.shape.size(), info.shape.size());
  info.ndim = static_cast<int>(nd);
  for (std::size_t d = 0; d < p.shape.size(); ++d) {
    if (d < nd)
      info.shape[d] = p.shape[d];
    else
      info.shape[nd - 1] *= p.shape[d];
  }
  info.tensor_id = id;
  info.rank = rank;
  info.world_size = world;
  if (device >= 0) {
    info.device = TERSE_DEVICE_CUDA;
    info.device_index = device;
  }
  return info;
}

TensorInfo chunkTensorInfo(const ParamTensor& p, std::size_t id, uint64_t offset, uint64_t numel, int chunk_index,
                           int rank, int world, int device) {
  TensorInfo info = paramTensorInfo(p, id, rank, world, device);
  const uint64_t cols = info.ndim >= 2 ? info.numel / static_cast<uint64_t>(info.shape[0]) : 0;
  info.numel = numel;
  info.shape = {};
  if (cols > 0 && numel % cols == 0 && offset % cols == 0) {
    info.ndim = 2;
    info.shape[0] = static_cast<int64_t>(numel / cols);
    info.shape[1] = static_cast<int64_t>(cols);
  } else {
    info.ndim = 1;
    info.shape[0] = static_cast<int64_t>(numel);
  }
  info.tensor_id = chunkTensorId(id, chunk_index);
  return info;
}

}  // namespace terse::train
