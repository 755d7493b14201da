// One tensor's compression state as the aggregation engine (engine.h) drives it: the codec chain (make_codec.h), the
// wire buffers sized once from the codec's two-phase sizes, and the tensor's byte and time counters. The pipeline
// never calls the communicator: the engine is the only code that moves gradients, for a lone tensor (a group of one)
// and for a fused group alike, so the aggregation paths exist once (engine.h has the math).
//
// Every mismatch between the codec and the communicator is an error at construction, before any step runs
// (docs/STYLE.md 5): a wire dtype the communicator cannot sum, a codec built for another rank or world size, a tensor
// in memory the communicator cannot reach, a gradient dtype that cannot be averaged. What a plugin promises is not
// checked again here: core/plugin (compressor_plugin.cc) checks it once and every layer above trusts it -- the caps'
// rules (a SUM compressor has a fixed size, ALLGATHER has one round, CUSTOM has reduce) and the sizes' (a SUM header
// within the payload and the rest whole wire elements, CUSTOM's reduce bound at least the payload's) when the codec is
// bound, and what can change per call -- the size a plugin actually wrote, a fixed size exactly -- in the compressor's
// bound calls. The pipeline's own per-call check is the guard bytes after the buffers it hands the plugin.
//
// Two byte counts are kept apart: payload bytes (what the compressor produced on this rank, all rounds) and wire bytes
// (what this rank's transport sent and received for the tensor's operations, frame headers included, size exchanges
// included; a fused collective's bytes go to its group's first member).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/common/runtime.h"
#include "core/compress/codec.h"
#include "core/compress/tensor_buffer.h"

namespace terse {

struct PipelineStats {
  uint64_t steps = 0;
  uint64_t payload_bytes = 0;  // compressor output of this rank, summed over rounds and steps
  // Of payload_bytes, the SUM payloads' headers (sum_header_bytes): identical on every rank, so the allreduce carries
  // only the summed part after them and each rank keeps its own header (engine.cc). Not on the wire.
  uint64_t unsent_header_bytes = 0;
  comm::WireBytes wire;  // this rank's frames for the tensor, headers included
  // Codec time on this rank's calling thread (steady_clock), kept apart from the collectives so the trainer can report
  // compression cost without subtracting communication from a busy time. encode_s: codec.encode over all rounds,
  // error feedback and momentum correction included (they are decorators inside the codec). decode_s: codec.decode
  // plus, for CUSTOM, the codec.reduce fold -- both turn received payloads into the aggregate, so a compressor whose
  // reduce is costly shows it on the receiving side. The final division by world_size is in neither.
  double encode_s = 0;
  double decode_s = 0;
};

// Throws InvalidArgument (Unsupported for a wire dtype the communicator cannot sum, a dtype that cannot be averaged or
// memory the communicator cannot reach) naming the tensor, the aggregation and the offending value; see the list above.
void validatePipeline(const TensorCodec& codec, const comm::Communicator& comm);

class CompressionPipeline {
 public:
  // Validates the codec against the communicator it will be aggregated over (validatePipeline) and allocates the
  // payload buffers. The pipeline keeps no reference to the communicator.
  CompressionPipeline(std::unique_ptr<TensorCodec> codec, const comm::Communicator& comm);

  // ---- What the engine asks (all fixed at construction).
  Aggregation aggregation() const noexcept { return caps_->aggregation; }
  int rounds() const noexcept { return caps_->num_rounds; }
  bool fixedSize() const noexcept { return caps_->fixed_size; }
  DType wireDtype() const noexcept { return caps_->wire_dtype; }
  uint64_t tensorId() const noexcept { return tensor_; }
  int worldSize() const noexcept { return world_; }
  // Round r's payload bound (its exact size for a fixed-size compressor) and, for SUM, the header bytes that are not
  // summed.
  uint64_t maxPayloadBytes(int round) const noexcept {
    return sizes_[static_cast<std::size_t>(round)].max_output_bytes;
  }
  uint64_t sumHeaderBytes(int round) const noexcept { return sizes_[static_cast<std::size_t>(round)].sum_header_bytes; }
  // Most payload bytes one step produces on this rank: the bounds summed over rounds (exact for fixed-size
  // compressors). What a scheduler sees as a chunk's wire_bytes.
  uint64_t maxPayloadBytes() const noexcept;
  // Where the tensor's buffers live (the codec's placement); the engine's concatenation buffers follow it.
  const Placement& placement() const noexcept { return placement_; }

