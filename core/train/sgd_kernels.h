// The SGD update (sgd_math.h) on a CUDA device, for a device workload's parameters (Workload::device() >= 0): one
// kernel per tensor, enqueued on `stream` without waiting. `momentum` null means plain SGD. In a build without CUDA it
// throws Unsupported (sgd_kernels_none.cc): no device tensor can exist there.
#pragma once

#include <cstddef>

namespace terse::train::sgd_kernels {

void update(float* w, const float* grad, float* momentum, std::size_t n, float lr, float weight_decay, float mu,
            bool nesterov, void* stream);

}  // namespace terse::train::sgd_kernels
