// MomentumCorrection against a hand-written reference of DGC's equations (Lin et al. 2018, Algorithm 1; Nesterov
// form as in the paper's reference code), with momentum factor masking on and off.
#include "core/compress/momentum_correction.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "core/compress/plugin_codec.h"
#include "tests/compress/fake_compressors.h"

namespace terse {
namespace {

using testing::expectThrowWith;
using testing::flatTensor;
using testing::ThresholdCompressor;

constexpr float kThreshold = 1.0f;
constexpr std::size_t kN = 256;

// DGC as the paper writes it, one worker, threshold sparsification:
//   u <- m u + g;  v <- v + u;  mask <- |v| >= thr;  sent <- v ⊙ mask;  v <- v ⊙ ¬mask;  u <- u ⊙ ¬mask
// Nesterov: u <- m (u + g);  v <- v + u + g;  the rest as above.
struct DgcReference {
  float m;
  bool masking;
  bool nesterov;
  std::vector<float> u = std::vector<float>(kN, 0.0f);
  std::vector<float> v = std::vector<float>(kN, 0.0f);
  std::vector<float> sent = std::vector<float>(kN, 0.0f);

  void step(const std::vector<float>& g) {
    for (std::size_t i = 0; i < kN; ++i) {
      if (nesterov) {
        u[i] = m * (u[i] + g[i]);
        v[i] = v[i] + (u[i] + g[i]);
      } else {
        u[i] = m * u[i] + g[i];
        v[i] = v[i] + u[i];
      }
      const bool mask = std::fabs(v[i]) >= kThreshold;
      sent[i] = mask ? v[i] : 0.0f;
      if (mask) v[i] = 0.0f;
      if (mask && masking) u[i] = 0.0f;
    }
  }
};

class MomentumCorrectionVsReference : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(MomentumCorrectionVsReference, MatchesDgcEquations) {
  const auto [masking, nesterov] = GetParam();
  constexpr float kM = 0.9f;
  MomentumCorrection mc(std::make_unique<ErrorFeedback>(
                            makePluginCodec(std::make_shared<ThresholdCompressor>(kThreshold), flatTensor(kN), 1)),
                        kM, masking, nesterov);
  EXPECT_EQ(mc.momentumFactor(), kM);
  DgcReference ref{kM, masking, nesterov};

  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.4f);
  std::vector<std::byte> out(mc.sizes(0).max_output_bytes);
  std::vector<float> decoded(kN);
  int sent_total = 0, masked_total = 0;
  for (uint64_t step = 0; step < 12; ++step) {
    std::vector<float> g(kN);
    for (float& x : g) x = normal(rng);
    const uint64_t bytes = mc.encode(step, 0, g.data(), {}, out);
    mc.decode(step, std::span<const std::byte>(out).first(bytes), 0, decoded.data(), false);
    ref.step(g);
    for (std::size_t i = 0; i < kN; ++i) {
      ASSERT_FLOAT_EQ(decoded[i], ref.sent[i]) << "step " << step << " element " << i;
      ASSERT_FLOAT_EQ(mc.errorFeedback().transmitted()[i], ref.sent[i]);
      ASSERT_FLOAT_EQ(mc.errorFeedback().residual()[i], ref.v[i]) << "v, step " << step << " element " << i;
      ASSERT_FLOAT_EQ(mc.momentum()[i], ref.u[i]) << "u, step " << step << " element " << i;
      if (ref.sent[i] != 0.0f) {
        ++sent_total;
        if (mc.momentum()[i] == 0.0f) ++masked_total;
      }
    }
  }
  // The data must exercise both branches: some coordinates sent, others accumulating.
  EXPECT_GT(sent_total, 50);
  EXPECT_LT(sent_total, static_cast<int>(12 * kN / 2));
  if (masking) {
    EXPECT_EQ(masked_total, sent_total);
  } else {
    EXPECT_EQ(masked_total, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(MaskingAndNesterov, MomentumCorrectionVsReference,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& param_info) {
                           return std::string(std::get<0>(param_info.param) ? "Masking" : "NoMasking") +
                                  (std::get<1>(param_info.param) ? "Nesterov" : "Plain");
                         });

// m = 0 is plain error feedback: u_t = g_t, v accumulates g.
TEST(MomentumCorrection, ZeroMomentumIsErrorFeedback) {
  auto thr = std::make_shared<ThresholdCompressor>(kThreshold);
  MomentumCorrection mc(std::make_unique<ErrorFeedback>(makePluginCodec(thr, flatTensor(kN), 1)), 0.0, true);
  ErrorFeedback ef(makePluginCodec(thr, flatTensor(kN), 1));
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.4f);
  std::vector<std::byte> out(mc.sizes(0).max_output_bytes);
  for (uint64_t step = 0; step < 6; ++step) {
    std::vector<float> g(kN);
    for (float& x : g) x = normal(rng);
    mc.encode(step, 0, g.data(), {}, out);
    ef.encode(step, 0, g.data(), {}, out);
    for (std::size_t i = 0; i < kN; ++i) ASSERT_EQ(mc.errorFeedback().residual()[i], ef.residual()[i]);
  }
}

TEST(MomentumCorrection, ResetForgetsMomentumAndResidual) {
  MomentumCorrection mc(std::make_unique<ErrorFeedback>(
                            makePluginCodec(std::make_shared<ThresholdCompressor>(kThreshold), flatTensor(4), 1)),
                        0.5, false);
  std::vector<std::byte> out(mc.sizes(0).max_output_bytes);
  const float g[4] = {0.25f, -0.5f, 0.75f, 3.0f};
  mc.encode(0, 0, g, {}, out);
  EXPECT_EQ(mc.momentum()[0], 0.25f);
  mc.reset();
  for (float u : mc.momentum()) EXPECT_EQ(u, 0.0f);
  for (float v : mc.errorFeedback().residual()) EXPECT_EQ(v, 0.0f);
}

TEST(MomentumCorrection, RejectsMomentumOutsideUnitInterval) {
  auto thr = std::make_shared<ThresholdCompressor>(kThreshold);
  for (double m : {1.0, -0.1, 1.5, 0.999999999}) {
    expectThrowWith<InvalidArgument>(
        [&] { MomentumCorrection mc(std::make_unique<ErrorFeedback>(makePluginCodec(thr, flatTensor(4), 1)), m); },
        {"momentum", "[0, 1)"});
  }
  EXPECT_THROW(MomentumCorrection(nullptr, 0.9), InvalidArgument);
}

TEST(MomentumCorrection, EmptyTensorWorks) {
  MomentumCorrection mc(std::make_unique<ErrorFeedback>(
                            makePluginCodec(std::make_shared<ThresholdCompressor>(kThreshold), flatTensor(0), 1)),
                        0.9, true, true);
  std::vector<std::byte> out(mc.sizes(0).max_output_bytes);
  for (uint64_t step = 0; step < 2; ++step) {
    const uint64_t bytes = mc.encode(step, 0, nullptr, {}, out);
    mc.decode(step, std::span<const std::byte>(out).first(bytes), -1, nullptr, false);
  }
  EXPECT_TRUE(mc.momentum().empty());
}

}  // namespace
}  // namespace terse