  // ---- The steps of one aggregation (engine.cc runs them in order).
  // Round `round`'s payload of this rank, timed and counted; prev = the aggregate of round - 1 (empty in round 0).
  // The span points into this pipeline's buffer for the round (SUM alternates two, so round r's aggregate can be round
  // r + 1's prev) and stays valid until that buffer is encoded into again. A fixed-size compressor is held to its size
  // by the compressor's bound call (core/plugin/compressor_plugin.cc), the one place it is checked.
  // With `words` (zeroed words in the tensor's memory, engine.h "Payload checks") and a codec that defers its checks,
  // error feedback's decode of the payload leaves its check in words.own, and the plugin's check of the last round's
  // prev in words.prev (TensorCodec::encodeDeferred); the caller reads them with its run's and calls explainOwnRefusal
  // or explainPrevRefusal for a raised one.
  std::span<std::byte> encode(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                              TensorCodec::EncodeWords words = {});
  // CUSTOM: folds every rank's round-`round` payload (blocks in rank order) with the codec's reduce, left to right on
  // every rank so that every rank decodes the same aggregate. Timed as decode.
  std::span<const std::byte> fold(uint64_t step, int round, std::span<const std::span<const std::byte>> blocks);
  // SUM, CUSTOM: out = decode(aggregate of the last round) / world_size.
  // With `verdict` (a zeroed word in the tensor's memory) and a codec that defers its payload checks
  // (defersVerdicts), the decode leaves its verdict there instead of waiting for it (TensorCodec::decodeDeferred): the
  // caller reads the word once the stream has run the call's work, and for a raised one calls explainRefusal. The
  // division is queued all the same, so a refused tensor's output is left undefined, as a failed step's outputs are.
  void finishAggregate(uint64_t step, std::span<const std::byte> aggregate, void* out, uint32_t* verdict = nullptr);
  // ALLGATHER: out = sum over ranks, in rank order, of decode(rank i's payload), / world_size. `verdicts`: as
  // finishAggregate's, one word per rank in rank order.
  void finishGathered(uint64_t step, std::span<const std::span<const std::byte>> payloads, void* out,
                      uint32_t* verdicts = nullptr);
  // Whether the codec's decodes may leave their verdict in a word (TensorCodec::defersVerdicts).
  bool defersVerdicts() const noexcept { return defers_; }
  // Whether the codec's last round may leave its check of prev in a word (TensorCodec::defersPrevVerdicts): a device's
  // multi-round SUM plugin that exports compress_deferred.
  bool defersPrevVerdicts() const noexcept { return defers_prev_; }
  // The refusal of a payload whose verdict word a deferred decode raised: decodes it again the ordinary way, into
  // scratch memory of the tensor's, which throws the plugin's own message (InvalidPayload). A payload that decode
  // accepts is the plugin's fault: PluginError, naming the tensor and the rank whose payload it is.
  [[noreturn]] void explainRefusal(uint64_t step, std::span<const std::byte> payload, int source_rank);
  // The refusal of this rank's own last payload, whose own-decode word (encode's own_verdict) was raised: where the
  // payload is still as encode wrote it (ALLGATHER and CUSTOM keep it; a SUM was summed over it), decoded again the
  // ordinary way for the plugin's own message; else InvalidPayload naming the tensor and the step. Either way error
  // feedback's residual is as it was before the step.
  [[noreturn]] void explainOwnRefusal(uint64_t step);
  // The refusal of the last round's prev, whose word (encode's words.prev) was raised: that prev, the aggregate of the
  // round before, is still in this pipeline's other payload buffer (SUM alternates two), and the plugin's compress is
  // run on it again the ordinary way (TensorCodec::recheckPrev), which throws its own message; if compress accepts it,
  // PluginError. Error feedback's residual and the plugin's state are as they were before the step.
  [[noreturn]] void explainPrevRefusal(uint64_t step);
  // Wire bytes of a collective attributed to this pipeline.
  void addWire(const comm::WireBytes& w) { stats_.wire += w; }
  // Which codec a simulation charges this pipeline's compress and decompress as (rt::Cost::codec): the run's
  // compressor (rt::kRunCodec, the default) or the dense warm-up's (rt::kDenseCodec; sync_trainer.h), each calibrated
  // under its own keys.
  void chargeAs(int codec) noexcept { cost_codec_ = codec; }

