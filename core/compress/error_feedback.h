// Error feedback (residual memory) around any compressor: what a lossy compressor drops this step is added back into
// the next step's gradient, so nothing is lost for good, only delayed.
//
//   p_t     = g_t + e_t                 (corrected gradient; e_0 = 0)
//   payload = C(p_t)
//   e_{t+1} = p_t - D(C(p_t))           (D(C(p)): this rank's own payload decoded locally, accumulate = 0)
//
// Seide et al. 2014, "1-Bit Stochastic Gradient Descent and its Application to Data-Parallel Distributed Training of
// Speech DNNs" (1-bit SGD's error feedback); Karimireddy et al. 2019, "Error Feedback Fixes SignSGD and other Gradient
// Compression Schemes" (EF-SGD, convergence for any compressor with ||C(x) - x||^2 <= (1 - delta) ||x||^2).
//
// Telescoping the update gives the invariant the tests check: sum_t D(C(p_t)) = sum_t g_t - e_T, i.e. every gradient
// coordinate reaches the wire eventually, up to a residual that stays bounded when the compressor is contractive.
//
// Multi-round compressors (caps.num_rounds R > 1, e.g. PowerSGD): p_t is computed once in round 0 and the same p_t is
// the inner codec's input in every round; after the last round's encode the residual uses the LAST round's local
// payload, whose decoding is the rank's own contribution given the earlier rounds' aggregates. For PowerSGD (Vogels et
// al. 2019, "PowerSGD: Practical Low-Rank Gradient Compression", Algorithm 2) that is e = M - P̂ Q_localᵀ, with P̂ the
// orthogonalized aggregate of round 0 and Q_local = Mᵀ P̂ this rank's round-1 factor.
//
// Rounds of a step must come in order 0..R-1; round 0 may restart a step at any time (the residual only changes after
// the last round succeeded, so a failed or abandoned step leaves it untouched). decode and reduce are forwarded
// unchanged: the aggregate needs no correction, only what each rank sends does.
//
// f32 tensors only for now: the residual must be kept at least at the gradient's precision, and f16/bf16 residuals need
// an f32 shadow copy (a later issue). Every buffer is allocated once in the constructor, in the tensor's memory (a CUDA
// tensor's residual lives on its device and the two loops run as kernels on its stream, device_kernels.h, with the
// host's per-element bodies); encode allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/compress/codec.h"
#include "core/compress/tensor_buffer.h"

namespace terse {

class ErrorFeedback final : public CodecDecorator {
 public:
  // Throws InvalidArgument for a null inner codec, Unsupported for a non-f32 tensor.
  explicit ErrorFeedback(std::unique_ptr<TensorCodec> inner);

  // Round 0 computes p = grad + e; every round encodes p (grad is read in round 0 only); after the last round the
  // residual becomes p - D(C(p)). Throws InvalidArgument for a round out of order. On a device with a plugin that
  // defers its verdicts, D(C(p)) leaves its check in words.own and the residual update reads it there, so nothing is
  // waited for, and words.prev goes to the inner codec's last round (TensorCodec::encodeDeferred).
  uint64_t encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                          std::span<std::byte> out, EncodeWords words) override;

  // e: what has not been transmitted yet (numel floats, in the tensor's memory).
  std::span<const float> residual() const { return floats(residual_); }
  // D(C(p)) of the last completed step: this rank's own payload of the last round, decoded (numel floats, in the
  // tensor's memory).
  std::span<const float> transmitted() const { return floats(transmitted_); }
  // Forgets the residual and any step in progress (e.g. when a run restarts from a checkpoint without its residuals).
  void reset();

 private:
  static std::span<const float> floats(const TensorBuffer& b) { return {b.as<const float>(), b.count<float>()}; }

  Placement placement_;
  std::size_t n_ = 0;
  TensorBuffer residual_;     // e_t, persistent
  TensorBuffer corrected_;    // p_t, fixed from round 0 to the last round of one step
  TensorBuffer transmitted_;  // D(C(p_t)) of the last completed step
};

}  // namespace terse
