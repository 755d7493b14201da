#include "core/compress/momentum_correction.h"

#include <string>
#include <utility>

#include "core/common/error.h"
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
    : inner_(std::move(inner)), m_(static_cast<float>(momentum)), masking_(masking), nesterov_(nesterov) {
  TERSE_CHECK(inner_ != nullptr, InvalidArgument, "momentum correction: inner error feedback is null");
  // The float check catches values like 0.99999999 that round to 1.0f, where the momentum would never decay.
  TERSE_CHECK(momentum >= 0.0 && momentum < 1.0 && m_ < 1.0f, InvalidArgument,
              where(inner_->info()) << "momentum must be in [0, 1), got " << momentum);
  const auto n = static_cast<std::size_t>(inner_->info().numel);
  momentum_ = HostArray<float>(n);
  staged_ = HostArray<float>(n);
  if (nesterov_) input_ = HostArray<float>(n);
}

uint64_t MomentumCorrection::encode(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                                    std::span<std::byte> out) {
  const std::size_t n = staged_.size();
  if (round == 0) {
    TERSE_CHECK(grad != nullptr || n == 0, InvalidArgument,
                where(info()) << "encode: gradient is null for " << n << " elements");
    const auto* g = static_cast<const float*>(grad);
    if (nesterov_) {
      stageNesterov(momentum_.data(), g, m_, staged_.data(), input_.data(), n);
    } else {
      stageMomentum(momentum_.data(), g, m_, staged_.data(), n);
    }
  }
  // The inner error feedback checks the round order and accumulates v_t = v_{t-1} + input in round 0.
  const float* input = nesterov_ ? input_.data() : staged_.data();
  const uint64_t bytes = inner_->encode(step, round, input, prev, out);
  if (round == inner_->caps().num_rounds - 1) {
    if (masking_) {
      commitMasked(staged_.data(), inner_->transmitted().data(), momentum_.data(), n);
    } else {
      commit(staged_.data(), momentum_.data(), n);
    }
  }
  return bytes;
}

void MomentumCorrection::reset() {
  inner_->reset();
  momentum_.zero();
  staged_.zero();
  input_.zero();
}

}  // namespace terse
