// ErrorFeedback: the telescoping invariant, the exact one-step residual, multi-round behaviour and its guards.
#include "core/compress/error_feedback.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/compress/plugin_codec.h"
#include "terse/compressor.h"
#include "tests/compress/fake_compressors.h"

namespace terse {
namespace {

using testing::expectThrowWith;
using testing::flatTensor;
using testing::payloadBytes;
using testing::TruncCompressor;
using testing::TwoRoundCompressor;

constexpr uint64_t kNumel = 1000;
constexpr int kSteps = 50;

std::vector<float> randomGradient(std::mt19937_64& rng, std::size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  return g;
}

TensorInfo matrixTensor() {
  TensorInfo t = flatTensor(kNumel);
  t.ndim = 2;
  t.shape = {25, 40, 0, 0};
  return t;
}

struct Sums {
  std::vector<double> inputs;
  std::vector<double> transmitted;
};

// Runs kSteps of random gradients through `codec`, summing (in double) the inputs and what each step's payload
// decodes to on this rank.
Sums runSteps(TensorCodec& codec, uint64_t rng_seed) {
  std::mt19937_64 rng(rng_seed);
  Sums s{std::vector<double>(kNumel, 0.0), std::vector<double>(kNumel, 0.0)};
  std::vector<std::byte> out(codec.sizes(0).max_output_bytes);
  std::vector<float> decoded(kNumel);
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = randomGradient(rng, kNumel);
    const uint64_t bytes = codec.encode(static_cast<uint64_t>(step), 0, g.data(), {}, out);
    codec.decode(static_cast<uint64_t>(step), std::span<const std::byte>(out).first(bytes), 0, decoded.data(), false);
    for (std::size_t i = 0; i < kNumel; ++i) {
      s.inputs[i] += g[i];
      s.transmitted[i] += decoded[i];
    }
  }
  return s;
}

// (a) sum_t D(C(p_t)) == sum_t g_t - e_T, elementwise: nothing is lost, only delayed.
TEST(ErrorFeedback, TransmittedSumEqualsInputSumMinusFinalResidual) {
  ErrorFeedback ef(makePluginCodec(std::make_shared<TruncCompressor>(), matrixTensor(), 7));
  const Sums s = runSteps(ef, 2024);
  ASSERT_EQ(ef.residual().size(), kNumel);
  double worst = 0;
  for (std::size_t i = 0; i < kNumel; ++i) {
    const double e = ef.residual()[i];
    // Only p = g + e rounds (once per step, half an ulp of |p| <~ 4); the residual update is exact for truncation.
    EXPECT_NEAR(s.transmitted[i], s.inputs[i] - e, 2e-5) << "element " << i;
    EXPECT_LT(std::fabs(e), 0.5) << "a truncation residual stays below one quantization step";
    worst = std::max(worst, std::fabs(s.transmitted[i] - s.inputs[i]));
  }
  EXPECT_GT(worst, 0.1) << "the compressor must be lossy for this test to mean anything";
}

// (b) Without error feedback the same sums drift apart: the test above bites.
TEST(ErrorFeedback, WithoutErrorFeedbackTheSumsDiffer) {
  auto plain = makePluginCodec(std::make_shared<TruncCompressor>(), matrixTensor(), 7);
  const Sums s = runSteps(*plain, 2024);
  double worst = 0;
  for (std::size_t i = 0; i < kNumel; ++i) worst = std::max(worst, std::fabs(s.transmitted[i] - s.inputs[i]));
  // With error feedback the gap is |e_T| < 0.5 everywhere; 50 steps of dropped truncation errors (about 0.25 each,
  // random sign) wander far past that.
  EXPECT_GT(worst, 1.0);
}

// (c) After a step the residual is exactly p - D(C(p)), with p = g + e of that step, and transmitted() is D(C(p)).
TEST(ErrorFeedback, ResidualIsExactlyCorrectedMinusDecodedPayload) {
  ErrorFeedback ef(makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(kNumel), 7));
  std::mt19937_64 rng(99);
  std::vector<std::byte> out(ef.sizes(0).max_output_bytes);
  std::vector<float> decoded(kNumel);
  for (uint64_t step = 0; step < 4; ++step) {
    const std::vector<float> e_before(ef.residual().begin(), ef.residual().end());
    const std::vector<float> g = randomGradient(rng, kNumel);
    const uint64_t bytes = ef.encode(step, 0, g.data(), {}, out);
    ef.decode(step, std::span<const std::byte>(out).first(bytes), 0, decoded.data(), false);
    for (std::size_t i = 0; i < kNumel; ++i) {
      const float p = g[i] + e_before[i];
      ASSERT_EQ(decoded[i], TruncCompressor::quantize(p)) << "step " << step << " element " << i;
      ASSERT_EQ(ef.transmitted()[i], decoded[i]);
      ASSERT_EQ(ef.residual()[i], p - decoded[i]) << "step " << step << " element " << i;
    }
  }
}

