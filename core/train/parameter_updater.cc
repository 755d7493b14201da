// The trainer's updates (parameter_updater.h), on the group scheduler's communication thread.
#include "core/train/parameter_updater.h"

#include <cmath>

#include "core/common/device_memory.h"
#include "core/common/error.h"
#include "core/common/runtime.h"

namespace terse::train {
namespace {

// The FLOP model's optimizer cost: momentum update and step, each a multiply-add per element.
constexpr double kOptimizerFlopsPerElement = 4;

}  // namespace

ParameterUpdater::ParameterUpdater(Workload& workload, const SgdOptions& sgd, void* stream, double clip_grad_norm,
                                   TraceRecorder* trace, StepTraceRecorder* step_trace)
    : workload_(workload),
      optimizer_(workload.params(), sgd, stream),
      stream_(stream),
      device_(workload.device() >= 0),
      clip_grad_norm_(clip_grad_norm),
      trace_(trace),
      step_trace_(step_trace) {}

std::vector<std::size_t> ParameterUpdater::aggregated(int64_t step, double lr, std::vector<std::size_t> done) {
  const auto params = workload_.params();
  if (step == averaging_step_.load(std::memory_order_relaxed)) {
    // Averaged deltas: every rank sets the same anchor minus the same step on the same mean, so the replicas agree bit
    // for bit. No clip: each rank clipped its own local updates.
    if (outer_momentum_ > 0 && outer_buf_.empty())
      for (const ParamTensor& p : params) outer_buf_.emplace_back(p.numel(), 0.0f);
    for (std::size_t t : done) {
      const auto u0 = rt::now();
      {
        std::vector<float>& value = params[t].value;
        std::vector<float>& anchor = anchor_[t];
        const std::vector<float>& delta = params[t].grad;
        const auto n = static_cast<double>(value.size());
        if (outer_momentum_ == 0 && outer_lr_ == 1) {
          const rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = n, .flops = n});
          for (std::size_t i = 0; i < value.size(); ++i) {
            value[i] = anchor[i] - delta[i];
            anchor[i] = value[i];
          }
        } else {
          // The outer SGD is an optimizer's pass over the tensor (momentum, step), priced as one.
          const rt::Kernel kernel(
              {.kind = rt::CostKind::kOptimizer, .size = n, .flops = kOptimizerFlopsPerElement * n});
          float* u = outer_momentum_ > 0 ? outer_buf_[t].data() : nullptr;
          for (std::size_t i = 0; i < value.size(); ++i) {
            float move = delta[i];
            if (u != nullptr) {
              u[i] = outer_momentum_ * u[i] + delta[i];
              move = outer_nesterov_ ? delta[i] + outer_momentum_ * u[i] : u[i];
            }
            value[i] = anchor[i] - outer_lr_ * move;
            anchor[i] = value[i];
          }
        }
      }
      traceUpdate(step, t, "average", u0);  // after the tensor's last group, as a gradient step's update
    }
    return done;
  }
  if (clip_grad_norm_ > 0) {
    // The norm is global: nothing is applied until the step's last tensor is in.
    clip_ready_.insert(clip_ready_.end(), done.begin(), done.end());
    done.clear();
    if (clip_ready_.size() == params.size()) {
      clipGradients();
      done.swap(clip_ready_);
    }
  }
  for (std::size_t t : done) {
    const auto u0 = rt::now();
    {
      // FLOP model: SGD with momentum reads and writes each element a few times.
      const auto n = static_cast<double>(params[t].numel());
      const rt::Kernel kernel({.kind = rt::CostKind::kOptimizer, .size = n, .flops = kOptimizerFlopsPerElement * n});
      optimizer_.update(t, params[t], lr);
    }
    traceUpdate(step, t, "update", u0);
  }
  // Device updates were only enqueued on the communicator's stream; a gate opened once these are marked applied lets
  // the worker's forward (on the workload's stream) read these values, so they must be complete first. One wait per
  // group that finished a tensor, and the wait is the update kernels' time, which the host would otherwise spend on the
  // next group's launch.
  if (device_ && !done.empty()) cuda::synchronize(stream_);
  return done;
}

