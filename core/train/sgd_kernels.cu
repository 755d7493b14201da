// core/train/sgd_kernels.h for CUDA builds: a grid-stride loop over sgd_math.h, built with --fmad=false.
#include <cuda_runtime_api.h>

#include "core/common/error.h"
#include "core/train/sgd_kernels.h"
#include "core/train/sgd_math.h"

namespace terse::train::sgd_kernels {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

__global__ void sgdKernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ b, std::size_t n,
                          float lr, float wd, float mu, bool nesterov) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if (b == nullptr) {
      w[i] = sgdPlain(w[i], g[i], lr, wd);
    } else {
      float wi = w[i];
      float bi = b[i];
      sgdMomentum(wi, bi, g[i], lr, wd, mu, nesterov);
      w[i] = wi;
      b[i] = bi;
    }
  }
}

}  // namespace

void update(float* w, const float* grad, float* momentum, std::size_t n, float lr, float weight_decay, float mu,
            bool nesterov, void* stream) {
  if (n == 0) return;
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  sgdKernel<<<static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0,
              static_cast<cudaStream_t>(stream)>>>(w, grad, momentum, n, lr, weight_decay, mu, nesterov);
  const cudaError_t err = cudaGetLastError();
  TERSE_CHECK(err == cudaSuccess, DeviceError,
              "sgdKernel launch failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err));
}

}  // namespace terse::train::sgd_kernels
