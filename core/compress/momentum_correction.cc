#include "core/compress/momentum_correction.h"

#include <string>
#include <utility>

#include "core/common/error.h"
#include "core/compress/device_kernels.h"
#include "core/compress/momentum_correction_math.h"

namespace terse {
namespace {

std::string where(const TensorInfo& t) {
  return "momentum correction, tensor " + std::to_string(t.tensor_id) + ": ";
}

// Plain loops over the TERSE_HD bodies; __restrict lets GCC vectorize them at -O2 (see error_feedback.cc).
void stageMomentum(const float* __restrict u, const float* __restrict g, float m, float* __restrict u_t,
                   std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) u_t[i] = dgcMomentum(u[i], g[i], m);
}

void stageNesterov(const float* __restrict u, const float* __restrict g, float m, float* __restrict u_t,
                   float* __restrict input, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    u_t[i] = dgcNesterovMomentum(u[i], g[i], m);
    input[i] = dgcNesterovInput(u_t[i], g[i]);
  }
}

void commitMasked(const float* __restrict u_t, const float* __restrict transmitted, float* __restrict u,
                  std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) u[i] = dgcMask(u_t[i], transmitted[i]);
}

void commit(const float* __restrict u_t, float* __restrict u, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) u[i] = u_t[i];
}

}  // namespace

MomentumCorrection::MomentumCorrection(std::unique_ptr<ErrorFeedback> inner, double momentum, bool masking,
                                       bool nesterov)
    : CodecDecorator(std::move(inner), "momentum correction"),
      ef_(static_cast<ErrorFeedback*>(&this->inner())),
      m_(static_cast<float>(momentum)),
      masking_(masking),
      nesterov_(nesterov) {
  // The float check catches values like 0.99999999 that round to 1.0f, where the momentum would never decay.
  TERSE_CHECK(momentum >= 0.0 && momentum < 1.0 && m_ < 1.0f, InvalidArgument,
              where(info()) << "momentum must be in [0, 1), got " << momentum);
  placement_ = ef_->placement();
  n_ = static_cast<std::size_t>(ef_->info().numel);
  momentum_ = TensorBuffer(n_ * sizeof(float), placement_);
  staged_ = TensorBuffer(n_ * sizeof(float), placement_);
  if (nesterov_) input_ = TensorBuffer(n_ * sizeof(float), placement_);
}

uint64_t MomentumCorrection::encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                                            std::span<std::byte> out, EncodeWords words) {
  const std::size_t n = n_;
  auto* u = momentum_.as<float>();
  auto* u_t = staged_.as<float>();
  auto* nesterov_input = input_.as<float>();
  if (round == 0) {
    TERSE_CHECK(grad != nullptr || n == 0, InvalidArgument,
                where(info()) << "encode: gradient is null for " << n << " elements");
    const auto* g = static_cast<const float*>(grad);
    if (placement_.device) {
      device_kernels::dgcStage(u, g, m_, nesterov_, u_t, nesterov_input, n, placement_.stream);
    } else if (nesterov_) {
      stageNesterov(u, g, m_, u_t, nesterov_input, n);
    } else {
      stageMomentum(u, g, m_, u_t, n);
    }
  }
  // The inner error feedback checks the round order and accumulates v_t = v_{t-1} + input in round 0.
  const float* input = nesterov_ ? nesterov_input : u_t;
  const uint64_t bytes = ef_->encodeDeferred(step, round, input, prev, out, words);
  if (round == ef_->caps().num_rounds - 1) {
    const float* transmitted = ef_->transmitted().data();
    if (placement_.device) {
      // The word is zero unless the inner own decode left a refusal there (it is zeroed by the caller).
      device_kernels::dgcCommit(u_t, transmitted, masking_, u, n, placement_.stream, words.own);
    } else if (masking_) {
      commitMasked(u_t, transmitted, u, n);
    } else {
      commit(u_t, u, n);
    }
  }
  return bytes;
}

void MomentumCorrection::reset() {
  ef_->reset();
  momentum_.zero();
  staged_.zero();
  input_.zero();
}

}  // namespace terse
