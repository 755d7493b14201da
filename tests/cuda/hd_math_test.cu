// One kernel body, two launchers (DESIGN.md section 5): the error-feedback math the CPU decorator runs, launched from
// a CUDA kernel, must give the CPU's bits. And the engine's batched device copies (device_kernels::copySegments). Skips
// with a message on a machine without a GPU; CI still compiles it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "core/common/cuda.h"
#include "core/compress/device_kernels.h"
#include "core/compress/error_feedback_math.h"

namespace {

__global__ void efStepKernel(const float* g, float* e, const float* t, float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    p[i] = terse::efCorrect(g[i], e[i]);
    e[i] = terse::efResidual(p[i], t[i]);
  }
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto summary = terse::cuda::deviceSummary();
    if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
  }
};

TEST_F(CudaTest, ErrorFeedbackMathMatchesHostBitForBit) {
  constexpr int n = 1000003;  // odd, not a multiple of the block size
  std::vector<float> g(n), e(n), t(n);
  for (int i = 0; i < n; ++i) {
    g[i] = static_cast<float>((int64_t{i} * 7919) % 2001 - 1000) * 1e-3f;
    e[i] = static_cast<float>((int64_t{i} * 104729) % 301 - 150) * 1e-4f;
    t[i] = static_cast<float>(i % 3 - 1) * 0.5f;
  }
  std::vector<float> p_host(n), e_host = e;
  for (int i = 0; i < n; ++i) {
    p_host[i] = terse::efCorrect(g[i], e_host[i]);
    e_host[i] = terse::efResidual(p_host[i], t[i]);
  }

  float *dg, *de, *dt, *dp;
  const size_t bytes = n * sizeof(float);
  TERSE_CUDA_CHECK(cudaMalloc(&dg, bytes));
  TERSE_CUDA_CHECK(cudaMalloc(&de, bytes));
  TERSE_CUDA_CHECK(cudaMalloc(&dt, bytes));
  TERSE_CUDA_CHECK(cudaMalloc(&dp, bytes));
  TERSE_CUDA_CHECK(cudaMemcpy(dg, g.data(), bytes, cudaMemcpyHostToDevice));
  TERSE_CUDA_CHECK(cudaMemcpy(de, e.data(), bytes, cudaMemcpyHostToDevice));
  TERSE_CUDA_CHECK(cudaMemcpy(dt, t.data(), bytes, cudaMemcpyHostToDevice));
  efStepKernel<<<(n + 255) / 256, 256>>>(dg, de, dt, dp, n);
  TERSE_CUDA_CHECK(cudaGetLastError());
  std::vector<float> p_dev(n), e_dev(n);
  TERSE_CUDA_CHECK(cudaMemcpy(p_dev.data(), dp, bytes, cudaMemcpyDeviceToHost));
  TERSE_CUDA_CHECK(cudaMemcpy(e_dev.data(), de, bytes, cudaMemcpyDeviceToHost));
  for (float* d : {dg, de, dt, dp}) TERSE_CUDA_CHECK(cudaFree(d));

  EXPECT_EQ(0, std::memcmp(p_dev.data(), p_host.data(), bytes));
  EXPECT_EQ(0, std::memcmp(e_dev.data(), e_host.data(), bytes));
}

}  // namespace

namespace {

// device_kernels::copySegments (the engine's batched small copies): every combination of source offset, destination
// offset (0, 1, 2, 4, 8 and 12 mod 16) and length (0 to 4, 15 to 17, 64, 4095 and 16 KiB), so that each copy unit
// (16, 4, 2 and 1 bytes) runs, 396 segments in seven launches of at most 64, each in a 256-aligned slot of its own:
// each lands where it should, and the fill around it stays.
TEST_F(CudaTest, CopySegmentsCopiesEveryAlignmentAndLength) {
  const std::vector<std::size_t> offsets = {0, 1, 2, 4, 8, 12};
  const std::vector<std::size_t> lengths = {0, 1, 2, 3, 4, 15, 16, 17, 64, 4095, 16384};
  constexpr std::size_t kSlot = 16384 + 256;
  const std::size_t slots = offsets.size() * offsets.size() * lengths.size();
  std::vector<unsigned char> src(slots * kSlot), dst(slots * kSlot, 0xA5);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
  unsigned char *dsrc, *ddst;
  TERSE_CUDA_CHECK(cudaMalloc(&dsrc, src.size()));
  TERSE_CUDA_CHECK(cudaMalloc(&ddst, dst.size()));
  TERSE_CUDA_CHECK(cudaMemcpy(dsrc, src.data(), src.size(), cudaMemcpyHostToDevice));
  TERSE_CUDA_CHECK(cudaMemcpy(ddst, dst.data(), dst.size(), cudaMemcpyHostToDevice));
  std::vector<terse::device_kernels::CopySegment> segments;
  std::vector<unsigned char> want = dst;
  std::size_t slot = 0;
  for (std::size_t so : offsets) {
    for (std::size_t d : offsets) {
      for (std::size_t len : lengths) {
        const std::size_t s_at = slot * kSlot + so, d_at = slot * kSlot + 16 + d;  // fill before every destination
        segments.push_back({dsrc + s_at, ddst + d_at, len});
        std::memcpy(want.data() + d_at, src.data() + s_at, len);
        ++slot;
      }
    }
  }
  terse::device_kernels::copySegments(segments, nullptr);
  std::vector<unsigned char> got(dst.size());
  TERSE_CUDA_CHECK(cudaMemcpy(got.data(), ddst, got.size(), cudaMemcpyDeviceToHost));
  TERSE_CUDA_CHECK(cudaFree(dsrc));
  TERSE_CUDA_CHECK(cudaFree(ddst));
  EXPECT_EQ(got, want);
}

}  // namespace
