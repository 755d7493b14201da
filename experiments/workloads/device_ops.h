// The CUDA workloads' building blocks (the device twins of nn_ops.h and of cnn.cc's helpers): a row-major GEMM over
// cuBLAS and the small kernels around it. Every function enqueues on `stream` (or the handle's stream) and returns
// without waiting; every launch and cuBLAS call is checked (TERSE_CUDA_CHECK / TERSE_CUBLAS_CHECK), so a bad launch
// configuration throws DeviceError naming the kernel. All sizes are element counts; pointers are device memory of the
// current device. Nothing here allocates. Included only by CUDA builds (TERSE_HAVE_CUDA).
//
// The arithmetic follows the CPU models so that the two agree within float rounding: the same max-then-subtract
// softmax with the log-sum-exp in double, the same first-wins tie-break in arg-max and max-pool, the same strict
// "> 0" ReLU masks. The kernels are compiled with --fmad=false (experiments/workloads/CMakeLists.txt) like the CPU's
// -ffp-contract=off. Summation orders differ (cuBLAS, the tree reductions), which is the rounding the tests allow.
//
// Convolution layout: a batch of feature maps is "CNHW" on the device, [channels][batch][h * w], so one convolution
// over the whole batch is one GEMM, W [c_out x (c_in k k)] times col [(c_in k k) x (batch h_out w_out)], and the
// weight gradient is one GEMM too, dZ [c_out x (batch h w)] times col^T (the CPU loops over images instead). Pooling
// writes NCHW ([batch][channels][h * w], the CPU's layout), which is the fully connected layer's input row per image
// and what the next im2col reads.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

struct cublasContext;  // cublas_v2.h's cublasHandle_t is cublasContext*; this header need not pull cuBLAS in

namespace terse::workloads::device {

// C[m x n] = alpha * op(A) * op(B) + beta * C, all row-major and densely packed, op(A) m x k and op(B) k x n: the
// same contract as nn_ops.h's gemm. cuBLAS is column-major, so this computes C^T = op(B)^T op(A)^T (a row-major
// matrix is its transpose in column-major). Runs on the handle's stream. Throws InvalidArgument for a dimension that
// does not fit cuBLAS's int.
void gemm(cublasContext* handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, const float* b, float beta, float* c);

// dst [batch x dims] = features rows idx[0..batch), labels_dst[i] = labels[idx[i]]: the batch's examples gathered on
// the device, so a step moves only the indices host -> device. idx must be in range (checkBatch on the host).
void gatherRows(const float* features, const int32_t* labels, const int64_t* idx, int64_t batch, int64_t dims,
                float* dst, int32_t* labels_dst, cudaStream_t stream);

// dst[i] = bias[(i / inner) % count] for i < total: a bias broadcast the GEMM then accumulates onto (beta = 1).
// Row-major [rows x count]: inner = 1; CNHW [count][plane]: inner = plane.
void broadcastBias(const float* bias, int64_t count, int64_t inner, int64_t total, float* dst, cudaStream_t stream);

// x = max(x, 0) in place.
void relu(float* x, int64_t n, cudaStream_t stream);

// delta[i] = 0 where act[i] <= 0: the ReLU's backward given its output (the CPU's mask).
void reluMask(const float* act, float* delta, int64_t n, cudaStream_t stream);

// Softmax cross-entropy per example, one thread each, as nn_ops.h's softmaxCrossEntropy: loss[i] (double) the
// example's loss, correct[i] 1 when its first arg-max is the label; dlogits (may be null) = (softmax - onehot) *
// grad_scale. The caller sums loss/correct with sumLoss (no atomics: the sum is deterministic).
void softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch, int64_t classes, float grad_scale,
                         float* dlogits, double* loss, int32_t* correct, cudaStream_t stream);

// The sums of loss[0..n) and correct[0..n) in one block, in a fixed order (run to run the same bits).
struct LossTotals {
  double loss;
  long long correct;
};
void sumLoss(const double* loss, const int32_t* correct, int64_t n, LossTotals* out, cudaStream_t stream);

// out[j] = sum over i of x[i * cols + j] (row-major [rows x cols]), i ascending as on the CPU: the bias gradient of
// a fully connected layer.
void columnSums(const float* x, int64_t rows, int64_t cols, float* out, cudaStream_t stream);

// out[r] = sum over j of x[r * cols + j], one block per row (tree order): the bias gradient of a convolution over its
// CNHW output gradient [channels x (batch h w)].
void rowSums(const float* x, int64_t rows, int64_t cols, float* out, cudaStream_t stream);

// Unfolds a batch of images for a valid k x k convolution: col [(channels k k) x (batch ho wo)] with
// col[(c k + ki) k + kj][n ho wo + oi wo + oj] = src[n image_stride + c channel_stride + (oi + ki) w + oj + kj], where
// ho = h - k + 1, wo = w - k + 1 (cnn.cc's im2col, one column block per image).
void im2col(const float* src, int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t k, int64_t image_stride,
            int64_t channel_stride, float* col, cudaStream_t stream);

// The adjoint of im2col, as a gather (each source element sums the entries it was copied to, so no atomics and a
// fixed order): WRITES dsrc (every element of the batch's images, nothing needs zeroing).
void col2im(const float* col, int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t k, int64_t image_stride,
            int64_t channel_stride, float* dsrc, cudaStream_t stream);

// 2x2 max-pool, stride 2, from z in CNHW [channels][batch][h w] to out in NCHW [batch][channels][(h/2) (w/2)];
// arg[o] = the flat index into z of window o's first maximum (cnn.cc's tie-break). h and w are even.
void maxPool2(const float* z, int64_t batch, int64_t channels, int64_t h, int64_t w, float* out, int32_t* arg,
              cudaStream_t stream);

// The pool's and the ReLU's backward: dz (CNHW like z) = dpool[o] at window o's winner when z there is > 0 (a winner
// at 0 was a clamped ReLU), 0 elsewhere. One thread per element of z, so it WRITES all of dz and needs no zeroing.
void maxPool2Backward(const float* dpool, const int32_t* arg, const float* z, int64_t batch, int64_t channels,
                      int64_t h, int64_t w, float* dz, cudaStream_t stream);

}  // namespace terse::workloads::device
