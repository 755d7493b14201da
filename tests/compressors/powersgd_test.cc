// powersgd: two SUM rounds driven by hand for several ranks, as the core would. Checks that the decoded aggregate is
// P^ (sum Q)^T for the P^ a reference computes from the summed P, that P^ is orthonormal (degenerate inputs too), that
// a rank-r matrix comes back exactly, that the warm start carries Q across steps (and converges to the best rank-r
// approximation), that non-matrices pass through losslessly, and that payloads and prev are validated.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/powersgd/powersgd_math.h"
#include "tests/compressors/plugin_harness.h"

namespace {

using terse::testing::aggregateInfo;
using terse::testing::Bytes;
using terse::testing::Instance;
using terse::testing::patched;
using terse::testing::Plugin;
using terse::testing::Scratch;
using terse::testing::sumPayloads;
using terse::testing::tensorInfo;
using terse::testing::truncated;
namespace ps = terse::compressors::powersgd;

constexpr size_t kStateHeader = 64;
constexpr size_t kWorkspaceTag = 64;

Plugin& powersgdPlugin() {
  static Plugin plugin("powersgd");
  return plugin;
}

terse_tensor_info_v1 matrixInfo(uint64_t n, uint64_t m, const terse::testing::InfoOptions& o = {}) {
  terse_tensor_info_v1 info = tensorInfo(n * m, o);
  info.ndim = 2;
  info.shape[0] = static_cast<int64_t>(n);
  info.shape[1] = static_cast<int64_t>(m);
  return info;
}

std::vector<double> randomNormal(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> v(count);
  for (double& x : v) x = normal(rng);
  return v;
}

// Row-major n x m = A B^T for column-major A (n x r) and B (m x r).
std::vector<float> lowRank(const std::vector<double>& A, const std::vector<double>& B, size_t n, size_t m, size_t r) {
  std::vector<float> M(n * m);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < m; ++j) {
      double s = 0;
      for (size_t c = 0; c < r; ++c) s += A[c * n + i] * B[c * m + j];
      M[i * m + j] = static_cast<float>(s);
    }
  }
  return M;
}

double frobenius(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}
double frobenius(const std::vector<float>& a) {
  return frobenius(a, std::vector<float>(a.size(), 0.0f));
}

std::vector<float> floatsAt(const Bytes& b, size_t offset, size_t count) {
  std::vector<float> v(count);
  std::memcpy(v.data(), b.data() + offset, 4 * count);
  return v;
}
std::vector<double> doublesAt(const Bytes& b, size_t offset, size_t count) {
  std::vector<double> v(count);
  std::memcpy(v.data(), b.data() + offset, 8 * count);
  return v;
}

// One rank of a simulated run: its scratch (kept across steps) and its gradient.
struct Rank {
  Scratch scratch;
  std::vector<float> grad;
};

// What one step produced, for the checks.
struct StepResult {
  std::vector<Bytes> p_payloads, q_payloads;
  Bytes p_sum, q_sum;
  std::vector<float> q_before;              // rank 0's state Q used by round 0
  std::vector<std::vector<float>> decoded;  // per rank, the aggregate's decode
  std::vector<std::vector<float>> own;      // per rank, its own last payload's decode (error feedback's view)
};