  TensorCodec& codec() noexcept { return *codec_; }
  const TensorCodec& codec() const noexcept { return *codec_; }
  const PipelineStats& stats() const noexcept { return stats_; }

 private:
  // explainRefusal's and explainOwnRefusal's second look: `decode(scratch)` decodes the refused payload the ordinary
  // way into scratch memory of the tensor's, which throws the plugin's message; if it does not, PluginError naming
  // whose payload it was ("the aggregate", "rank 2's", ...).
  [[noreturn]] void redecode(const std::function<void(void*)>& decode, const std::string& whose, uint64_t step);
  // out = 0 (the ALLGATHER path's accumulation start) and out /= world_size, in the tensor's memory.
  void zeroOut(void* out) const;
  void average(void* out) const;
  // A codec with aggregate-side state (TensorCodec::keepsAggregateState, EF21) gets the step's decoded aggregate in
  // `out`, with the decodes' verdict words (null where they checked themselves), charged as a pass of its own.
  void commitAggregate(uint64_t step, void* out, const uint32_t* verdicts, std::size_t count);

  std::unique_ptr<TensorCodec> codec_;
  // The compressor's caps and the codec's per-round sizes, viewed, not copied (the codec, owned above, keeps both): the
  // hot path reads them without a virtual call.
  const CompressorCaps* caps_ = nullptr;
  std::span<const CompressorSizes> sizes_;
  int world_ = 1;
  uint64_t tensor_ = 0;
  int cost_codec_ = rt::kRunCodec;
  bool defers_ = false;       // codec_->defersVerdicts(), asked once
  bool defers_prev_ = false;  // codec_->defersPrevVerdicts() for a SUM of several rounds, asked once
  uint64_t last_bytes_ = 0;   // the last encode's payload size (explainOwnRefusal)
  // The last encode that left its check of prev in a word: its round and prev (explainPrevRefusal).
  int deferred_prev_round_ = -1;
  std::span<const std::byte> deferred_prev_;
  PipelineStats stats_;
  // In the tensor's memory (the codec's placement), like every buffer the engine hands the communicator.
  Placement placement_;
  // SUM: two payload buffers (round r's aggregate is round r+1's prev). ALLGATHER/CUSTOM: [0] is the local payload.
  // Host buffers the plugin writes (payload, fold outputs) carry kGuardBytes of a known pattern after their end,
  // checked after every call: a plugin writing past its output is named at the call that did it, not found later as a
  // corrupted heap. Device buffers have none (checking would cost a copy per call).
  static constexpr std::size_t kGuardBytes = 64;
  static constexpr std::byte kGuardByte{0xA5};
  TensorBuffer guardedBuffer(uint64_t bytes) const;
  std::span<std::byte> usable(const TensorBuffer& buf) const noexcept;
  void checkGuard(const TensorBuffer& buf, const char* call) const;

  std::array<TensorBuffer, 2> payload_;
  std::array<TensorBuffer, 2> reduced_;  // CUSTOM: the fold's two alternating outputs
};

// The average of a sum of `world` ranks' gradients, in place: what every pipeline does after its decode (the same
// division, so the same bits), for a caller that summed the gradient itself (the PyTorch hook with an identity
// compressor, ddp_aggregator.h). Unsupported for a dtype other than f32, f64, f16 and bf16.
void averageSummed(void* out, uint64_t numel, DType dtype, int world, const Placement& placement);

}  // namespace terse
