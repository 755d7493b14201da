// Ef21: the equations step by step against a reference written out here, EF21-SGDM's momentum, what a fixed
// gradient does to the estimates, multi-round inputs, and the guards (round order, failed steps, CUSTOM, eta, dtype).
#include "core/compress/ef21.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/compress/error_feedback.h"
#include "core/compress/plugin_codec.h"
#include "tests/compress/fake_compressors.h"

namespace terse {
namespace {

using testing::expectThrowWith;
using testing::flatTensor;
using testing::ScratchProbe;
using testing::ThresholdCompressor;
using testing::TruncCompressor;
using testing::TwoRoundCompressor;

constexpr uint64_t kNumel21 = 1001;  // odd, so no loop is a whole number of vector lanes

// TruncCompressor's caps with an f16 wire: only the caps matter to the refusal.
class HalfWire final : public TruncCompressor {
 public:
  CompressorCaps makeCaps(DType dtype) const override {
    CompressorCaps c = TruncCompressor::makeCaps(dtype);
    c.wire_dtype = DType::kF16;
    return c;
  }
};

std::vector<float> gradient(std::mt19937_64& rng, std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  return g;
}

// One rank's step through a single-round SUM codec: encode, then the aggregate (at world 1 the rank's own payload)
// decoded and handed to aggregated(), as the pipeline does. Returns out, the sum of the estimates.
std::vector<float> step(TensorCodec& codec, uint64_t s, const std::vector<float>& g) {
  std::vector<std::byte> payload(codec.sizes(0).max_output_bytes);
  const uint64_t bytes = codec.encode(s, 0, g.data(), {}, payload);
  std::vector<float> out(g.size(), -7.0f);
  codec.decode(s, std::span<const std::byte>(payload).first(bytes), -1, out.data(), false);
  codec.aggregated(s, out.data(), nullptr, 0);
  return out;
}

// h_{t+1} = h_t + D(C(g_t - h_t)) and H_{t+1} = H_t + D(aggregate), bit for bit, for a truncating compressor whose
// D(C(x)) is TruncCompressor::quantize(x) exactly.
TEST(Ef21, EveryStepMatchesTheEquations) {
  Ef21 codec(makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(kNumel21), 3));
  std::mt19937_64 rng(11);
  std::vector<float> h(kNumel21, 0.0f), sum(kNumel21, 0.0f);
  float moved = 0;
  for (uint64_t s = 0; s < 20; ++s) {
    const std::vector<float> g = gradient(rng, kNumel21, 3.0f);
    const std::vector<float> out = step(codec, s, g);
    for (std::size_t i = 0; i < kNumel21; ++i) {
      const float t = TruncCompressor::quantize(g[i] - h[i]);
      h[i] = h[i] + t;
      sum[i] = sum[i] + t;
      moved = std::max(moved, std::fabs(t));
      ASSERT_EQ(codec.transmitted()[i], t) << "step " << s << " element " << i;
      ASSERT_EQ(codec.estimate()[i], h[i]) << "step " << s << " element " << i;
      ASSERT_EQ(out[i], sum[i]) << "step " << s << " element " << i;
      ASSERT_EQ(codec.estimateSum()[i], sum[i]) << "step " << s << " element " << i;
    }
  }
  EXPECT_GT(moved, 1.0f) << "the test must move the estimates";
  EXPECT_TRUE(codec.momentum().empty()) << "plain EF21 keeps no momentum";
}

// EF21-SGDM: v_1 = g_1, then v_t = (1 - eta) v_{t-1} + eta g_t, and the compressor sees v_t - h_t.
TEST(Ef21, MomentumFollowsEf21Sgdm) {
  const float eta = 0.25f;
  auto trunc = std::make_shared<TruncCompressor>();
  Ef21 codec(makePluginCodec(trunc, flatTensor(kNumel21), 3), eta);
  EXPECT_EQ(codec.eta(), eta);
  std::mt19937_64 rng(12);
  std::vector<float> v(kNumel21, 0.0f), h(kNumel21, 0.0f);
  for (uint64_t s = 0; s < 12; ++s) {
    const std::vector<float> g = gradient(rng, kNumel21, 3.0f);
    step(codec, s, g);
    for (std::size_t i = 0; i < kNumel21; ++i) {
      v[i] = s == 0 ? g[i] : (1.0f - eta) * v[i] + eta * g[i];
      h[i] = h[i] + TruncCompressor::quantize(v[i] - h[i]);
      ASSERT_EQ(codec.momentum()[i], v[i]) << "step " << s << " element " << i;
      ASSERT_EQ(codec.estimate()[i], h[i]) << "step " << s << " element " << i;
    }
  }
}

// With a gradient that does not change, a sparsifier that sends the differences above a threshold exactly makes each
// estimate the gradient once every difference was sent, and the output the gradient where it is sent and 0 where it
// never is: what EF21 is for. Error feedback's output at that step holds the bursts its residual lets through (2g
// every other step where |g| is in [0.25, 0.5)).
TEST(Ef21, AFixedGradientIsReachedAndKept) {
  std::mt19937_64 rng(13);
  const std::vector<float> g = gradient(rng, kNumel21);
  Ef21 ef21(makePluginCodec(std::make_shared<ThresholdCompressor>(0.5f), flatTensor(kNumel21), 3));
  ErrorFeedback ef(makePluginCodec(std::make_shared<ThresholdCompressor>(0.5f), flatTensor(kNumel21), 3));
  std::vector<float> out21, outef;
  for (uint64_t s = 0; s < 4; ++s) {
    out21 = step(ef21, s, g);
    outef = step(ef, s, g);
  }
  double far = 0;
  for (std::size_t i = 0; i < kNumel21; ++i) {
    // |g| >= 0.5 is sent at once; below it the difference never reaches the threshold, so h stays 0 there.
    const float expected = std::fabs(g[i]) >= 0.5f ? g[i] : 0.0f;
    ASSERT_EQ(out21[i], expected) << "element " << i;
    far = std::max(far, static_cast<double>(std::fabs(outef[i] - expected)));
  }
  EXPECT_GE(far, 0.5) << "error feedback's output is another: the test tells the two apart";
}

// Multi-round: round 0 fixes the input g - h, every round encodes it, and the last round's own decode moves h (once
// the step's aggregate is in).
TEST(Ef21, MultiRoundSeesOneInputAndUsesTheLastRoundsPayload) {
  auto two = std::make_shared<TwoRoundCompressor>();
  Ef21 codec(makePluginCodec(two, flatTensor(kNumel21), 3));
  std::mt19937_64 rng(14);
  std::vector<float> h(kNumel21, 0.0f);
  for (uint64_t s = 0; s < 3; ++s) {
    const std::vector<float> g = gradient(rng, kNumel21, 2.0f);
    std::vector<std::byte> p0(codec.sizes(0).max_output_bytes), p1(codec.sizes(1).max_output_bytes);
    const uint64_t b0 = codec.encode(s, 0, g.data(), {}, p0);
    EXPECT_EQ(codec.estimate()[0], h[0]) << "h moves only after the last round";
    const uint64_t b1 = codec.encode(s, 1, nullptr, std::span<const std::byte>(p0).first(b0), p1);
    EXPECT_EQ(codec.estimate()[0], h[0]) << "h moves only when the step's aggregate is in";
    std::vector<float> out(kNumel21);
    codec.decode(s, std::span<const std::byte>(p1).first(b1), -1, out.data(), false);
    codec.aggregated(s, out.data(), nullptr, 0);
    ASSERT_GE(two->calls.size(), 2u);
    const auto& r0 = two->calls[two->calls.size() - 2];
    const auto& r1 = two->calls.back();
    float prefix = 0;
    for (float x : r0.input) prefix += x;
    for (std::size_t i = 0; i < kNumel21; ++i) {
      ASSERT_EQ(r0.input[i], g[i] - h[i]) << "round 0, element " << i;
      ASSERT_EQ(r1.input[i], r0.input[i]) << "round 1, element " << i;
      h[i] = h[i] + (TruncCompressor::quantize(r1.input[i]) + TruncCompressor::quantize(prefix));
      ASSERT_EQ(codec.estimate()[i], h[i]) << "step " << s << " element " << i;
    }
  }
}

TEST(Ef21, RoundsMustComeInOrder) {
  Ef21 codec(makePluginCodec(std::make_shared<TwoRoundCompressor>(), flatTensor(8), 3));
  std::vector<float> g(8, 1.0f);
  std::vector<std::byte> p(codec.sizes(1).max_output_bytes);
  expectThrowWith<InvalidArgument>([&] { codec.encode(0, 1, g.data(), {}, p); }, {"EF21", "expected round 0"});
  expectThrowWith<InvalidArgument>([&] { codec.encode(0, 2, g.data(), {}, p); }, {"round must be in [0, 2)"});
}

// A step commits only in aggregated(): an encode whose step then fails (its payload refused, by a throw before
// aggregated() or by a raised verdict word that aggregated() reads) leaves h, v and H as they were, and the next step
// runs from them as if the failed one had never been.
TEST(Ef21, AFailedStepMovesNothing) {
  auto trunc = std::make_shared<TruncCompressor>();
  Ef21 codec(makePluginCodec(trunc, flatTensor(kNumel21), 3), 0.5);
  Ef21 clean(makePluginCodec(trunc, flatTensor(kNumel21), 3), 0.5);
  std::mt19937_64 rng(15);
  const std::vector<float> g0 = gradient(rng, kNumel21, 3.0f), g1 = gradient(rng, kNumel21, 3.0f),
                           g2 = gradient(rng, kNumel21, 3.0f);
  step(codec, 0, g0);
  step(clean, 0, g0);
  const auto snapshot = [&] {
    return std::vector<std::vector<float>>{{codec.estimate().begin(), codec.estimate().end()},
                                           {codec.estimateSum().begin(), codec.estimateSum().end()},
                                           {codec.momentum().begin(), codec.momentum().end()}};
  };
  const auto before = snapshot();
  // Encoded, then the step fails before its aggregate: a throw (nothing calls aggregated) ...
  std::vector<std::byte> payload(codec.sizes(0).max_output_bytes);
  const uint64_t bytes = codec.encode(1, 0, g1.data(), {}, payload);
  EXPECT_EQ(snapshot(), before) << "encode alone moved the state";
  // ... or a raised word: a host plugin may refuse through its verdict word instead of throwing.
  std::vector<float> out(kNumel21);
  codec.decode(1, std::span<const std::byte>(payload).first(bytes), -1, out.data(), false);
  const std::vector<float> decoded = out;
  const uint32_t words[3] = {0, 1, 0};
  codec.aggregated(1, out.data(), words, 3);
  EXPECT_EQ(snapshot(), before) << "a raised verdict word let the step commit";
  EXPECT_EQ(out, decoded) << "a raised verdict word let out move";
  // The next step runs from the state of step 0, as the clean codec that never saw the failed one.
  const std::vector<float> a = step(codec, 2, g2), b = step(clean, 2, g2);
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::vector<float>(codec.estimate().begin(), codec.estimate().end()),
            std::vector<float>(clean.estimate().begin(), clean.estimate().end()));
  // A payload that does not fit refuses before anything is staged.
  std::vector<std::byte> small(8);
  EXPECT_THROW(codec.encode(3, 0, g2.data(), {}, small), Error);
}

