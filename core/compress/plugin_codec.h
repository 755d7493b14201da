// The innermost codec of every chain: it drives one plugin instance (terse::Compressor) for one tensor on the host.
//
// Setup does everything that may allocate or ask the plugin a question (Gloo's habit, docs/STYLE.md 6): caps for the
// tensor's dtype, the two-phase sizes of every round (kept per round), and this tensor's workspace and state, each
// allocated once at the maximum over rounds, aligned to 64 bytes, the state zero-filled (compressor_v1.h,
// terse_compressor_sizes_v1). encode/decode/reduce only fill the per-call fields (step, round, seed, source_rank),
// check their own arguments (round, source rank, null pointers) and forward through the compressor's bound calls
// (compressor.h: no re-validation, no size lookup), which check every per-call size, so the hot path allocates nothing
// and takes no lock. The caps and the sizes' rules are the compressor's to check (core/plugin); this codec trusts them.
//
// makePluginCodec (declared in codec.h) builds one. A CUDA tensor (TensorInfo::device == TERSE_DEVICE_CUDA) needs a
// plugin that advertises TERSE_DEVICE_CUDA and a stream: its workspace and state are then device memory allocated on
// that stream, every plugin call gets the stream, and grad / out / payloads must be device memory of the tensor's
// device (the plugin reads and writes them there; nothing is copied to the host behind the caller's back).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/compress/codec.h"
#include "core/compress/host_array.h"

namespace terse {

// Checks what every codec relies on, whatever the device: dtype known, ndim in 0..4, shape[0..ndim) non-negative
// with product == numel (ndim 0: a flat vector) and unused entries 0, numel * element size fits in 64 bits,
// world_size >= 1, 0 <= rank < world_size. Throws InvalidArgument naming the tensor id and the offending value.
void validateTensorInfo(const TensorInfo& tensor);

class SharedWorkspace {
 public:
  // Grows to at least `bytes` (at a codec's setup: no call allocates).
  void reserve(std::size_t bytes) {
    if (bytes > buffer_.size()) buffer_ = TensorBuffer(bytes, Placement::host());
  }
  std::span<std::byte> span(std::size_t bytes) const { return buffer_.span().first(bytes); }
  std::size_t size() const noexcept { return buffer_.size(); }

 private:
  TensorBuffer buffer_;
};

class PluginCodec final : public TensorCodec {
 public:
  // Throws Unsupported for a dtype the plugin does not handle or a device the plugin does not support (or a CUDA
  // tensor in a build without CUDA); InvalidArgument for a malformed tensor info (see validateTensorInfo), a CUDA
  // tensor without a stream or a host tensor with one.
  PluginCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor, uint64_t run_seed,
              void* stream = nullptr);
  // A host tensor's codec with its workspace in `workspace` (codec.h); InvalidArgument for a CUDA tensor.
  PluginCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor, uint64_t run_seed,
              std::shared_ptr<SharedWorkspace> workspace);

  const CompressorCaps& caps() const override { return caps_; }
  // info().seed is the derived per-run seed (seed.h); step and round are 0, source_rank == rank.
  const TensorInfo& info() const override { return info_; }
  std::span<const CompressorSizes> roundSizes() const override { return sizes_; }
  std::span<const uint64_t> phaseSteps() const override { return compressor_->phaseSteps(); }
  Placement placement() const override { return placement_; }

  uint64_t encode(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                  std::span<std::byte> out) override;
  // With words.prev, in a round after the first, on a device: the plugin's compress_deferred (words.own is not this
  // codec's: it makes no own decode).
  uint64_t encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                          std::span<std::byte> out, EncodeWords words) override;
  bool defersPrevVerdicts() const override { return placement_.device && compressor_->defersPrevVerdicts(); }
  void recheckPrev(uint64_t step, int round, std::span<const std::byte> prev) override;
  void decode(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out, bool accumulate) override;
  bool defersVerdicts() const override { return compressor_->defersVerdicts(); }
  void decodeDeferred(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out, bool accumulate,
                      uint32_t* verdict) override;
  void decodeOwn(uint64_t step, std::span<const std::byte> payload, void* out) override;
  void decodeOwnDeferred(uint64_t step, std::span<const std::byte> payload, void* out, uint32_t* verdict) override;
  using TensorCodec::reduce;
  uint64_t reduce(uint64_t step, int round, std::span<const std::byte> a, std::span<const std::byte> b,
                  std::span<std::byte> out) override;

  const Compressor& compressor() const { return *compressor_; }

 private:
  TensorInfo callInfo(uint64_t step, int round, int source_rank) const;
  // decode, decodeDeferred and decodeOwn: the last round's decompress with `call_flags` (TERSE_CALL_*), deferred when
  // `verdict` is set.
  void decodeAs(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out, bool accumulate,
                uint32_t call_flags, uint32_t* verdict = nullptr);
  Scratch scratch() { return Scratch{shared_ ? shared_->span(workspace_bytes_) : workspace_.span(), state_.span()}; }
  void* stream() const { return placement_.stream; }
  void checkRound(const char* call, int round) const;

  std::shared_ptr<const Compressor> compressor_;
  TensorInfo info_;
  const CompressorCaps& caps_;          // the compressor's own (compressor_ keeps it alive)
  std::vector<CompressorSizes> sizes_;  // one per round, asked once at setup: the tensor's one copy
  Placement placement_;
  TensorBuffer workspace_;  // max over rounds; contents undefined when a step starts; empty with shared_
  std::shared_ptr<SharedWorkspace> shared_;  // the workspace's owner when shared (codec.h)
  std::size_t workspace_bytes_ = 0;          // max over rounds
  TensorBuffer state_;                       // max over rounds; zero-filled once, kept across steps
};

}  // namespace terse