StepResult runStep(Instance& c, std::vector<Rank>& ranks, uint64_t n, uint64_t m, uint64_t step, uint64_t seed = 99) {
  const int world = static_cast<int>(ranks.size());
  StepResult out;
  const auto info = [&](int rank, int round) {
    return matrixInfo(n, m, {.rank = rank, .world_size = world, .step = step, .seed = seed, .round = round});
  };
  for (int r = 0; r < world; ++r) {
    Rank& rk = ranks[static_cast<size_t>(r)];
    out.p_payloads.push_back(c.compress(info(r, 0), rk.grad, &rk.scratch));
    if (r == 0 && !rk.scratch.state().empty()) {
      out.q_before = floatsAt(rk.scratch.state(), kStateHeader, (rk.scratch.state().size() - kStateHeader) / 4);
    }
  }
  out.p_sum = sumPayloads(out.p_payloads, 16, TERSE_DTYPE_F32);
  for (int r = 0; r < world; ++r) {
    Rank& rk = ranks[static_cast<size_t>(r)];
    out.q_payloads.push_back(c.compress(info(r, 1), rk.grad, &rk.scratch, out.p_sum));
    // Error feedback decodes the local payload right away, before the aggregate arrives.
    std::vector<float> own(n * m, 0.0f);
    EXPECT_EQ(c.decompress(info(r, 1), out.q_payloads.back(), own, false, &rk.scratch), TERSE_OK) << c.lastError();
    out.own.push_back(own);
  }
  out.q_sum = sumPayloads(out.q_payloads, 16, TERSE_DTYPE_F32);
  for (int r = 0; r < world; ++r) {
    Rank& rk = ranks[static_cast<size_t>(r)];
    std::vector<float> dec(n * m, 0.0f);
    EXPECT_EQ(c.decompress(aggregateInfo(info(r, 1)), out.q_sum, dec, false, &rk.scratch), TERSE_OK) << c.lastError();
    out.decoded.push_back(dec);
  }
  return out;
}

std::vector<Rank> makeRanks(Instance& c, uint64_t n, uint64_t m, const std::vector<std::vector<float>>& grads) {
  std::vector<Rank> ranks;
  for (const auto& g : grads) ranks.push_back(Rank{Scratch(c.sizes(matrixInfo(n, m))), g});
  return ranks;
}

