#include "core/train/optimizer.h"

#include <cmath>
#include <numbers>

#include "core/common/error.h"
#include "core/train/sgd_kernels.h"
#include "core/train/sgd_math.h"

namespace terse::train {

void validateLrSchedule(const LrScheduleOptions& o) {
  TERSE_CHECK(std::isfinite(o.lr) && o.lr > 0, InvalidArgument, "lr must be > 0, got " << o.lr);
  TERSE_CHECK(o.warmup_steps >= 0, InvalidArgument, "warmup_steps must be >= 0, got " << o.warmup_steps);
  TERSE_CHECK(o.world_size >= 1, InvalidArgument, "world_size must be >= 1, got " << o.world_size);
  TERSE_CHECK(o.steps_per_epoch >= 1, InvalidArgument, "steps_per_epoch must be >= 1, got " << o.steps_per_epoch);
  TERSE_CHECK(o.total_steps >= 1, InvalidArgument, "total_steps must be >= 1, got " << o.total_steps);
  if (o.schedule == LrSchedule::kStep) {
    TERSE_CHECK(o.gamma > 0 && o.gamma <= 1, InvalidArgument, "gamma must be in (0, 1], got " << o.gamma);
    int64_t prev = 0;
    for (int64_t m : o.milestones) {
      TERSE_CHECK(m > prev, InvalidArgument,
                  "milestones must be strictly increasing epochs >= 1, got " << m << " after " << prev);
      prev = m;
    }
  }
}

double learningRate(const LrScheduleOptions& o, int64_t step) {
  const double base = o.lr * (o.scale_by_world_size ? o.world_size : 1);
  const int64_t w = o.warmup_steps;
  const double warm = (w > 0 && step < w) ? static_cast<double>(step + 1) / static_cast<double>(w) : 1.0;
  switch (o.schedule) {
    case LrSchedule::kConstant:
      return base * warm;
    case LrSchedule::kStep: {
      const int64_t epoch = step / o.steps_per_epoch;
      double lr = base * warm;
      for (int64_t m : o.milestones) {
        if (epoch >= m) lr *= o.gamma;
      }
      return lr;
    }
    case LrSchedule::kCosine: {
      if (step < w) return base * warm;
      const int64_t span = o.total_steps - w;
      if (span <= 0) return base;
      const double progress = std::min(1.0, static_cast<double>(step - w) / static_cast<double>(span));
      return base * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return base * warm;
}

SgdOptimizer::SgdOptimizer(std::span<const ParamTensor> params, const SgdOptions& options, void* stream)
    : options_(options), stream_(stream) {
  TERSE_CHECK(options.momentum >= 0 && options.momentum < 1, InvalidArgument,
              "momentum must be in [0, 1), got " << options.momentum);
  TERSE_CHECK(!options.nesterov || options.momentum > 0, InvalidArgument, "nesterov needs momentum > 0");
  TERSE_CHECK(options.weight_decay >= 0, InvalidArgument, "weight_decay must be >= 0, got " << options.weight_decay);
  device_ = !params.empty() && params.front().device_value != nullptr;
  for (const auto& p : params) {
    TERSE_CHECK((p.device_value != nullptr) == device_ && (p.device_grad != nullptr) == device_, InvalidArgument,
                "tensor '" << p.name << "': the optimizer needs every tensor on the host or every one on a device");
  }
  TERSE_CHECK(!device_ || stream != nullptr, InvalidArgument, "device tensors need the stream their updates run on");
  TERSE_CHECK(!options.adagrad || (options.momentum == 0 && !device_), InvalidArgument,
              "adagrad takes no momentum (got " << options.momentum << ") and runs on host tensors only");
  TERSE_CHECK(options.adagrad_eps > 0, InvalidArgument, "adagrad_eps must be > 0, got " << options.adagrad_eps);
  if (options.adagrad) {
    sum_sq_.reserve(params.size());
    for (const auto& p : params) sum_sq_.emplace_back(p.numel(), 0.0f);
  }
  if (options.momentum > 0) {
    if (device_) {
      device_momentum_.reserve(params.size());
      for (const auto& p : params) device_momentum_.emplace_back(p.numel() * sizeof(float), stream);
    } else {
      momentum_.reserve(params.size());
      for (const auto& p : params) momentum_.emplace_back(p.numel(), 0.0f);
    }
  }
}

void SgdOptimizer::update(std::size_t index, ParamTensor& tensor, double lr) {
  const std::size_t n = tensor.numel();
  TERSE_CHECK(tensor.grad.size() == n, InvalidArgument,
              "tensor '" << tensor.name << "': grad has " << tensor.grad.size() << " elements, value " << n);
  const auto step = static_cast<float>(lr);
  const auto wd = static_cast<float>(options_.weight_decay);
  if (device_) {
    TERSE_CHECK(tensor.device_value != nullptr && tensor.device_grad != nullptr, InvalidArgument,
                "tensor '" << tensor.name << "' has no device buffers; the optimizer was built for device tensors");
    const bool momentum = !device_momentum_.empty();
    TERSE_CHECK(!momentum || (index < device_momentum_.size() && device_momentum_[index].size() == n * sizeof(float)),
                InvalidArgument,
                "tensor " << index << " ('" << tensor.name << "', " << n
                          << " elements) is not one the optimizer was built for");
    sgd_kernels::update(tensor.device_value, tensor.device_grad,
                        momentum ? reinterpret_cast<float*>(device_momentum_[index].data()) : nullptr, n, step, wd,
                        static_cast<float>(options_.momentum), options_.nesterov, stream_);
    return;
  }
  float* w = tensor.value.data();
  const float* grad = tensor.grad.data();
  if (!sum_sq_.empty()) {
    TERSE_CHECK(index < sum_sq_.size() && sum_sq_[index].size() == n, InvalidArgument,
                "tensor " << index << " ('" << tensor.name << "', " << n
                          << " elements) is not one the optimizer was built for");
    float* g2 = sum_sq_[index].data();
    const auto eps = static_cast<float>(options_.adagrad_eps);
    for (std::size_t i = 0; i < n; ++i) adagrad(w[i], g2[i], grad[i], step, wd, eps);
    return;
  }
  if (momentum_.empty()) {
    for (std::size_t i = 0; i < n; ++i) w[i] = sgdPlain(w[i], grad[i], step, wd);
    return;
  }
  TERSE_CHECK(
      index < momentum_.size() && momentum_[index].size() == n, InvalidArgument,
      "tensor " << index << " ('" << tensor.name << "', " << n << " elements) is not one the optimizer was built for");
  float* b = momentum_[index].data();
  const auto mu = static_cast<float>(options_.momentum);
  // Two loops rather than a flag inside one, so each stays a plain loop the compiler vectorizes.
  if (options_.nesterov) {
    for (std::size_t i = 0; i < n; ++i) sgdMomentum(w[i], b[i], grad[i], step, wd, mu, true);
  } else {
    for (std::size_t i = 0; i < n; ++i) sgdMomentum(w[i], b[i], grad[i], step, wd, mu, false);
  }
}

void SgdOptimizer::updateRows(std::size_t index, ParamTensor& tensor, double lr, std::span<const int64_t> rows) {
  TERSE_CHECK(!device_ && lazyRowsExact(), InvalidArgument,
              "tensor '" << tensor.name << "': row-wise updates need host tensors, no momentum and no weight decay");
  const std::size_t n = tensor.numel(), len = tensor.rowLength();
  TERSE_CHECK(tensor.grad.size() == n && (sum_sq_.empty() || (index < sum_sq_.size() && sum_sq_[index].size() == n)),
              InvalidArgument,
              "tensor " << index << " ('" << tensor.name << "') is not one the optimizer was built for");
  const auto step = static_cast<float>(lr);
  const auto eps = static_cast<float>(options_.adagrad_eps);
  for (int64_t r : rows) {
    TERSE_CHECK(r >= 0 && static_cast<std::size_t>(r) * len < n, InvalidArgument,
                "tensor '" << tensor.name << "': row " << r << " is outside its " << n / len << " rows");
    const std::size_t a = static_cast<std::size_t>(r) * len;
    float* w = tensor.value.data() + a;
    const float* g = tensor.grad.data() + a;
    if (sum_sq_.empty()) {
      for (std::size_t i = 0; i < len; ++i) w[i] = sgdPlain(w[i], g[i], step, 0.0f);
    } else {
      float* g2 = sum_sq_[index].data() + a;
      for (std::size_t i = 0; i < len; ++i) adagrad(w[i], g2[i], g[i], step, 0.0f, eps);
    }
  }
}

void SgdOptimizer::updateAll(std::span<ParamTensor> params, double lr) {
  for (std::size_t i = 0; i < params.size(); ++i) update(i, params[i], lr);
}

}  // namespace terse::train
