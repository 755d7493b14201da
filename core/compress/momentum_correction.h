// Momentum correction and momentum factor masking from Deep Gradient Compression (Lin et al. 2018, "Deep Gradient
// Compression: Reducing the Communication Bandwidth for Distributed Training", ICLR; section 3.1 eq. (4)-(5),
// section 3.2 and Algorithm 1), as a decorator around an ErrorFeedback codec.
//
// Sparsifying a momentum-SGD update naively accumulates raw gradients and applies momentum after aggregation, which
// loses the momentum of every coordinate that waits in the residual. DGC accumulates the velocity locally instead:
//
//   u_t = m u_{t-1} + g_t                          (momentum, eq. (4))
//   v_t = v_{t-1} + u_t                            (accumulation, eq. (5): the inner ErrorFeedback's p = g + e, fed u)
//   payload = C(v_t);  v_t <- v_t - D(C(v_t))       (the inner ErrorFeedback's residual update)
//   u_t <- u_t ⊙ ¬mask,  mask = D(C(v_t)) != 0      (momentum factor masking, section 3.2; when enabled)
//
// For a sparsifier D(C(v)) is v on the sent coordinates and 0 elsewhere, so the residual update is DGC's v ⊙ ¬mask.
// Masking stops a sent coordinate's stale momentum from pushing it further after the update was applied. It is meant
// for sparsifiers: with a dense compressor (quantization) nearly every coordinate is "sent", and masking degenerates
// to discarding the momentum every step.
//
// Nesterov variant (DGC's reference code, dgc/memory.py): u_t = m (u_{t-1} + g_t) and v_t = v_{t-1} + u_t + g_t.
//
// IMPORTANT for the trainer: with momentum correction the momentum lives here, in the codec. The optimizer must then
// run WITHOUT its own momentum (plain SGD on the averaged decoded update), or momentum is applied twice. Gradient
// clipping and the warm-up schedule of DGC (section 3.3-3.4) are not part of this decorator.
//
// Rounds, f32-only and allocation rules are ErrorFeedback's: u_t is staged in round 0 and committed (masked) only after
// the last round's encode succeeded, so a failed or restarted step leaves the momentum untouched.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/compress/codec.h"
#include "core/compress/error_feedback.h"
#include "core/compress/host_array.h"

namespace terse {

class MomentumCorrection final : public CodecDecorator {
 public:
  // momentum m in [0, 1) (InvalidArgument otherwise, naming the value); masking: momentum factor masking on/off.
  MomentumCorrection(std::unique_ptr<ErrorFeedback> inner, double momentum, bool masking = true, bool nesterov = false);

  // Round 0 stages u_t from grad and feeds the accumulation input (u_t, or u_t + g_t for Nesterov) to the inner error
  // feedback in every round; after the last round u <- u_t, masked by what was transmitted. The inner error
  // feedback's own decode is deferred as ErrorFeedback::encodeDeferred defers it, and the momentum's update skipped
  // on the device when its word is raised.
  uint64_t encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                          std::span<std::byte> out, EncodeWords words) override;

  // u: the (masked) momentum after the last completed step (numel floats, in the tensor's memory).
  std::span<const float> momentum() const { return {momentum_.as<const float>(), n_}; }
  // The inner error feedback: its residual() is DGC's v after the sent coordinates were removed.
  const ErrorFeedback& errorFeedback() const { return *ef_; }
  float momentumFactor() const { return m_; }
  bool masking() const { return masking_; }
  bool nesterov() const { return nesterov_; }
  // Forgets momentum and residual.
  void reset();

 private:
  ErrorFeedback* ef_;  // the inner codec, as its type
  float m_;
  bool masking_;
  bool nesterov_;
  Placement placement_;
  std::size_t n_ = 0;
  TensorBuffer momentum_;  // u_{t-1}, persistent
  TensorBuffer staged_;    // u_t of the step in progress
  TensorBuffer input_;     // Nesterov only: u_t + g_t, what the error feedback accumulates
};

}  // namespace terse