TEST(PowerSgd, CapsAndSizes) {
  Instance c(powersgdPlugin(), {{"rank", "4"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  const terse_compressor_caps_v1 caps = c.caps();
  EXPECT_EQ(caps.aggregation, TERSE_AGG_SUM);
  EXPECT_EQ(caps.wire_dtype, TERSE_DTYPE_F32);
  EXPECT_EQ(caps.flags, TERSE_CAP_FIXED_SIZE | TERSE_CAP_STATEFUL | TERSE_CAP_SHARED_SEED);
  EXPECT_EQ(caps.num_rounds, 2);
  EXPECT_EQ(caps.devices, terse::testing::kCudaPluginDevices);
  // 1024 x 1024 at rank 4: two rounds of 16 + 4 * 1024 * 4 bytes.
  for (int round : {0, 1}) {
    const terse_compressor_sizes_v1 s = c.sizes(matrixInfo(1024, 1024, {.round = round}));
    EXPECT_EQ(s.max_output_bytes, 16u + 4u * 4096u);
    EXPECT_EQ(s.sum_header_bytes, 16u);
    EXPECT_EQ(s.state_bytes, 64u + 4u * 4096u);
    EXPECT_EQ(s.workspace_bytes, 64u + 8u * (1024u + 1024u) * 4u);
  }
  // A 300 x 200 matrix is 300 rows of 200 columns; a 4-d tensor is shape[0] rows.
  EXPECT_EQ(c.sizes(matrixInfo(300, 200)).max_output_bytes, 16u + 4u * 300u * 4u);
  EXPECT_EQ(c.sizes(matrixInfo(300, 200, {.round = 1})).max_output_bytes, 16u + 4u * 200u * 4u);
  for (const char* bad : {"0", "-1", "1025", "two"}) {
    Instance b(powersgdPlugin(), {{"rank", bad}});
    EXPECT_EQ(b.initStatus(), TERSE_ERR_INVALID_ARGUMENT) << bad;
  }
}

// An unknown device is refused in every build, a CUDA tensor exactly when the plugin was built without its kernels.
// With them, a CUDA tensor's workspace holds the 64-byte tag, P^ in double, P^ in f32 (16-byte aligned), the
// orthogonalization's slice totals (32 bytes a slice for a P taller than one slice of 32,768 rows, nothing otherwise:
// powersgd_cuda.h's orthoScratchBytes) and cuBLAS's scratch (blasScratchBytes: 32 partial sums of the larger factor
// within [16 KiB, 4 MiB], plus 256 bytes of alignment slack); the state is the host's.
TEST(PowerSgd, DeviceSizesAndRefusals) {
  Instance c(powersgdPlugin(), {{"rank", "4"}});
  ASSERT_TRUE(c.ok()) << c.lastError();
  terse_compressor_sizes_v1 s{};
  terse_tensor_info_v1 info = matrixInfo(1024, 1024);
  info.device = static_cast<terse_device_v1>(4);
  EXPECT_EQ(c.getSizes(info, &s), TERSE_ERR_UNSUPPORTED);
  EXPECT_NE(c.lastError().find("powersgd: unknown device 4"), std::string::npos) << c.lastError();
  info.device = TERSE_DEVICE_CUDA;
  info.device_index = 0;
  if (!TERSE_TEST_CUDA_PLUGINS) {
    EXPECT_EQ(c.getSizes(info, &s), TERSE_ERR_UNSUPPORTED);
    EXPECT_NE(c.lastError().find("powersgd: only host memory is supported (this build of the plugin has no CUDA "
                                 "kernels)"),
              std::string::npos)
        << c.lastError();
    return;
  }
  for (int round : {0, 1}) {
    info.round = round;
    ASSERT_EQ(c.getSizes(info, &s), TERSE_OK) << c.lastError();
    EXPECT_EQ(s.max_output_bytes, 16u + 4u * 4096u);
    EXPECT_EQ(s.state_bytes, 64u + 4u * 4096u);
    EXPECT_EQ(s.workspace_bytes, 64u + 8u * 4096u + 4u * 4096u + (32u * 4u * 1024u * 4u + 256u));
  }
  // Small factors get cuBLAS's 16 KiB minimum; an odd n r pads P^ in f32 to 16 bytes.
  info = matrixInfo(33, 31);
  info.device = TERSE_DEVICE_CUDA;
  info.device_index = 0;
  Instance c3(powersgdPlugin(), {{"rank", "3"}});
  ASSERT_EQ(c3.getSizes(info, &s), TERSE_OK) << c3.lastError();
  EXPECT_EQ(s.workspace_bytes, 64u + 8u * 99u + 8u + 4u * 99u + 4u + (16384u + 256u));
  // 70,001 rows: three slices of the orthogonalization (96 bytes), and cuBLAS's 4 MiB cap.
  info = matrixInfo(70001, 5);
  info.device = TERSE_DEVICE_CUDA;
  info.device_index = 0;
  ASSERT_EQ(c.getSizes(info, &s), TERSE_OK) << c.lastError();
  EXPECT_EQ(s.workspace_bytes, 64u + 8u * 280004u + 4u * 280004u + 3u * 32u + (4194304u + 256u));
}

TEST(PowerSgd, CompressionRule) {
  EXPECT_FALSE(ps::compresses(1, 100, 1, 1, 0));     // a vector
  EXPECT_FALSE(ps::compresses(2, 8, 8, 4, 0));       // r (n + m) = 64 = n m: no gain
  EXPECT_TRUE(ps::compresses(2, 9, 9, 4, 0));        // 72 < 81
  EXPECT_FALSE(ps::compresses(2, 20, 20, 1, 1000));  // below min_compression_numel
  EXPECT_TRUE(ps::compresses(2, 40, 40, 1, 1000));
  EXPECT_FALSE(ps::compresses(2, 0, 5, 1, 0));
}

// Three ranks, summed by hand: the decode equals P^ (sum_w Q_w)^T with P^ = ORTHOGONALIZE(sum_w M_w Q) from a
// reference Gram-Schmidt, on every rank; the per-rank decodes add up to it.
TEST(PowerSgd, ThreeRanksMatchReference) {
  const uint64_t n = 37, m = 23, r = 3;
  Instance c(powersgdPlugin(), {{"rank", "3"}});
  std::vector<std::vector<float>> grads;
  for (uint32_t w = 0; w < 3; ++w) {
    const std::vector<double> x = randomNormal(n * m, 100 + w);
    grads.emplace_back(x.begin(), x.end());
  }
  std::vector<Rank> ranks = makeRanks(c, n, m, grads);
  const StepResult s = runStep(c, ranks, n, m, /*step=*/0);
  ASSERT_EQ(s.q_before.size(), m * r);
  for (const Bytes& p : s.p_payloads) ASSERT_EQ(p.size(), 16 + 4 * n * r);
  for (const Bytes& q : s.q_payloads) ASSERT_EQ(q.size(), 16 + 4 * m * r);

  // Every rank drew the same initial Q (shared seed).
  for (size_t w = 1; w < ranks.size(); ++w) {
    // States after the step hold the same Q' on every rank.
    EXPECT_EQ(ranks[w].scratch.state(), ranks[0].scratch.state()) << "rank " << w;
  }

  // P = sum_w M_w Q.
  const std::vector<float> P = floatsAt(s.p_sum, 16, n * r);
  std::vector<double> Pref(n * r, 0.0);
  for (const auto& M : grads) {
    for (size_t c2 = 0; c2 < r; ++c2) {
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < m; ++j) Pref[c2 * n + i] += static_cast<double>(M[i * m + j]) * s.q_before[c2 * m + j];
      }
    }
  }
  for (size_t e = 0; e < P.size(); ++e) ASSERT_NEAR(P[e], Pref[e], 1e-4 * (1 + std::fabs(Pref[e]))) << e;

  // Reference P^: classical Gram-Schmidt of the summed P, in double.
  std::vector<double> Phat(P.begin(), P.end());
  for (size_t c2 = 0; c2 < r; ++c2) {
    double* v = Phat.data() + c2 * n;
    for (int sweep = 0; sweep < 2; ++sweep) {
      for (size_t q = 0; q < c2; ++q) {
        double d = 0;
        for (size_t i = 0; i < n; ++i) d += Phat[q * n + i] * v[i];
        for (size_t i = 0; i < n; ++i) v[i] -= d * Phat[q * n + i];
      }
    }
    double norm = 0;
    for (size_t i = 0; i < n; ++i) norm += v[i] * v[i];
    for (size_t i = 0; i < n; ++i) v[i] /= std::sqrt(norm);
  }
  const std::vector<double> Pw = doublesAt(ranks[0].scratch.workspace(), kWorkspaceTag, n * r);
  for (size_t e = 0; e < Pw.size(); ++e) ASSERT_NEAR(Pw[e], Phat[e], 1e-10) << e;

  // Q' = sum_w M_w^T P^, and the decode is P^ Q'^T.
  const std::vector<float> Q = floatsAt(s.q_sum, 16, m * r);
  std::vector<double> Qref(m * r, 0.0);
  for (const auto& M : grads) {
    for (size_t c2 = 0; c2 < r; ++c2) {
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < m; ++j) Qref[c2 * m + j] += static_cast<double>(M[i * m + j]) * Phat[c2 * n + i];
      }
    }
  }
  for (size_t e = 0; e < Q.size(); ++e) ASSERT_NEAR(Q[e], Qref[e], 1e-4 * (1 + std::fabs(Qref[e]))) << e;
  std::vector<float> want(n * m);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < m; ++j) {
      double v = 0;
      for (size_t c2 = 0; c2 < r; ++c2) v += Phat[c2 * n + i] * Q[c2 * m + j];
      want[i * m + j] = static_cast<float>(v);
    }
  }
  std::vector<float> sum_own(n * m, 0.0f);
  for (size_t w = 0; w < ranks.size(); ++w) {
    for (size_t e = 0; e < want.size(); ++e) {
      ASSERT_NEAR(s.decoded[w][e], want[e], 1e-5 * (1 + std::fabs(want[e]))) << "rank " << w << " entry " << e;
      sum_own[e] += s.own[w][e];
    }
  }
  for (size_t e = 0; e < want.size(); ++e) ASSERT_NEAR(sum_own[e], want[e], 1e-4 * (1 + std::fabs(want[e]))) << e;

  // The aggregate's decode stored Q' for the warm start.
  EXPECT_EQ(floatsAt(ranks[0].scratch.state(), kStateHeader, m * r), Q);
}

