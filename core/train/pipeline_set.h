// The compression pipelines of one rank's tensors and of the chunks a scheduler cuts them into (the group scheduler's,
// group_scheduler.h): one per tensor, built up front so that a compressor that cannot serve a tensor fails before
// anything runs, and one per chunk, built the first time that cut is seen and reused after -- its codec state (error
// feedback residuals) is per chunk, its id chunkTensorId's (param_info.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/comm/communicator.h"
#include "core/compress/pipeline.h"
#include "core/plugin/scheduler.h"
#include "core/train/workload.h"

namespace terse::train {

// Builds the pipeline for one tensor or chunk as core describes it (param_info.h: paramTensorInfo for a whole tensor,
// chunkTensorInfo for a chunk; rank, world size and device filled in): the caller chooses the compressor, its
// decorators and seed (make_codec.h) and the communicator the pipeline is validated against. Called for every tensor
// when the trainer is built, and on the communication thread the first time a scheduler cuts a tensor a new way.
using PipelineFactory = std::function<std::unique_ptr<CompressionPipeline>(const TensorInfo& tensor)>;

class PipelineSet {
 public:
  // Builds every tensor's pipeline (tensor id i for params()[i]). Throws InvalidArgument for a null factory or one
  // that returns no pipeline or one of the wrong tensor, size or rank; what the factory throws.
  PipelineSet(Workload& workload, const comm::Communicator& comm, PipelineFactory factory);

  const CompressionPipeline& tensor(std::size_t t) const { return *tensors_.at(t); }
  // The chunk's pipeline: the tensor's own for a chunk that is the whole tensor. Not thread-safe (the communication
  // thread's); throws as the constructor does for a chunk seen the first time.
  CompressionPipeline& chunk(const Chunk& c);
  // Compressor output sent so far, all tensors and chunks: payload bytes less the SUM headers that stay on the rank.
  uint64_t payloadBytes() const;

 private:
  std::unique_ptr<CompressionPipeline> make(const TensorInfo& info);

  Workload& workload_;
  const comm::Communicator& comm_;
  PipelineFactory factory_;
  std::vector<std::unique_ptr<CompressionPipeline>> tensors_;
  std::map<std::tuple<std::size_t, uint64_t, uint64_t>, std::unique_ptr<CompressionPipeline>> chunks_;  // (t, off, n)
};

}  // namespace terse::train
