// Per-tensor compression as the pipeline drives it: one TensorCodec per gradient tensor (or chunk), with every
// buffer sized from the plugin's two-phase answers and allocated once at setup, so encode/decode allocate nothing.
// Decorators (error feedback, momentum correction) wrap any TensorCodec and keep the same interface, so the pipeline
// never knows which compressor or which decorators it drives (BytePS's habit, docs/STYLE.md 8).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/compress/tensor_buffer.h"
#include "core/plugin/compressor.h"

namespace terse {

class TensorCodec {
 public:
  virtual ~TensorCodec() = default;

  // The compressor instance's own caps (Compressor::caps, checked in core/plugin): a reference, not a copy.
  virtual const CompressorCaps& caps() const = 0;
  // The tensor this codec serves: dtype, numel, shape, tensor id, rank, world size, device. step/round/seed/source
  // are per call.
  virtual const TensorInfo& info() const = 0;
  // The plugin's sizes, one per round (caps().num_rounds of them), asked once when the tensor was bound and checked
  // against the caps then (Compressor::sizes). The one per-tensor copy: the pipeline and the engine read them here.
  virtual std::span<const CompressorSizes> roundSizes() const = 0;
  // The compressor instance's phases (Compressor::phaseSteps, terse/phases_v1.h): where the work of a call changes.
  virtual std::span<const uint64_t> phaseSteps() const { return {}; }
  // The phase of `step`: how many of phaseSteps() are at or below it (0 before the first, and always for a compressor
  // of one phase). What a simulation charges a call as (rt::Cost::phase).
  int phaseAt(uint64_t step) const;
  // Round `round`'s sizes; throws InvalidArgument outside 0..caps().num_rounds - 1.
  const CompressorSizes& sizes(int round) const;
  // Where the tensor's buffers live and, on a device, the stream every call of this codec is ordered on: grad, out,
  // payloads and prev of the calls below are memory of that placement. Decorators forward their inner codec's.
  virtual Placement placement() const = 0;

  // Writes round `round`'s payload for `step` into out and returns its size. `grad` holds info().numel elements of
  // info().dtype; the same gradient is passed in every round of a step. `prev` is the aggregate of round - 1 (empty in
  // round 0).
  virtual uint64_t encode(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                          std::span<std::byte> out) = 0;
  // out = decoded payload of the last round (out += when accumulate). source_rank: whose payload, -1 for an
  // aggregate. The payload is untrusted and is validated by the plugin.
  virtual void decode(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out,
                      bool accumulate) = 0;
  // decode with the payload check's verdict left in `verdict`, a zeroed word in the tensor's memory that the caller
  // reads once the call's work has run (Compressor::decompressDeferred, terse/device_verdict_v1.h): on a device, no
  // synchronization a call. A raised word is a refused payload, the output as it was; decode on the same payload then
  // throws the refusal's message. The default is decode's, which leaves the word alone.
  // Whether decodeDeferred may leave its verdict in the word (the plugin exports the entry point); decorators forward
  // their inner codec's answer.
  virtual bool defersVerdicts() const { return false; }
  virtual void decodeDeferred(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out,
                              bool accumulate, uint32_t* verdict) {
    (void)verdict;
    decode(step, payload, source_rank, out, accumulate);
  }
  // The words a deferred encode leaves its checks in: zeroed words in the tensor's memory that the caller reads with
  // its run's decode words (engine.h, "Payload checks"), or null.
  struct EncodeWords {
    // The last round's decode of this rank's own payload (error feedback's D(C(p)), on a device): every state update
    // that depends on that decode (the residual, DGC's momentum) is skipped on the device when the word is raised.
    uint32_t* own = nullptr;
    // The plugin's check of the last round's `prev` (Compressor::compressDeferred, on a device): when raised, the
    // payload and the workspace are undefined, no state is written, and the step's decodes of the tensor refuse.
    uint32_t* prev = nullptr;
  };
  // encode, where the checks above leave their verdicts in `words` instead of waiting for them. A raised word fails
  // the step with the state as it was. The default is encode's, which leaves the words alone.
  virtual uint64_t encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                                  std::span<std::byte> out, EncodeWords words) {
    (void)words;
    return encode(step, round, grad, prev, out);
  }
  // Whether encodeDeferred may leave the check of prev in words.prev (the plugin exports compress_deferred);
  // decorators forward their inner codec's answer.
  virtual bool defersPrevVerdicts() const { return false; }
  // The refusal of a last round's `prev` whose word encodeDeferred raised: runs the plugin's compress of `round` on it
  // the ordinary way, with an input of zeros and into scratch memory, which throws the plugin's own message. Returns
  // when compress accepts it (the caller reports the plugin). Decorators forward it and touch none of their state;
  // the default returns at once.
  virtual void recheckPrev(uint64_t step, int round, std::span<const std::byte> prev) {
    (void)step;
    (void)round;
    (void)prev;
  }
  // decodeOwn with its check left in `verdict`, as decodeDeferred's. The default is decodeOwn's.
  virtual void decodeOwnDeferred(uint64_t step, std::span<const std::byte> payload, void* out, uint32_t* verdict) {
    (void)verdict;
    decodeOwn(step, payload, out);
  }
  // out = this rank's own last-round payload of `step` decoded, not accumulated: error feedback's D(C(p)), right after
  // encode wrote the payload. Trusted, so a plugin may decode it without validating it (TERSE_CALL_OWN_PAYLOAD: on a
  // device, no synchronization for a verdict). Only for a payload this codec's encode wrote and nothing has touched
  // since; anything else goes through decode. The default is decode's.
  virtual void decodeOwn(uint64_t step, std::span<const std::byte> payload, void* out) {
    decode(step, payload, info().rank, out, false);
  }
  // Whether aggregated() does anything (EF21): the pipeline then charges it a pass of its own, and calls it.
  // Decorators forward; the default is false.
  virtual bool keepsAggregateState() const { return false; }
  // Once a step, after the step's aggregate was decoded into `out` (the sum of every rank's decoded contribution,
  // before the pipeline divides it by the world size): a decorator that keeps state on the aggregate's side (EF21's
  // sum of the estimates, ef21.h) updates `out` and that state here. `verdicts`: the `count` words the step's deferred
  // decodes left their verdicts in (in the tensor's memory), or null where the decodes checked their payloads
  // themselves; on a device a raised word leaves out and the state as they were. Decorators forward; the default
  // does nothing.
  virtual void aggregated(uint64_t step, void* out, const uint32_t* verdicts, std::size_t count) {
    (void)step;
    (void)out;
    (void)verdicts;
    (void)count;
  }
  // CUSTOM aggregation: out = a (+) b for `round`'s payloads (the ABI folds every round's payloads, and a plugin's
  // reduce sees info.round); out.size() >= sizes(round).max_reduced_bytes. Returns the size.
  virtual uint64_t reduce(uint64_t step, int round, std::span<const std::byte> a, std::span<const std::byte> b,
                          std::span<std::byte> out) = 0;
  // The last round's reduce, the only one a single-round compressor has. Implementations add
  // `using TensorCodec::reduce;` so this overload stays visible through their own type.
  uint64_t reduce(uint64_t step, std::span<const std::byte> a, std::span<const std::byte> b, std::span<std::byte> out) {
    return reduce(step, caps().num_rounds - 1, a, b, out);
  }
};