void expectOrthonormal(const std::vector<double>& P, size_t n, size_t r, const std::string& what) {
  for (size_t a = 0; a < r; ++a) {
    for (size_t b = 0; b < r; ++b) {
      double d = 0;
      for (size_t i = 0; i < n; ++i) d += P[a * n + i] * P[b * n + i];
      EXPECT_NEAR(d, a == b ? 1.0 : 0.0, 1e-12) << what << ": columns " << a << ", " << b;
    }
  }
}

TEST(PowerSgd, OrthogonalFactorEvenWhenDegenerate) {
  const uint64_t n = 30, m = 20, r = 4;
  Instance c(powersgdPlugin(), {{"rank", "4"}});
  const std::vector<double> a = randomNormal(n, 1), b = randomNormal(m, 2);
  const std::vector<float> rank1 = lowRank(a, b, n, m, 1);
  const std::vector<double> x = randomNormal(n * m, 3);
  for (const auto& [what, grad] :
       std::vector<std::pair<std::string, std::vector<float>>>{{"full rank", std::vector<float>(x.begin(), x.end())},
                                                               {"rank 1 (dependent columns of P)", rank1},
                                                               {"zero (zero P)", std::vector<float>(n * m, 0.0f)}}) {
    std::vector<Rank> ranks = makeRanks(c, n, m, {grad});
    for (uint64_t step = 0; step < 3; ++step) {
      const StepResult s = runStep(c, ranks, n, m, step);
      expectOrthonormal(doublesAt(ranks[0].scratch.workspace(), kWorkspaceTag, n * r), n, r,
                        what + ", step " + std::to_string(step));
      // A matrix of rank <= r comes back as it is.
      if (what != "full rank") {
        EXPECT_LT(frobenius(s.decoded[0], grad), 1e-5 * (1 + frobenius(grad))) << what;
      }
    }
  }
}

