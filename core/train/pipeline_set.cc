// The pipelines of a rank's tensors and chunks (pipeline_set.h).
#include "core/train/pipeline_set.h"

#include <string>

#include "core/common/error.h"
#include "core/train/param_info.h"

namespace terse::train {

PipelineSet::PipelineSet(Workload& workload, const comm::Communicator& comm, PipelineFactory factory)
    : workload_(workload), comm_(comm), factory_(std::move(factory)) {
  TERSE_CHECK(factory_ != nullptr, InvalidArgument, "the trainer needs a pipeline factory");
  const auto params = workload.params();
  for (std::size_t i = 0; i < params.size(); ++i)
    tensors_.push_back(make(paramTensorInfo(params[i], i, comm.rank(), comm.size(), workload.device())));
}

std::unique_ptr<CompressionPipeline> PipelineSet::make(const TensorInfo& info) {
  std::unique_ptr<CompressionPipeline> p = factory_(info);
  // The factory is the caller's code: hold it to the tensor it was asked for, since the engine trusts the sizes.
  TERSE_CHECK(p != nullptr, InvalidArgument, "the pipeline factory returned no pipeline for tensor " << info.tensor_id);
  const TensorInfo& got = p->codec().info();
  TERSE_CHECK(got.numel == info.numel && got.tensor_id == info.tensor_id && got.world_size == comm_.size() &&
                  got.rank == comm_.rank(),
              InvalidArgument,
              "the pipeline factory was asked for tensor id "
                  << info.tensor_id << " (" << info.numel << " elements, rank " << comm_.rank() << " of "
                  << comm_.size() << ") and returned one for tensor id " << got.tensor_id << " (" << got.numel
                  << " elements, rank " << got.rank << " of " << got.world_size << ")");
  return p;
}

CompressionPipeline& PipelineSet::chunk(const Chunk& c) {
  const auto t = static_cast<std::size_t>(c.tensor_id);
  if (c.offset == 0 && c.numel == tensors_[t]->codec().info().numel) return *tensors_[t];
  auto& slot = chunks_[{t, c.offset, c.numel}];
  if (!slot) {
    slot = make(chunkTensorInfo(workload_.params()[t], t, c.offset, c.numel, c.chunk_index, comm_.rank(), comm_.size(),
                                workload_.device()));
  }
  return *slot;
}

uint64_t PipelineSet::payloadBytes() const {
  uint64_t total = 0;
  for (const auto& p : tensors_) total += p->stats().payload_bytes - p->stats().unsent_header_bytes;
  for (const auto& [key, p] : chunks_) total += p->stats().payload_bytes - p->stats().unsent_header_bytes;
  return total;
}

}  // namespace terse::train
