#include "core/compress/error_feedback.h"

#include <string>
#include <utility>

#include "core/common/error.h"
#include "core/compress/device_kernels.h"
#include "core/compress/error_feedback_math.h"

namespace terse {
namespace {

std::string where(const TensorInfo& t) {
  return "error feedback, tensor " + std::to_string(t.tensor_id) + ": ";
}

// The loops stay this plain so that GCC vectorizes them at -O2 (whose very-cheap cost model will not version a loop
// for aliasing, hence __restrict: the buffers never overlap).
void correct(const float* __restrict g, const float* __restrict e, float* __restrict p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = efCorrect(g[i], e[i]);
}

void updateResidual(const float* __restrict p, const float* __restrict t, float* __restrict e, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) e[i] = efResidual(p[i], t[i]);
}

}  // namespace

ErrorFeedback::ErrorFeedback(std::unique_ptr<TensorCodec> inner) : CodecDecorator(std::move(inner), "error feedback") {
  const TensorInfo& t = info();
  TERSE_CHECK(t.dtype == DType::kF32, Unsupported,
              where(t) << "error feedback supports f32 gradients only, got " << dtypeName(t.dtype)
                       << " (a 16-bit residual would lose what it is meant to keep)");
  placement_ = placement();
  n_ = static_cast<std::size_t>(t.numel);
  residual_ = TensorBuffer(n_ * sizeof(float), placement_);
  corrected_ = TensorBuffer(n_ * sizeof(float), placement_);
  transmitted_ = TensorBuffer(n_ * sizeof(float), placement_);
}

uint64_t ErrorFeedback::encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                                       std::span<std::byte> out, EncodeWords words) {
  const std::size_t n = n_;
  auto* residual = residual_.as<float>();
  auto* corrected = corrected_.as<float>();
  auto* transmitted = transmitted_.as<float>();
  const auto stage = [&] {
    TERSE_CHECK(grad != nullptr || n == 0, InvalidArgument,
                where(info()) << "encode: gradient is null for " << n << " elements");
    if (placement_.device) {
      device_kernels::efCorrect(static_cast<const float*>(grad), residual, corrected, n, placement_.stream);
    } else {
      correct(static_cast<const float*>(grad), residual, corrected, n);
    }
  };
  // D(C(p)): this rank's own contribution. A refused one leaves the residual as it was: the thrown refusal before
  // this, or on a device the raised gate, which the caller fails the step for when it reads the word.
  const auto finish = [&](const uint32_t* gate) {
    if (placement_.device) {
      device_kernels::efResidual(corrected, transmitted, residual, n, placement_.stream, gate);
    } else {
      updateResidual(corrected, transmitted, residual, n);
    }
  };
  return encodeStaged(where(info()), step, round, corrected, prev, out, words, transmitted, stage, finish);
}

void ErrorFeedback::reset() {
  residual_.zero();
  corrected_.zero();
  transmitted_.zero();
  resetRounds();
}

}  // namespace terse