// A zero gradient leaves Q' = 0; the next round 0 redraws Q, so the iteration does not stay stuck at zero.
TEST(PowerSgd, ZeroColumnsOfQAreRedrawn) {
  const uint64_t n = 16, m = 12;
  Instance c(powersgdPlugin(), {{"rank", "2"}});
  std::vector<Rank> ranks = makeRanks(c, n, m, {std::vector<float>(n * m, 0.0f)});
  runStep(c, ranks, n, m, 0);
  EXPECT_EQ(floatsAt(ranks[0].scratch.state(), kStateHeader, m * 2), std::vector<float>(m * 2, 0.0f));
  const std::vector<double> a = randomNormal(n, 4), b = randomNormal(m, 5);
  ranks[0].grad = lowRank(a, b, n, m, 1);
  const StepResult s = runStep(c, ranks, n, m, 1);
  EXPECT_NE(s.q_before, std::vector<float>(m * 2, 0.0f));
  EXPECT_LT(frobenius(s.decoded[0], ranks[0].grad), 1e-5 * frobenius(ranks[0].grad));
}

// sum_w M_w of rank r (the ranks share B, so sum_w A_w B^T has rank r) comes back exactly, at the first step and after
// warm-up.
TEST(PowerSgd, RecoversRankRMatrixExactly) {
  const uint64_t n = 48, m = 40, r = 3;
  Instance c(powersgdPlugin(), {{"rank", "3"}});
  const std::vector<double> B = randomNormal(m * r, 7);
  std::vector<std::vector<float>> grads;
  std::vector<float> total(n * m, 0.0f);
  for (uint32_t w = 0; w < 3; ++w) {
    grads.push_back(lowRank(randomNormal(n * r, 10 + w), B, n, m, r));
    for (size_t e = 0; e < total.size(); ++e) total[e] += grads.back()[e];
  }
  std::vector<Rank> ranks = makeRanks(c, n, m, grads);
  for (uint64_t step = 0; step < 4; ++step) {
    const StepResult s = runStep(c, ranks, n, m, step);
    EXPECT_LT(frobenius(s.decoded[0], total), 1e-5 * frobenius(total)) << "step " << step;
  }
}

