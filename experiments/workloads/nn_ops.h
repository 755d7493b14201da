// The few building blocks the CPU workloads share: a row-major GEMM (terse's fixed-order kernel or OpenBLAS: gemm.h),
// softmax cross-entropy, seeded initializers, batch gathering. Internal to experiments/workloads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/train/seeded_rng.h"
#include "experiments/workloads/dataset.h"

namespace terse::workloads {

// One parameter tensor as a model declares it. A model's CPU workload and its CUDA sibling register the same list (the
// same names, shapes, layers and initial values for a seed), so a device model starts from exactly the host model's
// weights and the two can be compared step for step.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // row-major
  int layer = 0;
  std::vector<float> value;  // the initial values, numel of shape
};

// OpenBLAS's thread count is process-wide. Workers run one workload per thread, so BLAS threads on top would
// oversubscribe the cores; makeWorkload sets it once (WorkloadOptions::blas_threads, default 1).
void setBlasThreads(int threads);

// C[m x n] = alpha * op(A) * op(B) + beta * C, all row-major and densely packed; op(A) is m x k, op(B) is k x n. Every
// matrix product of the CPU models goes through here, computed by the kernel TERSE_GEMM names (gemm.h): by default
// terse's own, whose summation order (defined in gemm.h) makes the result the same bits on every x86-64 CPU.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
          float beta, float* c);

// Mean-reduced softmax cross-entropy over a batch of logits [batch x classes]. Returns the summed loss (the caller
// divides) and adds the number of correct arg-max predictions to *correct. When dlogits is non-null it receives
// (softmax - onehot) * grad_scale, the gradient of grad_scale * summed loss.
double softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch, int64_t classes, float grad_scale,
                           float* dlogits, int64_t* correct);

// He-normal (He et al. 2015, std sqrt(2 / fan_in)) for weights feeding a ReLU.
void initHeNormal(std::vector<float>& w, int64_t fan_in, train::SeededRng& rng);
// Glorot-uniform (Glorot & Bengio 2010, bound sqrt(6 / (fan_in + fan_out))) for the linear output layer.
void initGlorotUniform(std::vector<float>& w, int64_t fan_in, int64_t fan_out, train::SeededRng& rng);

// Throws InvalidArgument for an empty batch or an index outside [0, num_examples).
void checkBatch(std::span<const int64_t> batch, int64_t num_examples);
// Copies the batch's feature rows into x [batch x dims] and labels into y.
void gatherBatch(const Dataset& data, std::span<const int64_t> batch, float* x, int32_t* y);

}  // namespace terse::workloads
