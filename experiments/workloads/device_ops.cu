// experiments/workloads/device_ops.h: the kernels and their launchers. Element-wise kernels use grid-stride loops
// over int64 indices, so any size runs with a bounded grid.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>

#include "core/common/cuda.h"
#include "core/common/error.h"
#include "experiments/workloads/cublas_check.h"
#include "experiments/workloads/device_ops.h"

namespace terse::workloads::device {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; the grid-stride loops cover the rest.
constexpr int64_t kMaxBlocks = 1 << 16;

unsigned blocksFor(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// A launch's configuration errors (no kernel image for this GPU, too many threads) surface only through
// cudaGetLastError, which also clears them; the message names the kernel rather than the query.
void checkLaunch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    TERSE_THROW(DeviceError,
                "launch of " << kernel << " failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err));
}

int cublasInt(int64_t v) {
  TERSE_CHECK(v >= 0 && v <= INT_MAX, InvalidArgument, "matrix dimension " << v << " does not fit cuBLAS's int");
  return static_cast<int>(v);
}

#define TERSE_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += gridDim.x * static_cast<int64_t>(blockDim.x))

__global__ void gatherRowsKernel(const float* features, const int32_t* labels, const int64_t* idx, int64_t batch,
                                 int64_t dims, float* dst, int32_t* labels_dst) {
  TERSE_GRID_STRIDE(i, batch * dims) {
    const int64_t b = i / dims;
    dst[i] = features[idx[b] * dims + (i - b * dims)];
    if (i < batch) labels_dst[i] = labels[idx[i]];
  }
}

__global__ void broadcastBiasKernel(const float* bias, int64_t count, int64_t inner, int64_t total, float* dst) {
  TERSE_GRID_STRIDE(i, total) {
    dst[i] = bias[(i / inner) % count];
  }
}

__global__ void reluKernel(float* x, int64_t n) {
  TERSE_GRID_STRIDE(i, n) {
    x[i] = fmaxf(x[i], 0.0f);
  }
}

__global__ void reluMaskKernel(const float* act, float* delta, int64_t n) {
  TERSE_GRID_STRIDE(i, n) {
    if (act[i] <= 0.0f) delta[i] = 0.0f;
  }
}

// nn_ops.cc's softmaxCrossEntropy for one example per thread: the float max subtracted in float, then exp, the sum,
// the log and the probabilities in double, the gradient rounded to float once at the end.
__global__ void softmaxCrossEntropyKernel(const float* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                          float grad_scale, float* dlogits, double* loss, int32_t* correct) {
  TERSE_GRID_STRIDE(i, batch) {
    const float* z = logits + i * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (z[c] > z[best]) best = c;  // std::max_element's first maximum
    const float zmax = z[best];
    double denom = 0.0;
    for (int64_t c = 0; c < classes; ++c) denom += exp(static_cast<double>(z[c] - zmax));
    const int32_t y = labels[i];
    loss[i] = log(denom) - static_cast<double>(z[y] - zmax);
    correct[i] = best == y ? 1 : 0;
    if (dlogits != nullptr) {
      float* g = dlogits + i * classes;
      for (int64_t c = 0; c < classes; ++c) {
        const double p = exp(static_cast<double>(z[c] - zmax)) / denom;
        g[c] = static_cast<float>((p - (c == y ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
}

// One block: per-thread strided sums, then a shared-memory tree. Launched with kThreads threads (a power of two).
__global__ void sumLossKernel(const double* loss, const int32_t* correct, int64_t n, LossTotals* out) {
  __shared__ double loss_part[kThreads];
  __shared__ long long correct_part[kThreads];
  double l = 0.0;
  long long c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    l += loss[i];
    c += correct[i];
  }
  loss_part[threadIdx.x] = l;
  correct_part[threadIdx.x] = c;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      loss_part[threadIdx.x] += loss_part[threadIdx.x + half];
      correct_part[threadIdx.x] += correct_part[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out->loss = loss_part[0];
    out->correct = correct_part[0];
  }
}

// Adjacent threads read adjacent columns of a row, so the loads coalesce; the sum runs over rows in the CPU's order.
__global__ void columnSumsKernel(const float* x, int64_t rows, int64_t cols, float* out) {
  TERSE_GRID_STRIDE(j, cols) {
    float s = 0.0f;
    for (int64_t i = 0; i < rows; ++i) s += x[i * cols + j];
    out[j] = s;
  }
}

// One block per row (blockIdx.x), kThreads threads.
__global__ void rowSumsKernel(const float* x, int64_t cols, float* out) {
  __shared__ float part[kThreads];
  const float* row = x + blockIdx.x * cols;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += row[j];
  part[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

// One thread per element of col, in col's order, so the writes coalesce.
__global__ void im2colKernel(const float* src, int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t k,
                             int64_t image_stride, int64_t channel_stride, float* col) {
  const int64_t ho = h - k + 1, wo = w - k + 1, hw = ho * wo, width = batch * hw;
  TERSE_GRID_STRIDE(i, channels * k * k * width) {
    const int64_t r = i / width, at = i - r * width;
    const int64_t n = at / hw, p = at - n * hw;
    const int64_t oi = p / wo, oj = p - oi * wo;
    const int64_t ch = r / (k * k), ki = (r / k) % k, kj = r % k;
    col[i] = src[n * image_stride + ch * channel_stride + (oi + ki) * w + oj + kj];
  }
}

// One thread per source element, summing its entries of col in cnn.cc's col2im order (ki, then kj, ascending).
__global__ void col2imKernel(const float* col, int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t k,
                             int64_t image_stride, int64_t channel_stride, float* dsrc) {
  const int64_t ho = h - k + 1, wo = w - k + 1, hw = ho * wo, width = batch * hw;
  TERSE_GRID_STRIDE(i, batch * channels * h * w) {
    const int64_t n = i / (channels * h * w);
    const int64_t ch = (i / (h * w)) % channels;
    const int64_t y = (i / w) % h, x = i % w;
    float s = 0.0f;
    for (int64_t ki = 0; ki < k; ++ki) {
      const int64_t oi = y - ki;
      if (oi < 0 || oi >= ho) continue;
      for (int64_t kj = 0; kj < k; ++kj) {
        const int64_t oj = x - kj;
        if (oj < 0 || oj >= wo) continue;
        s += col[((ch * k + ki) * k + kj) * width + n * hw + oi * wo + oj];
      }
    }
    dsrc[n * image_stride + ch * channel_stride + y * w + x] = s;
  }
}

// One thread per pooled output, in NCHW order.
__global__ void maxPool2Kernel(const float* z, int64_t batch, int64_t channels, int64_t h, int64_t w, float* out,
                               int32_t* arg) {
  const int64_t ho = h / 2, wo = w / 2;
  TERSE_GRID_STRIDE(o, batch * channels * ho * wo) {
    const int64_t n = o / (channels * ho * wo);
    const int64_t ch = (o / (ho * wo)) % channels;
    const int64_t i = (o / wo) % ho, j = o % wo;
    const int64_t base = (ch * batch + n) * h * w;
    int64_t best = base + 2 * i * w + 2 * j;
    for (int64_t di = 0; di < 2; ++di)
      for (int64_t dj = 0; dj < 2; ++dj) {
        const int64_t at = base + (2 * i + di) * w + 2 * j + dj;
        if (z[at] > z[best]) best = at;  // strict: the first maximum wins, as on the CPU
      }
    out[o] = z[best];
    arg[o] = static_cast<int32_t>(best);
  }
}

// One thread per element of z (CNHW): its window's pooled index o, then the gradient if it is o's winner.
__global__ void maxPool2BackwardKernel(const float* dpool, const int32_t* arg, const float* z, int64_t batch,
                                       int64_t channels, int64_t h, int64_t w, float* dz) {
  const int64_t ho = h / 2, wo = w / 2;
  TERSE_GRID_STRIDE(i, channels * batch * h * w) {
    const int64_t ch = i / (batch * h * w);
    const int64_t n = (i / (h * w)) % batch;
    const int64_t y = (i / w) % h, x = i % w;
    const int64_t o = ((n * channels + ch) * ho + y / 2) * wo + x / 2;
    dz[i] = (arg[o] == i && z[i] > 0.0f) ? dpool[o] : 0.0f;
  }
}

#undef TERSE_GRID_STRIDE

}  // namespace

void gemm(cublasContext* handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c) {
  // Row-major C [m x n] is column-major C^T [n x m] = op(B)^T op(A)^T: B goes first, m and n swap, and each leading
  // dimension is the row length of the row-major matrix as stored.
  TERSE_CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 cublasInt(n), cublasInt(m), cublasInt(k), &alpha, b, cublasInt(trans_b ? k : n), a,
                                 cublasInt(trans_a ? m : k), &beta, c, cublasInt(n)));
}

void gatherRows(const float* features, const int32_t* labels, const int64_t* idx, int64_t batch, int64_t dims,
                float* dst, int32_t* labels_dst, cudaStream_t stream) {
  if (batch * dims == 0) return;
  gatherRowsKernel<<<blocksFor(batch * dims), kThreads, 0, stream>>>(features, labels, idx, batch, dims, dst,
                                                                     labels_dst);
  checkLaunch("gatherRowsKernel");
}

void broadcastBias(const float* bias, int64_t count, int64_t inner, int64_t total, float* dst, cudaStream_t stream) {
  if (total == 0) return;
  broadcastBiasKernel<<<blocksFor(total), kThreads, 0, stream>>>(bias, count, inner, total, dst);
  checkLaunch("broadcastBiasKernel");
}

void relu(float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  reluKernel<<<blocksFor(n), kThreads, 0, stream>>>(x, n);
  checkLaunch("reluKernel");
}

void reluMask(const float* act, float* delta, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  reluMaskKernel<<<blocksFor(n), kThreads, 0, stream>>>(act, delta, n);
  checkLaunch("reluMaskKernel");
}

void softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch, int64_t classes, float grad_scale,
                         float* dlogits, double* loss, int32_t* correct, cudaStream_t stream) {
  if (batch == 0) return;
  softmaxCrossEntropyKernel<<<blocksFor(batch), kThreads, 0, stream>>>(logits, labels, batch, classes, grad_scale,
                                                                       dlogits, loss, correct);
  checkLaunch("softmaxCrossEntropyKernel");
}

void sumLoss(const double* loss, const int32_t* correct, int64_t n, LossTotals* out, cudaStream_t stream) {
  sumLossKernel<<<1, kThreads, 0, stream>>>(loss, correct, n, out);
  checkLaunch("sumLossKernel");
}

void columnSums(const float* x, int64_t rows, int64_t cols, float* out, cudaStream_t stream) {
  if (cols == 0) return;
  columnSumsKernel<<<blocksFor(cols), kThreads, 0, stream>>>(x, rows, cols, out);
  checkLaunch("columnSumsKernel");
}

void rowSums(const float* x, int64_t rows, int64_t cols, float* out, cudaStream_t stream) {
  if (rows == 0) return;
  TERSE_CHECK(rows <= INT_MAX, InvalidArgument, "rowSums: " << rows << " rows exceed the grid");
  rowSumsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, out);
  checkLaunch("rowSumsKernel");
}

void im2col(const float* src, int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t k, int64_t image_stride,
            int64_t channel_stride, float* col, cudaStream_t stream) {
  const int64_t total = channels * k * k * batch * (h - k + 1) * (w - k + 1);
  if (total == 0) return;
  im2colKernel<<<blocksFor(total), kThreads, 0, stream>>>(src, batch, channels, h, w, k, image_stride, channel_stride,
                                                          col);
  checkLaunch("im2colKernel");
}

void col2im(const float* col, int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t k, int64_t image_stride,
            int64_t channel_stride, float* dsrc, cudaStream_t stream) {
  const int64_t total = batch * channels * h * w;
  if (total == 0) return;
  col2imKernel<<<blocksFor(total), kThreads, 0, stream>>>(col, batch, channels, h, w, k, image_stride, channel_stride,
                                                          dsrc);
  checkLaunch("col2imKernel");
}

void maxPool2(const float* z, int64_t batch, int64_t channels, int64_t h, int64_t w, float* out, int32_t* arg,
              cudaStream_t stream) {
  // arg holds flat indices into z as int32 (the CPU's type, and half the bytes of int64).
  TERSE_CHECK(channels * batch * h * w <= INT32_MAX, InvalidArgument,
              "maxPool2: " << channels * batch * h * w << " feature-map elements exceed the int32 arg-max index");
  const int64_t total = batch * channels * (h / 2) * (w / 2);
  if (total == 0) return;
  maxPool2Kernel<<<blocksFor(total), kThreads, 0, stream>>>(z, batch, channels, h, w, out, arg);
  checkLaunch("maxPool2Kernel");
}

void maxPool2Backward(const float* dpool, const int32_t* arg, const float* z, int64_t batch, int64_t channels,
                      int64_t h, int64_t w, float* dz, cudaStream_t stream) {
  const int64_t total = channels * batch * h * w;
  if (total == 0) return;
  maxPool2BackwardKernel<<<blocksFor(total), kThreads, 0, stream>>>(dpool, arg, z, batch, channels, h, w, dz);
  checkLaunch("maxPool2BackwardKernel");
}

}  // namespace terse::workloads::device
