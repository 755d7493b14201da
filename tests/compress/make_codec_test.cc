// makeCodec: option validation and the chain it builds.
#include "core/compress/make_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/compress/error_feedback.h"
#include "core/compress/momentum_correction.h"
#include "core/compress/plugin_codec.h"
#include "tests/compress/fake_compressors.h"

namespace terse {
namespace {

using testing::expectThrowWith;
using testing::flatTensor;
using testing::payloadBytes;
using testing::TruncCompressor;

TEST(MakeCodec, RejectsMomentumOutsideUnitIntervalNamingOptionAndValue) {
  auto trunc = std::make_shared<TruncCompressor>();
  const std::vector<std::pair<double, std::string>> bad = {{1.0, "got 1"}, {-0.1, "got -0.1"}, {2.5, "got 2.5"}};
  for (const auto& [m, text] : bad) {
    CodecOptions o;
    o.momentum_correction = m;
    expectThrowWith<InvalidArgument>([&] { makeCodec(trunc, flatTensor(4), 0, o); },
                                     {"momentum_correction", "[0, 1)", text});
  }
  CodecOptions nan;
  nan.momentum_correction = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(makeCodec(trunc, flatTensor(4), 0, nan), InvalidArgument);
  CodecOptions rounds_to_one;
  rounds_to_one.momentum_correction = 0.99999999;  // 1.0f as a float
  EXPECT_THROW(validateCodecOptions(rounds_to_one), InvalidArgument);
  // Validation comes before the plugin is asked anything.
  EXPECT_TRUE(trunc->compress_calls.empty());
}

TEST(MakeCodec, BuildsTheChainTheOptionsAskFor) {
  auto trunc = std::make_shared<TruncCompressor>();
  const TensorInfo t = flatTensor(4);

  auto plain = makeCodec(trunc, t, 0, CodecOptions{});
  EXPECT_NE(dynamic_cast<PluginCodec*>(plain.get()), nullptr);

  CodecOptions ef_only;
  ef_only.error_feedback = true;
  EXPECT_NE(dynamic_cast<ErrorFeedback*>(makeCodec(trunc, t, 0, ef_only).get()), nullptr);

  // Momentum correction implies error feedback even when error_feedback is off.
  CodecOptions mc_opts;
  mc_opts.momentum_correction = 0.9;
  mc_opts.momentum_masking = false;
  mc_opts.momentum_nesterov = true;
  auto chain = makeCodec(trunc, t, 0, mc_opts);
  auto* mc = dynamic_cast<MomentumCorrection*>(chain.get());
  ASSERT_NE(mc, nullptr);
  EXPECT_FLOAT_EQ(mc->momentumFactor(), 0.9f);
  EXPECT_FALSE(mc->masking());
  EXPECT_TRUE(mc->nesterov());
  EXPECT_EQ(mc->errorFeedback().residual().size(), 4u);

  // The chain keeps the plugin's view: caps, sizes and the tensor.
  EXPECT_EQ(chain->caps().aggregation, Aggregation::kSum);
  EXPECT_EQ(chain->sizes(0).max_output_bytes, payloadBytes(4));
  EXPECT_EQ(chain->info().numel, 4u);
}

TEST(MakeCodec, ErrorFeedbackOnF16IsUnsupportedButPlainF16Builds) {
  auto trunc = std::make_shared<TruncCompressor>();
  CodecOptions ef;
  ef.error_feedback = true;
  expectThrowWith<Unsupported>([&] { makeCodec(trunc, flatTensor(8, DType::kF16), 0, ef); }, {"f32", "f16"});
  CodecOptions mc;
  mc.momentum_correction = 0.5;
  EXPECT_THROW(makeCodec(trunc, flatTensor(8, DType::kF16), 0, mc), Unsupported);
  EXPECT_NO_THROW(makeCodec(trunc, flatTensor(8, DType::kF16), 0, CodecOptions{}));
}

TEST(MakeCodec, CudaTensorIsUnsupported) {
  TensorInfo t = flatTensor(8);
  t.device = TERSE_DEVICE_CUDA;
  t.device_index = 0;
  CodecOptions ef;
  ef.error_feedback = true;
  EXPECT_THROW(makeCodec(std::make_shared<TruncCompressor>(), t, 0, ef), Unsupported);
}

}  // namespace
}  // namespace terse