// (d) Every round encodes the same corrected gradient; the residual uses the last round's local payload.
TEST(ErrorFeedback, MultiRoundSeesOneCorrectedInputAndUsesTheLastRoundsPayload) {
  auto fake = std::make_shared<TwoRoundCompressor>();
  constexpr uint64_t kN = 64;
  constexpr int kRank = 1;
  ErrorFeedback ef(makePluginCodec(fake, flatTensor(kN, DType::kF32, kRank, 3), 5));
  std::mt19937_64 rng(3);
  std::vector<std::byte> out0(ef.sizes(0).max_output_bytes), out1(ef.sizes(1).max_output_bytes);
  ASSERT_EQ(out0.size(), payloadBytes(1));
  ASSERT_EQ(out1.size(), payloadBytes(kN));

  for (uint64_t step = 0; step < 5; ++step) {
    const std::vector<float> e_before(ef.residual().begin(), ef.residual().end());
    const std::vector<float> g = randomGradient(rng, kN);
    fake->calls.clear();
    fake->decodes.clear();

    const uint64_t bytes0 = ef.encode(step, 0, g.data(), {}, out0);
    // Stand-in for the round-0 aggregate: this rank's payload with a different summed value, so round 1's payload
    // visibly depends on prev.
    std::vector<std::byte> agg0(out0.begin(), out0.begin() + static_cast<std::ptrdiff_t>(bytes0));
    const float s = 3.25f + static_cast<float>(step);
    std::memcpy(agg0.data() + testing::kFakeHeaderBytes, &s, sizeof s);
    const uint64_t bytes1 = ef.encode(step, 1, g.data(), agg0, out1);

    ASSERT_EQ(fake->calls.size(), 2u);
    std::vector<float> p(kN);
    for (std::size_t i = 0; i < kN; ++i) p[i] = g[i] + e_before[i];
    for (int r = 0; r < 2; ++r) {
      const auto& call = fake->calls[static_cast<std::size_t>(r)];
      EXPECT_EQ(call.info.round, r);
      EXPECT_EQ(call.info.step, step);
      EXPECT_EQ(call.input, p) << "round " << r << " must see p = g + e of this step";
    }
    EXPECT_TRUE(fake->calls[0].prev.empty());
    EXPECT_EQ(fake->calls[1].prev, agg0);

    // The local decode: last round, this rank, no accumulation; the residual is p minus exactly that.
    ASSERT_EQ(fake->decodes.size(), 1u);
    EXPECT_EQ(fake->decodes[0].info.round, 1);
    EXPECT_EQ(fake->decodes[0].info.source_rank, kRank);
    EXPECT_FALSE(fake->decodes[0].accumulate);
    const std::vector<float> t = testing::floatsOf(out1.data() + testing::kFakeHeaderBytes, kN);
    ASSERT_EQ(bytes1, payloadBytes(kN));
    for (std::size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(t[i], TruncCompressor::quantize(p[i]) + TruncCompressor::quantize(s));
      ASSERT_EQ(ef.transmitted()[i], t[i]);
      ASSERT_EQ(ef.residual()[i], p[i] - t[i]);
    }
  }
}

TEST(ErrorFeedback, RoundsMustComeInOrder) {
  auto fake = std::make_shared<TwoRoundCompressor>();
  ErrorFeedback ef(makePluginCodec(fake, flatTensor(4), 0));
  std::vector<std::byte> out0(ef.sizes(0).max_output_bytes), out1(ef.sizes(1).max_output_bytes);
  float g[4] = {1, 2, 3, 4};
  expectThrowWith<InvalidArgument>([&] { ef.encode(0, 1, g, out0, out1); }, {"round 1", "step 0", "tensor 0"});
  const uint64_t b0 = ef.encode(0, 0, g, {}, out0);
  const std::span<const std::byte> agg0 = std::span<const std::byte>(out0).first(b0);
  EXPECT_THROW(ef.encode(1, 1, g, agg0, out1), InvalidArgument);  // round 1 of another step
  ef.encode(0, 1, g, agg0, out1);
  EXPECT_THROW(ef.encode(0, 1, g, agg0, out1), InvalidArgument);  // the step is complete
  EXPECT_THROW(ef.encode(0, 2, g, agg0, out1), InvalidArgument);  // no round 2
}

