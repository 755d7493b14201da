// Error feedback through real plugin files: the loader opens test_lossy / test_rounds from the test plugin directory,
// and the decorators drive them exactly as the pipeline will. Complements the fake-compressor tests beside this file,
// which cannot catch a mismatch between the decorators and the ABI adapter.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/common/error.h"
#include "core/compress/error_feedback.h"
#include "core/compress/make_codec.h"
#include "core/plugin/loader.h"

namespace terse {
namespace {

TensorInfo flat(uint64_t n, int rank = 0, int world = 1) {
  TensorInfo t;
  t.numel = n;
  t.ndim = 1;
  t.shape = {static_cast<int64_t>(n), 0, 0, 0};
  t.tensor_id = 3;
  t.rank = rank;
  t.world_size = world;
  return t;
}

PluginLoader buildTreeLoader() {
  return PluginLoader::withSearchDirs({SearchDir{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true},
                                       SearchDir{TERSE_TEST_PLUGIN_DIR, "test plugins", true}});
}

// Sums f32 payloads as the SUM path will: the header is carried through, the rest added elementwise.
std::vector<std::byte> sumPayloads(const std::vector<std::vector<std::byte>>& payloads, uint64_t header) {
  std::vector<std::byte> sum = payloads.at(0);
  const size_t n = (sum.size() - header) / sizeof(float);
  for (size_t r = 1; r < payloads.size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      float a, b;
      std::memcpy(&a, sum.data() + header + i * 4, 4);
      std::memcpy(&b, payloads[r].data() + header + i * 4, 4);
      a += b;
      std::memcpy(sum.data() + header + i * 4, &a, 4);
    }
  }
  return sum;
}

// Over T steps and 3 ranks: sum of what the aggregate delivered == sum of every rank's gradients minus the ranks'
// final residuals. Without error feedback the same sums differ by the quantization error, so the test bites.
TEST(PluginErrorFeedback, SumOfTransmittedEqualsSumOfInputsMinusResidualAcrossRanks) {
  constexpr int kWorld = 3;
  constexpr uint64_t kNumel = 1001, kSteps = 40;
  auto loader = buildTreeLoader();
  auto compressor = loader.loadCompressor("test_lossy")->instantiate({{"step", "0.25"}});
  for (bool ef : {true, false}) {
    std::vector<std::unique_ptr<TensorCodec>> codecs;
    for (int r = 0; r < kWorld; ++r) {
      CodecOptions o;
      o.error_feedback = ef;
      codecs.push_back(makeCodec(compressor, flat(kNumel, r, kWorld), 11, o));
    }
    const CompressorSizes sz = codecs[0]->sizes(0);
    ASSERT_EQ(sz.sum_header_bytes, 16u);
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    std::vector<double> sum_in(kNumel, 0.0), sum_out(kNumel, 0.0);
    std::vector<float> grad(kNumel), decoded(kNumel);
    for (uint64_t s = 0; s < kSteps; ++s) {
      std::vector<std::vector<std::byte>> payloads;
      for (int r = 0; r < kWorld; ++r) {
        for (uint64_t i = 0; i < kNumel; ++i) {
          grad[i] = normal(rng);
          sum_in[i] += grad[i];
        }
        std::vector<std::byte> out(sz.max_output_bytes);
        out.resize(codecs[r]->encode(s, 0, grad.data(), {}, out));
        payloads.push_back(std::move(out));
      }
      const auto aggregate = sumPayloads(payloads, sz.sum_header_bytes);
      codecs[0]->decode(s, aggregate, -1, decoded.data(), false);
      for (uint64_t i = 0; i < kNumel; ++i) sum_out[i] += decoded[i];
    }
    double max_gap = 0;
    for (uint64_t i = 0; i < kNumel; ++i) {
      double residual = 0;
      if (ef)
        for (const auto& c : codecs) residual += dynamic_cast<const ErrorFeedback&>(*c).residual()[i];
      max_gap = std::max(max_gap, std::abs(sum_out[i] - (sum_in[i] - residual)));
    }
    if (ef)
      EXPECT_LT(max_gap, 1e-3) << "error feedback lost gradient mass";
    else
      EXPECT_GT(max_gap, 0.1) << "without error feedback the quantization error should accumulate";
  }
}

// A two-round plugin under error feedback and momentum correction: rounds see the same corrected input, and the
// lossless test_rounds delivers it exactly, so the residual stays zero.
TEST(PluginErrorFeedback, TwoRoundPluginUnderDecorators) {
  auto loader = buildTreeLoader();
  auto compressor = loader.loadCompressor("test_rounds")->instantiate();
  for (double momentum : {0.0, 0.9}) {
    CodecOptions o;
    o.error_feedback = true;
    o.momentum_correction = momentum;
    auto codec = makeCodec(compressor, flat(64), 7, o);
    ASSERT_EQ(codec->caps().num_rounds, 2);
    std::vector<std::byte> out0(codec->sizes(0).max_output_bytes), out1(codec->sizes(1).max_output_bytes);
    std::vector<float> grad(64), decoded(64), velocity(64, 0.0f);
    for (uint64_t s = 0; s < 5; ++s) {
      for (int i = 0; i < 64; ++i) grad[i] = static_cast<float>(i % 7) - 3.0f;
      const auto b0 = codec->encode(s, 0, grad.data(), {}, out0);
      const auto b1 = codec->encode(s, 1, grad.data(), std::span<const std::byte>(out0).first(b0), out1);
      codec->decode(s, std::span<const std::byte>(out1).first(b1), -1, decoded.data(), false);
      // Lossless: what arrives is u_t = m u_{t-1} + g (masking clears u wherever something was sent).
      for (int i = 0; i < 64; ++i) {
        velocity[i] = static_cast<float>(momentum) * velocity[i] + grad[i];
        EXPECT_FLOAT_EQ(decoded[i], velocity[i]) << "step " << s << " element " << i;
        if (decoded[i] != 0.0f) velocity[i] = 0.0f;
      }
    }
  }
}

TEST(PluginErrorFeedback, EmptyTensorAndBadBuffers) {
  auto loader = buildTreeLoader();
  auto compressor = loader.loadCompressor("test_lossy")->instantiate();
  CodecOptions o;
  o.error_feedback = true;
  auto empty = makeCodec(compressor, flat(0), 7, o);
  std::vector<std::byte> out(empty->sizes(0).max_output_bytes);
  const auto bytes = empty->encode(0, 0, nullptr, {}, out);
  EXPECT_EQ(bytes, 16u);
  EXPECT_NO_THROW(empty->decode(0, std::span<const std::byte>(out).first(bytes), -1, nullptr, false));

  auto codec = makeCodec(compressor, flat(10), 7, o);
  std::vector<std::byte> small(10);
  float grad[10] = {};
  EXPECT_THROW(codec->encode(0, 0, grad, {}, small), InvalidArgument);
  TensorInfo half = flat(10);
  half.dtype = DType::kF16;
  EXPECT_THROW(makeCodec(compressor, half, 0, CodecOptions{}), Unsupported);
}

}  // namespace
}  // namespace terse