// aggregated() commits what encode staged by copying it, so calling it again for the same step (calibration's timed
// repetitions) leaves h and v as they are; only H moves.
TEST(Ef21, ASecondAggregatedOfOneStepMovesOnlyTheSum) {
  Ef21 codec(makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(kNumel21), 3), 0.5);
  std::mt19937_64 rng(17);
  step(codec, 0, gradient(rng, kNumel21, 3.0f));
  const std::vector<float> h(codec.estimate().begin(), codec.estimate().end());
  const std::vector<float> v(codec.momentum().begin(), codec.momentum().end());
  const std::vector<float> sum(codec.estimateSum().begin(), codec.estimateSum().end());
  std::vector<float> out(kNumel21, 1.0f);
  codec.aggregated(0, out.data(), nullptr, 0);
  EXPECT_EQ(std::vector<float>(codec.estimate().begin(), codec.estimate().end()), h);
  EXPECT_EQ(std::vector<float>(codec.momentum().begin(), codec.momentum().end()), v);
  EXPECT_EQ(codec.estimateSum()[0], sum[0] + 1.0f);
}

TEST(Ef21, ResetForgetsEverything) {
  Ef21 codec(makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(kNumel21), 3), 0.5);
  std::mt19937_64 rng(16);
  step(codec, 0, gradient(rng, kNumel21, 3.0f));
  codec.reset();
  for (std::size_t i = 0; i < kNumel21; ++i) {
    ASSERT_EQ(codec.estimate()[i], 0.0f);
    ASSERT_EQ(codec.estimateSum()[i], 0.0f);
    ASSERT_EQ(codec.momentum()[i], 0.0f);
  }
  // The momentum starts again at the next gradient.
  const std::vector<float> g = gradient(rng, kNumel21, 3.0f);
  step(codec, 1, g);
  for (std::size_t i = 0; i < kNumel21; ++i) ASSERT_EQ(codec.momentum()[i], g[i]) << i;
}