// A failed encode leaves the residual untouched, and round 0 may simply be retried.
TEST(ErrorFeedback, FailedEncodeKeepsTheResidual) {
  ErrorFeedback ef(makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(3), 0));
  std::vector<std::byte> out(payloadBytes(3)), small(payloadBytes(3) - 4);
  const float g[3] = {0.7f, -1.3f, 2.2f};
  ef.encode(0, 0, g, {}, out);
  const std::vector<float> e1(ef.residual().begin(), ef.residual().end());
  EXPECT_THROW(ef.encode(1, 0, g, {}, small), InvalidArgument);
  EXPECT_EQ(std::vector<float>(ef.residual().begin(), ef.residual().end()), e1);
  ef.encode(1, 0, g, {}, out);
  for (std::size_t i = 0; i < 3; ++i) {
    const float p = g[i] + e1[i];
    EXPECT_EQ(ef.residual()[i], p - TruncCompressor::quantize(p));
  }
  ef.reset();
  for (float e : ef.residual()) EXPECT_EQ(e, 0.0f);
  for (float t : ef.transmitted()) EXPECT_EQ(t, 0.0f);
}

// Decode and reduce pass through untouched: accumulation on the aggregate is the plugin's.
TEST(ErrorFeedback, DecodeForwardsAccumulate) {
  auto trunc = std::make_shared<TruncCompressor>();
  ErrorFeedback ef(makePluginCodec(trunc, flatTensor(2, DType::kF32, 0, 2), 0));
  std::vector<std::byte> out(payloadBytes(2));
  const float g[2] = {1.75f, -0.75f};
  const uint64_t bytes = ef.encode(0, 0, g, {}, out);
  float acc[2] = {10.0f, 20.0f};
  ef.decode(0, std::span<const std::byte>(out).first(bytes), -1, acc, true);
  EXPECT_EQ(acc[0], 11.5f);
  EXPECT_EQ(acc[1], 19.5f);
  EXPECT_EQ(trunc->decompress_calls.back().source_rank, -1);
  EXPECT_THROW(ef.reduce(0, out, out, out), InvalidArgument);  // SUM: no reduce
}

// Error feedback decodes its own payload, just written, as trusted (TERSE_CALL_OWN_PAYLOAD, so that a device plugin
// need not synchronize for a verdict): that decode, and only that one, carries the flag; every other decode (the
// aggregate, a peer's payload, this rank's own payload coming back from a collective) does not.
TEST(ErrorFeedback, OnlyTheLocalDecodeOfItsOwnPayloadIsMarkedTrusted) {
  auto trunc = std::make_shared<TruncCompressor>();
  ErrorFeedback ef(makePluginCodec(trunc, flatTensor(2, DType::kF32, 1, 3), 0));
  std::vector<std::byte> out(payloadBytes(2));
  const float g[2] = {1.75f, -0.75f};
  const uint64_t bytes = ef.encode(4, 0, g, {}, out);
  ASSERT_EQ(trunc->decompress_calls.size(), 1u);
  EXPECT_EQ(trunc->decompress_calls[0].call_flags, TERSE_CALL_OWN_PAYLOAD);
  EXPECT_EQ(trunc->decompress_calls[0].source_rank, 1);
  EXPECT_EQ(trunc->decompress_calls[0].step, 4u);
  float acc[2] = {0.0f, 0.0f};
  for (int source : {-1, 0, 1}) {
    ef.decode(4, std::span<const std::byte>(out).first(bytes), source, acc, true);
    EXPECT_EQ(trunc->decompress_calls.back().call_flags, 0u) << "source " << source;
  }
  EXPECT_EQ(trunc->decompress_calls.size(), 4u);
}

// (g) An empty tensor works end to end; f16 is a clear Unsupported.
TEST(ErrorFeedback, EmptyTensorWorks) {
  for (int ndim : {0, 1}) {
    TensorInfo t = flatTensor(0);
    t.ndim = ndim;
    if (ndim == 0) t.shape = {};
    ErrorFeedback ef(makePluginCodec(std::make_shared<TruncCompressor>(), t, 0));
    std::vector<std::byte> out(ef.sizes(0).max_output_bytes);
    for (uint64_t step = 0; step < 3; ++step) {
      const uint64_t bytes = ef.encode(step, 0, nullptr, {}, out);
      EXPECT_EQ(bytes, payloadBytes(0));
      ef.decode(step, std::span<const std::byte>(out).first(bytes), -1, nullptr, false);
    }
    EXPECT_TRUE(ef.residual().empty());
    EXPECT_TRUE(ef.transmitted().empty());
  }
}

TEST(ErrorFeedback, NonF32IsUnsupported) {
  auto trunc = std::make_shared<TruncCompressor>();
  for (DType d : {DType::kF16, DType::kBF16, DType::kF64}) {
    expectThrowWith<Unsupported>([&] { ErrorFeedback ef(makePluginCodec(trunc, flatTensor(8, d), 0)); },
                                 {"error feedback", "f32", std::string(dtypeName(d))});
  }
  EXPECT_THROW(ErrorFeedback(nullptr), InvalidArgument);
}

}  // namespace
}  // namespace terse
