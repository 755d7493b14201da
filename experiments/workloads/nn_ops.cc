#include "experiments/workloads/nn_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/common/error.h"
#include "experiments/workloads/gemm.h"

namespace terse::workloads {

void setBlasThreads(int threads) {
  TERSE_CHECK(threads >= 1, InvalidArgument, "blas_threads must be >= 1, got " << threads);
  openblas_set_num_threads(threads);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
          float beta, float* c) {
  if (gemmKernel() == GemmKernel::kOpenBlas) {
    gemmOpenBlas(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  } else {
    gemmFixed(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }
}

double softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch, int64_t classes, float grad_scale,
                           float* dlogits, int64_t* correct) {
  double loss = 0.0;
  for (int64_t i = 0; i < batch; ++i) {
    const float* z = logits + i * classes;
    const int64_t best = std::max_element(z, z + classes) - z;
    const float zmax = z[best];
    // Subtracting the max keeps exp in range; the log-sum-exp is accumulated in double so the loss the
    // finite-difference tests difference is not dominated by rounding.
    double denom = 0.0;
    for (int64_t c = 0; c < classes; ++c) denom += std::exp(static_cast<double>(z[c] - zmax));
    const int32_t y = labels[i];
    loss += std::log(denom) - static_cast<double>(z[y] - zmax);
    if (best == y) ++*correct;
    if (dlogits != nullptr) {
      float* g = dlogits + i * classes;
      for (int64_t c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - zmax)) / denom;
        g[c] = static_cast<float>((p - (c == y ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
  return loss;
}

void initHeNormal(std::vector<float>& w, int64_t fan_in, train::SeededRng& rng) {
  const double stddev = std::sqrt(2.0 / static_cast<double>(fan_in));
  for (float& v : w) v = static_cast<float>(rng.normal() * stddev);
}

void initGlorotUniform(std::vector<float>& w, int64_t fan_in, int64_t fan_out, train::SeededRng& rng) {
  const double bound = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  for (float& v : w) v = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
}

void checkBatch(std::span<const int64_t> batch, int64_t num_examples) {
  TERSE_CHECK(!batch.empty(), InvalidArgument, "forwardBackward needs a non-empty batch");
  for (int64_t i : batch)
    TERSE_CHECK(i >= 0 && i < num_examples, InvalidArgument,
                "batch index " << i << " is outside the training set [0, " << num_examples << ")");
}

void gatherBatch(const Dataset& data, std::span<const int64_t> batch, float* x, int32_t* y) {
  const auto row_bytes = static_cast<std::size_t>(data.dims) * sizeof(float);
  for (std::size_t b = 0; b < batch.size(); ++b) {
    std::memcpy(x + static_cast<int64_t>(b) * data.dims, data.example(batch[b]), row_bytes);
    y[b] = data.labels[static_cast<std::size_t>(batch[b])];
  }
}

}  // namespace terse::workloads
