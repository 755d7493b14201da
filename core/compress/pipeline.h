// The per-tensor compression pipeline (DESIGN.md section 2): one tensor's codec chain (make_codec.h) driven through
// the communicator along the aggregation path its caps name (compressor_v1.h):
//
//   for round r in 0..R-1:
//     payload_r = codec.encode(step, r, grad, prev)        prev = aggregate of round r-1 (empty in round 0)
//     SUM:        allreduce payload_r's bytes after sum_header_bytes as caps.wire_dtype  -> aggregate_r
//     ALLGATHER:  allgatherv every rank's payload_r (sizes exchanged first unless fixed)  (R must be 1)
//     CUSTOM:     allgatherv raw payloads, fold codec.reduce in rank order on every rank  -> aggregate_r
//   SUM, CUSTOM: out = decode(aggregate_{R-1}, source_rank -1)
//   ALLGATHER:   out = 0; out += decode(payload_i, source_rank i) for every rank i
//   out /= world_size                                      (the decoded aggregate is the SUM of contributions)
//
// Per-tensor state (error-feedback residuals, plugin state, workspace) lives in the codec; the pipeline owns only the
// wire buffers, sized once from the codec's two-phase sizes, so step() allocates nothing. Every caps/path mismatch is
// an error at construction, before any step runs (STYLE.md 5): a SUM compressor without a fixed size, a wire dtype the
// communicator cannot sum, a SUM header that is not whole wire elements, a multi-round ALLGATHER, a CUSTOM reduce bound
// below the payload bound, a codec built for another rank or world size.
//
// Two byte counts are kept apart: payload bytes (what the compressor produced on this rank, all rounds) and wire bytes
// (what this rank's transport sent and received for the tensor's operations, frame headers included, size exchanges
// included).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/comm/communicator.h"
#include "core/compress/codec.h"
#include "core/compress/tensor_buffer.h"

namespace terse {

struct PipelineStats {
  uint64_t steps = 0;
  uint64_t payload_bytes = 0;  // compressor output of this rank, summed over rounds and steps
  comm::WireBytes wire;        // this rank's frames for the tensor, headers included
  // Codec time on this rank's calling thread (steady_clock), kept apart from the collectives so the trainer can report
  // compression cost without subtracting communication from a busy time. encode_s: codec.encode over all rounds,
  // error feedback and momentum correction included (they are decorators inside the codec). decode_s: codec.decode
  // plus, for CUSTOM, the codec.reduce fold -- both turn received payloads into the aggregate, so a compressor whose
  // reduce is costly shows it on the receiving side. The final division by world_size is in neither.
  double encode_s = 0;
  double decode_s = 0;
};

// Throws InvalidArgument (Unsupported for a wire dtype the communicator cannot sum) naming the tensor, the aggregation
// and the offending value; see the list above.
void validatePipeline(const TensorCodec& codec, const comm::Communicator& comm);

class CompressionPipeline {
 public:
  // Validates (validatePipeline) and allocates the wire buffers. The communicator must outlive the pipeline.
  CompressionPipeline(std::unique_ptr<TensorCodec> codec, comm::Communicator& comm);

  // One step: grad (numel elements of the tensor's dtype) in, out = the average over ranks of the decoded aggregate.
  // Every rank calls it for the same tensors in the same order (the collectives inside must match). grad and out may
  // be the same buffer.
  void step(uint64_t step, const void* grad, void* out);

  // ---- Fused groups (fused_group.h): several pipelines' payloads go through one collective over their concatenation.
  // Only single-round SUM and ALLGATHER pipelines take part; the math is the unfused one (a sum of a concatenation is
  // the concatenation of the sums; gathered payloads are decoded per rank in rank order exactly as step() does).

  bool fusible() const noexcept;
  // Most payload bytes one step produces on this rank: max_output_bytes summed over rounds (exact for fixed-size
  // compressors). What a scheduler sees as a chunk's wire_bytes.
  uint64_t maxPayloadBytes() const noexcept;
  // Round 0's payload of this rank (timed and counted as in step()); the span points into this pipeline's buffer and
  // stays valid until the next call. fusible() must hold.
  std::span<std::byte> encodeForFusion(uint64_t step, const void* grad);
  // SUM: the payload buffer's body [sum_header_bytes, size) now holds the sum over ranks -> out = the average.
  void finishSum(uint64_t step, void* out);
  // ALLGATHER: every rank's round-0 payload of this tensor, in rank order -> out = the average of their decodes.
  void finishGathered(uint64_t step, std::span<const std::span<const std::byte>> payloads, void* out);
  // Wire bytes of a fused collective attributed to this pipeline (fused_group.h gives them to the group's first).
  void addWire(const comm::WireBytes& w) { stats_.wire += w; }

  Aggregation aggregation() const noexcept { return codec_->caps().aggregation; }
  TensorCodec& codec() noexcept { return *codec_; }
  const TensorCodec& codec() const noexcept { return *codec_; }
  const PipelineStats& stats() const noexcept { return stats_; }
  // Where the tensor's buffers live (the codec's placement); FusedGroupRunner concatenates payloads there.
  const Placement& placement() const noexcept { return placement_; }

 private:
  // Gathers this rank's payload from every rank into gathered_; sizes_ holds each rank's size afterwards.
  void gather(std::span<const std::byte> local, uint64_t max_bytes);
  std::span<const std::byte> gatheredBlock(int rank) const;
  // out = 0 (the ALLGATHER path's accumulation start) and out /= world_size, in the tensor's memory.
  void zeroOut(void* out) const;
  void average(void* out) const;

  std::unique_ptr<TensorCodec> codec_;
  comm::Communicator& comm_;
  int world_ = 1;
  uint64_t tensor_ = 0;
  PipelineStats stats_;
  // In the tensor's memory (the codec's placement), like every buffer the pipeline hands the communicator.
  Placement placement_;
  // SUM: two payload buffers (round r's aggregate is round r+1's prev). ALLGATHER/CUSTOM: [0] is the local payload.
  std::array<TensorBuffer, 2> payload_;
  TensorBuffer gathered_;                // ALLGATHER, CUSTOM: world_size * max payload
  std::array<TensorBuffer, 2> reduced_;  // CUSTOM: the fold's two alternating outputs
  std::vector<uint64_t> sizes_;          // bytes of each rank's gathered payload
};

}  // namespace terse