// The warm start: Q' of step t seeds step t+1. On a fixed matrix with a decaying spectrum this is power iteration, so
// the error falls to that of the best rank-r approximation; a cold start (state zeroed every step) stays above it, and
// step 2's result differs between the two.
TEST(PowerSgd, WarmStartCarriesQAcrossSteps) {
  const uint64_t n = 32, m = 24, r = 2, K = 24;
  // M = sum_k s_k u_k v_k^T with orthonormal u, v and s_k = 2^-k: the best rank-2 error is sqrt(sum_{k>=2} s_k^2).
  const auto orthonormal = [](size_t rows, size_t cols, uint32_t seed) {
    std::vector<double> U = randomNormal(rows * cols, seed);
    for (size_t c2 = 0; c2 < cols; ++c2) {
      double* v = U.data() + c2 * rows;
      for (int sweep = 0; sweep < 2; ++sweep) {
        for (size_t q = 0; q < c2; ++q) {
          double d = 0;
          for (size_t i = 0; i < rows; ++i) d += U[q * rows + i] * v[i];
          for (size_t i = 0; i < rows; ++i) v[i] -= d * U[q * rows + i];
        }
      }
      double norm = 0;
      for (size_t i = 0; i < rows; ++i) norm += v[i] * v[i];
      for (size_t i = 0; i < rows; ++i) v[i] /= std::sqrt(norm);
    }
    return U;
  };
  std::vector<double> U = orthonormal(n, K, 40), V = orthonormal(m, K, 41);
  double best = 0;
  for (size_t k = 0; k < K; ++k) {
    const double sk = std::ldexp(1.0, -static_cast<int>(k));
    for (size_t i = 0; i < n; ++i) U[k * n + i] *= sk;
    if (k >= r) best += sk * sk;
  }
  best = std::sqrt(best);
  const std::vector<float> M = lowRank(U, V, n, m, K);

  Instance c(powersgdPlugin(), {{"rank", "2"}});
  std::vector<Rank> warm = makeRanks(c, n, m, {M});
  std::vector<Rank> cold = makeRanks(c, n, m, {M});
  std::vector<float> warm2, cold2;
  double warm_err = 0, cold_err = 0;
  for (uint64_t step = 0; step < 20; ++step) {
    std::fill(cold[0].scratch.state().begin(), cold[0].scratch.state().end(), std::byte{0});
    const StepResult w = runStep(c, warm, n, m, step);
    const StepResult k = runStep(c, cold, n, m, step);
    if (step == 0) {
      EXPECT_EQ(w.decoded[0], k.decoded[0]) << "both start from the same Q";
    }
    if (step == 1) {
      warm2 = w.decoded[0];
      cold2 = k.decoded[0];
    }
    warm_err = frobenius(w.decoded[0], M);
    cold_err = std::max(cold_err, frobenius(k.decoded[0], M));
  }
  EXPECT_NE(warm2, cold2) << "step 2 does not depend on step 1's Q";
  EXPECT_LT(warm_err, best * 1.001) << "best rank-2 error " << best;
  EXPECT_GT(cold_err, best * 1.01) << "a cold start should not reach the best approximation every step";
}

