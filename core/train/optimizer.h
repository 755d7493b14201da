// The optimizer the synchronous trainer applies after the averaged gradients are in place: SGD with heavy-ball or
// Nesterov momentum and L2 weight decay, PyTorch's torch.optim.SGD semantics (no dampening), so a terse baseline
// matches the numbers people know:
//
//   g = grad + weight_decay * w
//   b = momentum * b + g                 (b starts at 0, so the first step's b is g, as PyTorch's is)
//   d = nesterov ? g + momentum * b : b  (d = g when momentum is 0)
//   w = w - lr_t * d
//
// and a learning-rate schedule lr_t of the step t (0-based, counted over the whole run):
//
//   base    = lr * (scale_by_world_size ? world_size : 1)       Goyal et al. 2017, "Accurate, Large Minibatch SGD"
//   warm-up = min(1, (t + 1) / W) for W = warm-up steps > 0      (linear from ~0; step 0 is not wasted at lr 0)
//   CONSTANT: lr_t = base * warm-up
//   STEP:     lr_t = base * warm-up * gamma^k, k = number of milestones m with epoch(t) >= m, epoch(t) = t / S
//   COSINE:   lr_t = base * 0.5 * (1 + cos(pi * (t - W) / (T - W))) for t >= W (Loshchilov & Hutter 2017, SGDR, one
//             cycle without restarts, decaying to 0 at T = total steps); the warm-up ramp before W
//
// With `adagrad` set the update is AdaGrad instead (sgd_math.h adagrad: per-element step lr / (sqrt(sum of squared
// gradients) + eps), the optimizer of GloVe, Pennington et al. 2014); host tensors only, no momentum.
//
// Device workloads (Workload::device() >= 0): the update runs as a kernel over ParamTensor::device_value/device_grad
// on the stream given at construction, with momentum buffers in device memory; the per-element math is the host's
// (sgd_math.h), bit for bit.
//
// Momentum correction in the compressor (DGC, core/compress/momentum_correction.h) carries the momentum itself: the
// optimizer's momentum must then be 0 (the config validation rejects both at once; this class does not know).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/common/device_memory.h"
#include "core/train/workload.h"

namespace terse::train {

enum class LrSchedule { kConstant, kStep, kCosine };

struct LrScheduleOptions {
  double lr = 0.01;
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 0;         // W; the caller converts warm-up epochs to steps (epochs * steps_per_epoch)
  std::vector<int64_t> milestones;  // STEP: epochs, strictly increasing, each >= 1
  double gamma = 0.1;               // STEP: factor per milestone
  bool scale_by_world_size = false;
  int world_size = 1;
  int64_t steps_per_epoch = 1;  // S
  int64_t total_steps = 1;      // T (COSINE)
};

// Throws InvalidArgument naming the field and its value.
void validateLrSchedule(const LrScheduleOptions& options);

// lr_t as above. Pure and cheap: the trainer calls it once per step.
double learningRate(const LrScheduleOptions& options, int64_t step);

struct SgdOptions {
  double momentum = 0;  // [0, 1)
  bool nesterov = false;
  double weight_decay = 0;  // >= 0
  bool adagrad = false;     // AdaGrad instead of SGD (see the top of this file)
  double adagrad_eps = 1e-10;
};

class SgdOptimizer {
 public:
  // Allocates one momentum buffer per tensor (when momentum > 0) up front, so update() allocates nothing. Throws
  // InvalidArgument for momentum outside [0, 1), nesterov without momentum, or negative weight decay.
  // `stream` (a cudaStream_t) orders the device updates when the tensors are on a device (device_value set); null for
  // host tensors.
  SgdOptimizer(std::span<const ParamTensor> params, const SgdOptions& options, void* stream = nullptr);

  const SgdOptions& options() const noexcept { return options_; }
  // One tensor's update with learning rate lr from its grad buffer (which it leaves alone). `index` is the tensor's
  // index in params(); `tensor` must be the same tensor the optimizer was built for (same size). A device tensor's
  // update is enqueued on the stream and not waited for.
  void update(std::size_t index, ParamTensor& tensor, double lr);
  // The same update restricted to the rows (slices along the first dimension) listed, ascending: a row-sparse
  // tensor's (workload.h), whose other rows have a zero gradient. Without momentum and weight decay a zero gradient
  // changes neither the value nor the optimizer's state, so this equals update() (the trainer checks lazyRowsExact()
  // first). Host tensors only.
  void updateRows(std::size_t index, ParamTensor& tensor, double lr, std::span<const int64_t> rows);
  // Whether updateRows gives update()'s result on a tensor whose other rows have a zero gradient.
  bool lazyRowsExact() const noexcept { return options_.momentum == 0 && options_.weight_decay == 0; }
  // Every tensor, in order.
  void updateAll(std::span<ParamTensor> params, double lr);

 private:
  SgdOptions options_;
  std::vector<std::vector<float>> momentum_;  // per tensor; empty when momentum is 0
  std::vector<std::vector<float>> sum_sq_;    // AdaGrad: per tensor, the sums of squared gradients
  bool device_ = false;
  void* stream_ = nullptr;
  std::vector<cuda::DeviceArray> device_momentum_;  // device tensors: per tensor; empty when momentum is 0
};

}  // namespace terse::train
