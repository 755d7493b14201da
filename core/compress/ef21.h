// EF21 (Richtárik, Sokolov, Fatkhullin 2021, "EF21: A New, Simpler, Theoretically Better, and Practically Faster
// Error Feedback", NeurIPS; Algorithm 1) and EF21-SGDM (Fatkhullin, Tyurin, Richtárik 2023, "Momentum Provably Improves
// Error Feedback!", NeurIPS; Algorithm 2), as a decorator around any compressor whose aggregate is the sum of what the
// ranks sent (SUM or ALLGATHER aggregation).
//
// Where error feedback (error_feedback.h) compresses the gradient plus what earlier steps failed to send, EF21 keeps
// on every rank i an estimate h_i of its own gradient and compresses only how far that estimate is off; every rank
// also keeps H, the sum of all ranks' estimates, and the optimizer steps on H / W:
//
//   v_t     = (1 - eta) v_{t-1} + eta g_t        (EF21-SGDM's momentum; eta = 1: v_t = g_t, plain EF21, no buffer)
//   payload = C(v_t - h_t)
//   h_{t+1} = h_t + D(C(v_t - h_t))              (D(C(.)): this rank's own payload decoded locally)
//   H_{t+1} = H_t + sum_i D_i                    (the step's aggregate, decoded: every rank's D(C(.)) summed)
//   out     = H_{t+1}                            (the pipeline then divides by W: the mean of the estimates)
//
// h_0 = H_0 = 0, so the first step sends C(g_1) (the paper starts from h_0 = g_0, sent whole; its analysis allows any
// h_0), and v_1 = g_1 (the momentum starts at the first gradient, not at zero, so the first steps are not shrunk by
// eta). With a contractive compressor (top-k) EF21's estimates converge to the gradients when those change slowly;
// its analysis needs no bounded-gradient assumption, unlike EF's. With stochastic gradients plain EF21's estimates
// follow the noise; EF21-SGDM's momentum averages it out (eta of 0.1 in the paper's experiments), and is then the
// step's momentum: the optimizer runs without its own (rule `error-feedback`).
//
// H = sum_i h_i holds up to f32 rounding: H adds the ranks' decoded contributions in the aggregate's order, each h_i
// its own. Both start at zero, and every rank decodes the same aggregate, so the ranks agree on H exactly. What a sum
// on the wire rounds away stays in H for good (EF21 never sends it again), so a SUM compressor must sum in f32: a
// 16-bit wire (fp16, bf16) is refused, as its every sum would move H by 2^-8 to 2^-11 of itself, step after step.
//
// A step's state changes at once, in aggregated(), which the pipeline calls once the step's aggregate is decoded:
// encode only stages h + D(C(v_t - h_t)) and v_t, and aggregated() commits them with H. A step that fails anywhere
// before (a throw, or on a device a raised verdict word: this rank's own decode's, remembered from encode, or any of
// the step's decodes', which aggregated() reads) leaves h, v and H as they were, and the next step starts from them.
// aggregated() copies what encode staged, so calling it again for the same step (calibration's timed repetitions)
// changes nothing but H. Rounds must come in order 0..R-1; round 0 may restart a step at any time.
//
// Not for a CUSTOM-aggregation compressor (majority vote: the aggregate is not the sum of what was sent), not around
// momentum correction (DGC's velocity is error feedback's residual), not where no aggregate is decoded on every rank
// (the parameter server: the config refuses EF21 there, rule `error-feedback`). f32 only, as error feedback.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/compress/codec.h"
#include "core/compress/tensor_buffer.h"

namespace terse {

class Ef21 final : public CodecDecorator {
 public:
  // eta: EF21-SGDM's momentum in (0, 1], 1 for plain EF21. Throws InvalidArgument for a null inner codec or an eta
  // outside (0, 1] (naming it), Unsupported for a non-f32 tensor, a CUSTOM-aggregation compressor or a SUM one whose
  // wire dtype is not f32.
  explicit Ef21(std::unique_ptr<TensorCodec> inner, double eta = 1.0);

  // Round 0 stages v_t and the input v_t - h_t; every round encodes that input; the last round stages
  // h + D(C(v_t - h_t)) for aggregated() to commit. Throws InvalidArgument for a round out of order. On a device with
  // a plugin that defers its verdicts, the own decode leaves its check in words.own, which aggregated() reads on the
  // device before it commits anything.
  uint64_t encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                          std::span<std::byte> out, EncodeWords words) override;
  // Commits the step: h and v take what encode staged, out += H, then H = out (the decoded sum of the step's
  // contributions becomes the sum of the estimates); nothing when a verdict word is raised (see the top).
  void aggregated(uint64_t step, void* out, const uint32_t* verdicts, std::size_t count) override;
  bool keepsAggregateState() const override { return true; }

  // h: this rank's estimate after the last completed step (numel floats, in the tensor's memory).
  std::span<const float> estimate() const { return floats(estimate_); }
  // H: the sum of every rank's estimate, as the last aggregated() left it.
  std::span<const float> estimateSum() const { return floats(sum_); }
  // v: the momentum after the last completed step; empty for plain EF21 (eta 1).
  std::span<const float> momentum() const { return floats(momentum_); }
  // D(C(v_t - h_t)) of the last encoded step.
  std::span<const float> transmitted() const { return floats(transmitted_); }
  float eta() const noexcept { return eta_; }
  // Forgets the estimates, the momentum and any step in progress.
  void reset();

 private:
  static std::span<const float> floats(const TensorBuffer& b) { return {b.as<const float>(), b.count<float>()}; }

  float eta_;
  Placement placement_;
  std::size_t n_ = 0;
  TensorBuffer estimate_;     // h, persistent
  TensorBuffer sum_;          // H, persistent
  TensorBuffer momentum_;     // v, persistent (EF21-SGDM only)
  TensorBuffer staged_;       // v_t of the step in progress (EF21-SGDM only)
  TensorBuffer input_;        // v_t - h_t, fixed from round 0 to the last round of one step
  TensorBuffer transmitted_;  // D(C(v_t - h_t)) of the last encoded step
  TensorBuffer next_;         // h + D(C(v_t - h_t)): the estimate aggregated() commits
  // One uint32 word, in the tensor's memory so that a kernel reads and writes it in stream order: nonzero once v holds
  // a first gradient (EF21-SGDM: v_1 = g_1). EF21-SGDM only.
  TensorBuffer primed_;
  const uint32_t* own_word_ = nullptr;  // the last encode's deferred own-decode verdict (device), or null
};

}  // namespace terse