// Vectors, empty tensors, matrices too small to gain, and matrices below min_compression_numel travel raw in round 1.
TEST(PowerSgd, PassthroughIsLossless) {
  Instance c(powersgdPlugin(), {{"rank", "4"}, {"min_compression_numel", "1000"}});
  struct Case {
    std::string what;
    terse_tensor_info_v1 info;
  };
  const auto vector = [](uint64_t n, int32_t ndim) {
    terse_tensor_info_v1 i = tensorInfo(n);
    i.ndim = ndim;
    if (ndim == 0) i.shape[0] = 0;
    return i;
  };
  for (const Case& k : std::vector<Case>{{"vector", vector(101, 1)},
                                         {"flat (ndim 0)", vector(77, 0)},
                                         {"empty", vector(0, 1)},
                                         {"8 x 8 at rank 4", matrixInfo(8, 8)},
                                         {"20 x 20 below min numel", matrixInfo(20, 20)}}) {
    const uint64_t numel = k.info.numel;
    std::vector<std::vector<float>> grads;
    std::vector<float> total(numel, 0.0f);
    std::vector<Bytes> p0, p1;
    for (int w = 0; w < 3; ++w) {
      const std::vector<double> x = randomNormal(numel, 50 + static_cast<uint32_t>(w));
      grads.emplace_back(x.begin(), x.end());
      for (size_t e = 0; e < numel; ++e) total[e] += grads.back()[e];
    }
    for (int w = 0; w < 3; ++w) {
      terse_tensor_info_v1 info = k.info;
      info.rank = w, info.source_rank = w, info.world_size = 3;
      EXPECT_EQ(c.sizes(info).state_bytes, 0u) << k.what;
      p0.push_back(c.compress(info, grads[static_cast<size_t>(w)]));
      EXPECT_EQ(p0.back().size(), 16u) << k.what;
    }
    const Bytes prev = sumPayloads(p0, 16, TERSE_DTYPE_F32);
    for (int w = 0; w < 3; ++w) {
      terse_tensor_info_v1 info = k.info;
      info.rank = w, info.source_rank = w, info.world_size = 3, info.round = 1;
      p1.push_back(c.compress(info, grads[static_cast<size_t>(w)], nullptr, prev));
      EXPECT_EQ(p1.back().size(), 16u + 4u * numel) << k.what;
      EXPECT_EQ(c.decode(info, p1.back()), grads[static_cast<size_t>(w)]) << k.what;
    }
    terse_tensor_info_v1 agg = aggregateInfo(k.info);
    agg.round = 1, agg.world_size = 3;
    EXPECT_EQ(c.decode(agg, sumPayloads(p1, 16, TERSE_DTYPE_F32)), total) << k.what;
  }
}

TEST(PowerSgd, RefusesNonFiniteGradient) {
  Instance c(powersgdPlugin(), {{"rank", "2"}});
  std::vector<float> g(20 * 10, 1.0f);
  g[17] = NAN;
  Scratch sc(c.sizes(matrixInfo(20, 10)));
  Bytes out;
  EXPECT_EQ(c.tryCompress(matrixInfo(20, 10), g, &out, &sc), TERSE_ERR_INVALID_ARGUMENT);
}