TEST(Ef21, EmptyTensorWorks) {
  Ef21 codec(makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(0), 3), 0.5);
  for (uint64_t s = 0; s < 3; ++s) EXPECT_TRUE(step(codec, s, {}).empty());
  EXPECT_TRUE(codec.estimate().empty());
}

TEST(Ef21, Refusals) {
  expectThrowWith<InvalidArgument>([] { Ef21 codec(nullptr); }, {"EF21", "null"});
  for (double eta : {0.0, -0.5, 1.5, std::nan(""), 1e-50}) {
    expectThrowWith<InvalidArgument>(
        [&] { Ef21 codec(makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(4), 3), eta); },
        {"eta must be in (0, 1]"});
  }
  expectThrowWith<Unsupported>(
      [] { Ef21 codec(makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(4, DType::kF16), 3)); },
      {"f32 gradients only", "f16"});
  expectThrowWith<Unsupported>([] { Ef21 codec(makePluginCodec(std::make_shared<ScratchProbe>(), flatTensor(4), 3)); },
                               {"CUSTOM", "SUM or ALLGATHER"});
  // A SUM wire of 16 bits would leave each sum's rounding in H for good.
  expectThrowWith<Unsupported>([] { Ef21 codec(makePluginCodec(std::make_shared<HalfWire>(), flatTensor(4), 3)); },
                               {"this compressor sums in f16", "sums in f32"});
}

}  // namespace
}  // namespace terse
