#include "core/compress/ef21.h"

#include <string>
#include <utility>

#include "core/common/error.h"
#include "core/compress/device_kernels.h"
#include "core/compress/ef21_math.h"

namespace terse {
namespace {

std::string where(const TensorInfo& t) {
  return "EF21, tensor " + std::to_string(t.tensor_id) + ": ";
}

// Plain loops over the TERSE_HD bodies; __restrict lets GCC vectorize them (see error_feedback.cc).
void stagePlain(const float* __restrict g, const float* __restrict h, float* __restrict input, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) input[i] = ef21Difference(g[i], h[i]);
}

void stageMomentum(const float* __restrict g, const float* __restrict v, const float* __restrict h, float eta,
                   float* __restrict v_t, float* __restrict input, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    v_t[i] = ef21Momentum(v[i], g[i], eta);
    input[i] = ef21Difference(v_t[i], h[i]);
  }
}

void stageNext(const float* __restrict h, const float* __restrict t, float* __restrict next, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) next[i] = ef21Advance(h[i], t[i]);
}

void copy(const float* __restrict from, float* __restrict to, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) to[i] = from[i];
}

void advanceSum(float* __restrict out, float* __restrict sum, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = ef21Advance(sum[i], out[i]);
    sum[i] = out[i];
  }
}

}  // namespace

Ef21::Ef21(std::unique_ptr<TensorCodec> inner, double eta)
    : CodecDecorator(std::move(inner), "EF21"), eta_(static_cast<float>(eta)) {
  const TensorInfo& t = info();
  // Written so that NaN fails too; the float check catches a value that rounds to 0.
  TERSE_CHECK(eta > 0.0 && eta <= 1.0 && eta_ > 0.0f, InvalidArgument,
              where(t) << "momentum eta must be in (0, 1] (1 = plain EF21), got " << eta);
  TERSE_CHECK(t.dtype == DType::kF32, Unsupported,
              where(t) << "EF21 supports f32 gradients only, got " << dtypeName(t.dtype)
                       << " (16-bit estimates would drift from the sum every rank keeps)");
  const CompressorCaps& caps = this->caps();
  TERSE_CHECK(caps.aggregation != Aggregation::kCustom, Unsupported,
              where(t) << "EF21 needs an aggregate that is the sum of what the ranks sent (SUM or ALLGATHER "
                          "aggregation); this compressor's is CUSTOM (e.g. a majority vote)");
  TERSE_CHECK(caps.aggregation != Aggregation::kSum || caps.wire_dtype == DType::kF32, Unsupported,
              where(t) << "EF21 keeps the sum of the estimates from the aggregate, where what a sum on the wire rounds "
                          "away stays for good; this compressor sums in "
                       << dtypeName(caps.wire_dtype) << ": use one that sums in f32, or error feedback's rule EF");
  placement_ = placement();
  n_ = static_cast<std::size_t>(t.numel);
  estimate_ = TensorBuffer(n_ * sizeof(float), placement_);
  sum_ = TensorBuffer(n_ * sizeof(float), placement_);
  input_ = TensorBuffer(n_ * sizeof(float), placement_);
  transmitted_ = TensorBuffer(n_ * sizeof(float), placement_);
  next_ = TensorBuffer(n_ * sizeof(float), placement_);
  if (eta_ < 1.0f) {
    momentum_ = TensorBuffer(n_ * sizeof(float), placement_);
    staged_ = TensorBuffer(n_ * sizeof(float), placement_);
    primed_ = TensorBuffer(sizeof(uint32_t), placement_);
  }
}

uint64_t Ef21::encodeDeferred(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                              std::span<std::byte> out, EncodeWords words) {
  const std::size_t n = n_;
  const bool momentum = eta_ < 1.0f;
  auto* h = estimate_.as<float>();
  auto* input = input_.as<float>();
  auto* v = momentum_.as<float>();
  auto* v_t = staged_.as<float>();
  auto* transmitted = transmitted_.as<float>();
  const auto stage = [&] {
    TERSE_CHECK(grad != nullptr || n == 0, InvalidArgument,
                where(info()) << "encode: gradient is null for " << n << " elements");
    const auto* g = static_cast<const float*>(grad);
    if (placement_.device) {
      // The kernel reads the primed word itself: v_1 = g_1 before the first commit.
      device_kernels::ef21Stage(g, momentum ? v : nullptr, h, eta_, primed_.as<const uint32_t>(),
                                momentum ? v_t : nullptr, input, n, placement_.stream);
    } else if (momentum) {
      // v_1 = g_1: before the first commit the momentum is the gradient itself (eta 1 weighs v by nothing).
      stageMomentum(g, v, h, *primed_.as<const uint32_t>() != 0 ? eta_ : 1.0f, v_t, input, n);
    } else {
      stagePlain(g, h, input, n);
    }
    own_word_ = nullptr;
  };
  // h + D(C(v_t - h_t)), staged for aggregated() to commit; the own decode's gate goes with it.
  const auto finish = [&](const uint32_t* gate) {
    if (placement_.device) {
      device_kernels::ef21StageNext(h, transmitted, next_.as<float>(), n, placement_.stream);
    } else {
      stageNext(h, transmitted, next_.as<float>(), n);
    }
    own_word_ = gate;
  };
  return encodeStaged(where(info()), step, round, input, prev, out, words, transmitted, stage, finish);
}

void Ef21::aggregated(uint64_t step, void* out, const uint32_t* verdicts, std::size_t count) {
  (void)step;
  TERSE_CHECK(out != nullptr || n_ == 0, InvalidArgument, where(info()) << "aggregated: output is null");
  auto* o = static_cast<float*>(out);
  const bool momentum = eta_ < 1.0f;
  if (placement_.device) {
    device_kernels::ef21Commit(o, sum_.as<float>(), next_.as<const float>(), estimate_.as<float>(),
                               momentum ? staged_.as<const float>() : nullptr,
                               momentum ? momentum_.as<float>() : nullptr, momentum ? primed_.as<uint32_t>() : nullptr,
                               n_, placement_.stream, verdicts, count, own_word_);
    return;
  }
  // A host plugin may refuse through its word instead of throwing (terse/device_verdict_v1.h): the step then fails
  // when the engine reads it, after this call, and nothing of it may have moved.
  for (std::size_t k = 0; verdicts != nullptr && k < count; ++k)
    if (verdicts[k] != 0) return;
  copy(next_.as<const float>(), estimate_.as<float>(), n_);
  if (momentum) {
    copy(staged_.as<const float>(), momentum_.as<float>(), n_);
    *primed_.as<uint32_t>() = 1;
  }
  advanceSum(o, sum_.as<float>(), n_);
}

void Ef21::reset() {
  estimate_.zero();
  sum_.zero();
  momentum_.zero();
  staged_.zero();
  input_.zero();
  transmitted_.zero();
  next_.zero();
  primed_.zero();
  own_word_ = nullptr;
  resetRounds();
}

}  // namespace terse