void ParameterUpdater::aggregatedRows(int64_t step, double lr, std::size_t t, std::span<const int64_t> rows) {
  ParamTensor& p = workload_.params()[t];
  const auto u0 = rt::now();
  if (optimizer_.lazyRowsExact()) {
    const auto n = static_cast<double>(rows.size() * p.rowLength());
    const rt::Kernel kernel({.kind = rt::CostKind::kOptimizer, .size = n, .flops = kOptimizerFlopsPerElement * n});
    optimizer_.updateRows(t, p, lr, rows);
  } else {
    const auto n = static_cast<double>(p.numel());
    const rt::Kernel kernel({.kind = rt::CostKind::kOptimizer, .size = n, .flops = kOptimizerFlopsPerElement * n});
    optimizer_.update(t, p, lr);
  }
  traceUpdate(step, t, "update", u0);
}

void ParameterUpdater::traceUpdate(int64_t step, std::size_t t, const char* verb, rt::Clock::time_point u0) {
  if (!trace_ && !step_trace_) return;
  const auto u1 = rt::now();
  if (trace_)
    trace_->span(TraceRecorder::kCommThread, std::string(verb) + " " + workload_.params()[t].name, "update", u0, u1);
  if (step_trace_) step_trace_->update(step, t, {u0, u1});
}

void ParameterUpdater::localUpdate(int64_t step, double lr) {
  const auto params = workload_.params();
  const auto u0 = rt::now();
  if (anchor_.empty()) {
    const rt::Kernel kernel(
        {.kind = rt::CostKind::kAccumulate, .size = static_cast<double>(workload_.numParameters())});
    for (const ParamTensor& p : params) anchor_.push_back(p.value);
  }
  if (clip_grad_norm_ > 0) clipGradients();
  for (std::size_t t = 0; t < params.size(); ++t) {
    const auto n = static_cast<double>(params[t].numel());
    const rt::Kernel kernel({.kind = rt::CostKind::kOptimizer, .size = n, .flops = kOptimizerFlopsPerElement * n});
    optimizer_.update(t, params[t], lr);
  }
  if (trace_)
    trace_->span(TraceRecorder::kComputeThread, "local update " + std::to_string(step), "update", u0, rt::now());
}

void ParameterUpdater::setOuterOptimizer(double lr, double momentum, bool nesterov) {
  TERSE_CHECK(std::isfinite(lr) && lr > 0 && lr <= 100, InvalidArgument,
              "local SGD's outer_lr must be finite and in (0, 100], got " << lr);
  TERSE_CHECK(momentum >= 0 && momentum < 1, InvalidArgument,
              "local SGD's outer_momentum must be in [0, 1), got " << momentum);
  TERSE_CHECK(!nesterov || momentum > 0, InvalidArgument, "local SGD's outer_nesterov needs outer_momentum > 0");
  outer_lr_ = static_cast<float>(lr);
  outer_momentum_ = static_cast<float>(momentum);
  outer_nesterov_ = nesterov;
}

void ParameterUpdater::writeDeltas(int64_t step) {
  const auto params = workload_.params();
  const auto n = static_cast<double>(workload_.numParameters());
  {
    const rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = n, .flops = n});
    for (std::size_t t = 0; t < params.size(); ++t) {
      const std::vector<float>& value = params[t].value;
      const std::vector<float>& anchor = anchor_[t];
      std::vector<float>& delta = params[t].grad;
      for (std::size_t i = 0; i < value.size(); ++i) delta[i] = anchor[i] - value[i];
    }
  }
  averaging_step_.store(step, std::memory_order_relaxed);
}

void ParameterUpdater::clipGradients() {
  const auto params = workload_.params();
  // One pass over the gradient for the norm, a second to scale it. The FLOP model charges only a clip that scales.
  rt::Kernel kernel({.kind = rt::CostKind::kAccumulate, .size = static_cast<double>(workload_.numParameters())});
  double sq = 0;
  for (const ParamTensor& p : params)
    for (float g : p.grad) sq += static_cast<double>(g) * static_cast<double>(g);
  // torch.nn.utils.clip_grad_norm_: the 1e-6 keeps a zero gradient finite; a scale >= 1 leaves the gradient alone.
  const double scale = clip_grad_norm_ / (std::sqrt(sq) + 1e-6);
  if (scale >= 1) return;
  kernel.cost().count = 2;
  kernel.cost().flops = static_cast<double>(workload_.numParameters()) * 3;  // square-add, then scale
  const auto f = static_cast<float>(scale);
  for (ParamTensor& p : params)
    for (float& g : p.grad) g *= f;
}

}  // namespace terse::train