TEST(PowerSgd, RejectsMalformedPayloadsAndPrev) {
  const uint64_t n = 20, m = 10, r = 2;
  Instance c(powersgdPlugin(), {{"rank", "2"}});
  const std::vector<double> x = randomNormal(n * m, 60);
  std::vector<Rank> ranks = makeRanks(c, n, m, {std::vector<float>(x.begin(), x.end())});
  const StepResult s = runStep(c, ranks, n, m, 0);
  Scratch& sc = ranks[0].scratch;
  const auto info1 = aggregateInfo(matrixInfo(n, m, {.round = 1}));
  const Bytes state_before = sc.state();

  Bytes nan_q = patched<float>(s.q_sum, 16 + 4 * 3, NAN);
  Bytes longer = s.q_sum;
  longer.resize(longer.size() + 4);
  for (const auto& [what, payload] :
       std::vector<std::pair<std::string, Bytes>>{{"empty", Bytes{}},
                                                  {"truncated", truncated(s.q_sum, 4)},
                                                  {"trailing", longer},
                                                  {"round-0 payload", s.p_sum},
                                                  {"wrong numel", patched<uint64_t>(s.q_sum, 8, n * m + 1)},
                                                  {"NaN in Q", nan_q},
                                                  {"inf in Q", patched<float>(s.q_sum, 16, INFINITY)}}) {
    std::vector<float> out(n * m, 4.0f);
    EXPECT_EQ(c.decompress(info1, payload, out, false, &sc), TERSE_ERR_INVALID_PAYLOAD) << what;
    for (float v : out) ASSERT_EQ(v, 4.0f) << what;
    EXPECT_EQ(sc.state(), state_before) << what << " touched the warm-start state";
  }

  // Round 1's prev is untrusted too.
  const auto round1 = matrixInfo(n, m, {.round = 1});
  for (const auto& [what, prev] :
       std::vector<std::pair<std::string, Bytes>>{{"truncated prev", truncated(s.p_sum, 4)},
                                                  {"NaN in P", patched<float>(s.p_sum, 16, NAN)},
                                                  {"Q payload as prev", s.q_sum}}) {
    Bytes out;
    EXPECT_EQ(c.tryCompress(round1, ranks[0].grad, &out, &sc, prev), TERSE_ERR_INVALID_PAYLOAD) << what;
  }
  Bytes out;
  EXPECT_EQ(c.tryCompress(round1, ranks[0].grad, &out, &sc, {}), TERSE_ERR_INVALID_ARGUMENT) << "no prev";

  // A decompress in a step whose round 1 this workspace never saw.
  Scratch fresh(c.sizes(matrixInfo(n, m)));
  std::vector<float> o(n * m);
  EXPECT_EQ(c.decompress(info1, s.q_sum, o, false, &fresh), TERSE_ERR_INVALID_ARGUMENT);
  auto next_step = info1;
  next_step.step = 1;
  EXPECT_EQ(c.decompress(next_step, s.q_sum, o, false, &sc), TERSE_ERR_INVALID_ARGUMENT);
  (void)r;
}

// Decoding one rank's own payload (error feedback) leaves the state alone; only the aggregate's decode stores Q'.
TEST(PowerSgd, OnlyTheAggregateUpdatesState) {
  const uint64_t n = 20, m = 10;
  Instance c(powersgdPlugin(), {{"rank", "2"}});
  const std::vector<double> x = randomNormal(n * m, 61);
  const std::vector<float> g(x.begin(), x.end());
  Scratch sc(c.sizes(matrixInfo(n, m)));
  const Bytes p = c.compress(matrixInfo(n, m), g, &sc);
  const auto info1 = matrixInfo(n, m, {.round = 1});
  const Bytes q = c.compress(info1, g, &sc, p);
  const Bytes state = sc.state();
  const Bytes workspace = sc.workspace();
  std::vector<float> out(n * m);
  ASSERT_EQ(c.decompress(info1, q, out, false, &sc), TERSE_OK) << c.lastError();
  EXPECT_EQ(sc.state(), state);
  EXPECT_EQ(sc.workspace(), workspace);
  ASSERT_EQ(c.decompress(aggregateInfo(info1), q, out, true, &sc), TERSE_OK) << c.lastError();
  EXPECT_EQ(sc.workspace(), workspace);
  EXPECT_NE(sc.state(), state);
  EXPECT_EQ(floatsAt(sc.state(), kStateHeader, m * 2), floatsAt(q, 16, m * 2));
}

}  // namespace