// A decorator's base (docs/STYLE.md 8): owns the inner codec and forwards every call a decorator leaves alone, so
// that error feedback, EF21 and momentum correction each write only what they change: what they hand the inner codec
// to compress (encodeDeferred, which each must define) and, for state on the aggregate's side, aggregated. decodeOwn
// is not forwarded: a decorator's own decode is the inner decode of the payload (TensorCodec's default), and the
// decorators call their inner codec's decodeOwn themselves.
class CodecDecorator : public TensorCodec {
 public:
  const CompressorCaps& caps() const override { return inner_->caps(); }
  const TensorInfo& info() const override { return inner_->info(); }
  std::span<const CompressorSizes> roundSizes() const override { return inner_->roundSizes(); }
  std::span<const uint64_t> phaseSteps() const override { return inner_->phaseSteps(); }
  Placement placement() const override { return inner_->placement(); }
  uint64_t encode(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                  std::span<std::byte> out) override {
    return encodeDeferred(step, round, grad, prev, out, {});
  }
  uint64_t encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                          std::span<std::byte> out, EncodeWords words) override = 0;
  void decode(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out, bool accumulate) override {
    inner_->decode(step, payload, source_rank, out, accumulate);
  }
  bool defersVerdicts() const override { return inner_->defersVerdicts(); }
  void decodeDeferred(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out, bool accumulate,
                      uint32_t* verdict) override {
    inner_->decodeDeferred(step, payload, source_rank, out, accumulate, verdict);
  }
  bool defersPrevVerdicts() const override { return inner_->defersPrevVerdicts(); }
  void recheckPrev(uint64_t step, int round, std::span<const std::byte> prev) override {
    inner_->recheckPrev(step, round, prev);
  }
  bool keepsAggregateState() const override { return inner_->keepsAggregateState(); }
  void aggregated(uint64_t step, void* out, const uint32_t* verdicts, std::size_t count) override {
    inner_->aggregated(step, out, verdicts, count);
  }
  using TensorCodec::reduce;
  uint64_t reduce(uint64_t step, int round, std::span<const std::byte> a, std::span<const std::byte> b,
                  std::span<std::byte> out) override {
    return inner_->reduce(step, round, a, b, out);
  }

 protected:
  // Throws InvalidArgument "<who>: inner codec is null" for a null `inner`.
  CodecDecorator(std::unique_ptr<TensorCodec> inner, const char* who);
  TensorCodec& inner() const noexcept { return *inner_; }

  // The encode of a decorator that fixes an input in round 0 of a step and has the inner codec encode it in every
  // round (error feedback, EF21). Checks the round: InvalidArgument, `where` leading the message, for one outside the
  // inner codec's rounds or out of order (round 0 may restart a step at any time; round r > 0 must follow round r - 1
  // of the same step, or it would encode a stale or missing input). Calls stage() in round 0, then has the inner codec
  // encode `input` into `out` (words.prev to its last round's check of prev: TensorCodec::encodeDeferred). After the
  // last round it decodes this rank's own payload into `decoded` -- trusted, so the plugin may skip its validation
  // (on a device, a synchronization); on a device with a caller that reads it, the check is left in words.own instead
  // of waited for -- and calls finish(gate), gate being words.own where the check went there, else null: a state
  // update on the device skips itself when the gate is raised. Returns the payload's size.
  template <class Stage, class Finish>
  uint64_t encodeStaged(const std::string& where, uint64_t step, int round, const float* input,
                        std::span<const std::byte> prev, std::span<std::byte> out, EncodeWords words, float* decoded,
                        Stage&& stage, Finish&& finish) {
    const int rounds = inner_->caps().num_rounds;
    checkRound(where, step, round, rounds);
    if (round == 0) {
      stage();
      step_ = step;
    }
    // A prev refused through words.prev leaves the payload undefined; the plugin's decode of it below then refuses
    // (terse/device_verdict_v1.h), so no state moves.
    const uint64_t bytes = words.prev != nullptr
                               ? inner_->encodeDeferred(step, round, input, prev, out, EncodeWords{.prev = words.prev})
                               : inner_->encode(step, round, input, prev, out);
    checkWritten(where, bytes, out.size());
    next_round_ = round + 1;
    if (round == rounds - 1) {
      // For a multi-round compressor the plugin's workspace still holds the earlier rounds' aggregates, which the
      // last round's payload is decoded against.
      const std::span<const std::byte> own = out.first(static_cast<std::size_t>(bytes));
      const bool deferred = placement().device && words.own != nullptr && inner_->defersVerdicts();
      if (deferred) {
        inner_->decodeOwnDeferred(step, own, decoded, words.own);
      } else {
        inner_->decodeOwn(step, own, decoded);
      }
      finish(deferred ? static_cast<const uint32_t*>(words.own) : nullptr);
      next_round_ = 0;  // only round 0 (a new step) may come next
    }
    return bytes;
  }
  // Forgets any step in progress: the next encode must be a round 0.
  void resetRounds() noexcept {
    step_ = 0;
    next_round_ = 0;
  }

 private:
  void checkRound(const std::string& where, uint64_t step, int round, int rounds) const;
  static void checkWritten(const std::string& where, uint64_t bytes, std::size_t capacity);

  std::unique_ptr<TensorCodec> inner_;
  // encodeStaged's step in progress, so that a round out of order is an error rather than a silently wrong state.
  uint64_t step_ = 0;
  int next_round_ = 0;
};

// The codec that calls a plugin instance directly, owning this tensor's workspace and state (in the tensor's memory).
// `run_seed` is the experiment's seed: with TERSE_CAP_SHARED_SEED every rank gets the same info.seed, otherwise a
// per-rank seed derived from it, so independent stochastic rounding stays independent across ranks. `stream` (a
// cudaStream_t) is required for a CUDA tensor and must be null for a host one.
std::unique_ptr<TensorCodec> makePluginCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor,
                                             uint64_t run_seed, void* stream = nullptr);

// Scratch memory that host codecs take turns with (plugin_codec.h): a workspace's contents are undefined when a call
// starts, so codecs that never run at the same time -- one thread's, called in turn, like a parameter-server shard's W
// codecs of a piece -- need one workspace between them rather than one each.
class SharedWorkspace;
// A host tensor's plugin codec whose workspace is `workspace`'s, grown here to this codec's need; its state stays its
// own. Every codec of one SharedWorkspace must be called from one thread at a time.
std::unique_ptr<TensorCodec> makePluginCodec(std::shared_ptr<const Compressor> compressor, const TensorInfo& tensor,
                                             uint64_t run_seed, std::shared_ptr<SharedWorkspace> workspace);

}  // namespace terse
