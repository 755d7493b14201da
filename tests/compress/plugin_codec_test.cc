// PluginCodec: setup (caps, per-round sizes, scratch), seeds, tensor validation and hot-path bounds checks.
#include "core/compress/plugin_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/common/cuda.h"
#include "core/compress/seed.h"
#include "core/plugin/compressor_plugin.h"
#include "tests/compress/fake_compressors.h"

namespace terse {
namespace {

using testing::expectThrowWith;
using testing::flatTensor;
using testing::payloadBytes;
using testing::ScratchProbe;
using testing::TruncCompressor;

TEST(PluginCodec, AsksSizesOncePerRoundAndHandsMaxScratchAlignedToEveryCall) {
  auto probe = std::make_shared<ScratchProbe>();
  TensorInfo t = flatTensor(4, DType::kF32, /*rank=*/1, /*world_size=*/2, /*tensor_id=*/9);
  auto codec = makePluginCodec(probe, t, 42);

  ASSERT_EQ(probe->sizes_infos.size(), 2u);  // once per round at setup, never again
  for (int r = 0; r < 2; ++r) {
    const TensorInfo& s = probe->sizes_infos[static_cast<std::size_t>(r)];
    EXPECT_EQ(s.round, r);
    EXPECT_EQ(s.step, 0u);  // the ABI: step, seed and source_rank are 0 at sizing time
    EXPECT_EQ(s.seed, 0u);
    EXPECT_EQ(s.source_rank, 0);
    EXPECT_EQ(s.tensor_id, 9u);
  }
  EXPECT_EQ(codec->sizes(0).workspace_bytes, 100u);
  EXPECT_EQ(codec->sizes(1).max_reduced_bytes, 16u);
  EXPECT_THROW(codec->sizes(2), InvalidArgument);
  EXPECT_THROW(codec->sizes(-1), InvalidArgument);

  std::vector<std::byte> out(8), prev(8);
  float grad[4] = {};
  for (uint64_t step = 0; step < 3; ++step) {
    codec->encode(step, 0, grad, {}, out);
    codec->encode(step, 1, grad, prev, out);
  }
  EXPECT_EQ(probe->sizes_infos.size(), 2u);
  ASSERT_EQ(probe->seen.size(), 6u);
  for (std::size_t i = 0; i < probe->seen.size(); ++i) {
    const auto& s = probe->seen[i];
    EXPECT_EQ(s.workspace_bytes, 300u);  // max over rounds
    EXPECT_EQ(s.state_bytes, 40u);
    EXPECT_TRUE(s.aligned);
    EXPECT_EQ(s.counter, i);  // zero-filled once, then kept across rounds and steps
    EXPECT_EQ(s.info.round, static_cast<int>(i % 2));
    EXPECT_EQ(s.info.step, i / 2);
    EXPECT_EQ(s.info.source_rank, 1);  // compress: == rank
    EXPECT_EQ(s.info.rank, 1);
    EXPECT_EQ(s.info.world_size, 2);
  }

  float dec[4];
  codec->decode(5, std::span<const std::byte>(out), -1, dec, true);
  EXPECT_EQ(probe->seen.back().info.round, 1);  // decode is always the last round
  EXPECT_EQ(probe->seen.back().info.source_rank, -1);
  EXPECT_EQ(probe->seen.back().info.step, 5u);
  EXPECT_THROW(codec->decode(5, out, 2, dec, false), InvalidArgument);   // source_rank >= world_size
  EXPECT_THROW(codec->decode(5, out, -2, dec, false), InvalidArgument);  // below -1
}

// Codecs that take turns on one thread (a parameter-server shard's) share one workspace: it is as large as the largest
// need, not the sum, every call still gets its round's maximum, aligned, and each codec keeps a state of its own.
TEST(PluginCodec, CodecsOfASharedWorkspaceShareItsBytesButNotTheirState) {
  auto probe = std::make_shared<ScratchProbe>();
  auto shared = std::make_shared<SharedWorkspace>();
  auto a = makePluginCodec(probe, flatTensor(4, DType::kF32, 0, 2, 1), 42, shared);
  auto b = makePluginCodec(probe, flatTensor(4, DType::kF32, 1, 2, 2), 42, shared);
  EXPECT_EQ(shared->size(), 300u);  // the max over rounds, once for both
  std::vector<std::byte> out(8);
  float grad[4] = {};
  a->encode(0, 0, grad, {}, out);
  a->encode(1, 0, grad, {}, out);
  b->encode(0, 0, grad, {}, out);
  ASSERT_EQ(probe->seen.size(), 3u);
  for (const auto& s : probe->seen) {
    EXPECT_EQ(s.workspace_bytes, 300u);
    EXPECT_TRUE(s.aligned);
  }
  EXPECT_EQ(probe->seen[1].counter, 1u);  // a's state counted its first call
  EXPECT_EQ(probe->seen[2].counter, 0u);  // b's is its own
  EXPECT_THROW(makePluginCodec(probe, flatTensor(4), 1, std::shared_ptr<SharedWorkspace>()), InvalidArgument);
}

// The output bound (max_reduced_bytes of the call's round) is the compressor's bound call to check (core/plugin;
// loader_test.cc, CompressorAdapter.ReduceOutputsAreChecked), so an in-test fake sees whatever span it is given.
TEST(PluginCodec, ReduceCarriesTheRound) {
  auto probe = std::make_shared<ScratchProbe>();
  auto codec = makePluginCodec(probe, flatTensor(4), 0);
  std::vector<std::byte> a(8), b(8), out8(8), out16(16);

  EXPECT_EQ(codec->reduce(3, 0, a, b, out8), 8u);
  EXPECT_EQ(probe->seen.back().info.round, 0);
  EXPECT_EQ(probe->seen.back().info.source_rank, -1);
  EXPECT_EQ(probe->seen.back().info.step, 3u);

  // The round-less overload is the last round, which needs 16 B here.
  EXPECT_EQ(codec->sizes(1).max_reduced_bytes, 16u);
  EXPECT_EQ(codec->reduce(3, a, b, out16), 8u);
  EXPECT_EQ(probe->seen.back().info.round, 1);
  EXPECT_THROW(codec->reduce(3, 2, a, b, out16), InvalidArgument);
}

TEST(PluginCodec, ReduceIsRejectedForNonCustomAggregation) {
  auto codec = makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(4), 0);
  std::vector<std::byte> a(32), b(32), out(64);
  expectThrowWith<InvalidArgument>([&] { codec->reduce(0, a, b, out); }, {"custom", "sum", "trunc"});
}

TEST(PluginCodec, SharedSeedIsIdenticalOnEveryRankAndStable) {
  auto trunc = std::make_shared<TruncCompressor>(/*shared_seed=*/true);
  std::set<uint64_t> seeds;
  std::vector<std::byte> out(payloadBytes(3));
  float grad[3] = {0.1f, 0.7f, -1.2f};
  for (int rank = 0; rank < 4; ++rank) {
    auto codec = makePluginCodec(trunc, flatTensor(3, DType::kF32, rank, 4), 1234);
    for (uint64_t step = 0; step < 3; ++step) codec->encode(step, 0, grad, {}, out);
    seeds.insert(codec->info().seed);
  }
  ASSERT_EQ(trunc->compress_calls.size(), 12u);
  for (const auto& c : trunc->compress_calls) EXPECT_EQ(c.seed, *seeds.begin());
  EXPECT_EQ(seeds.size(), 1u);
  EXPECT_EQ(*seeds.begin(), codecSeed(1234, true, 0));
}

TEST(PluginCodec, NonSharedSeedDiffersPerRankIsStableAndFollowsTheRunSeed) {
  auto trunc = std::make_shared<TruncCompressor>(/*shared_seed=*/false);
  std::vector<std::byte> out(payloadBytes(3));
  float grad[3] = {0.1f, 0.7f, -1.2f};
  std::vector<uint64_t> first, second;
  for (uint64_t run_seed : {1234ull, 1235ull}) {
    std::vector<uint64_t>& seeds = run_seed == 1234 ? first : second;
    for (int rank = 0; rank < 4; ++rank) {
      trunc->compress_calls.clear();
      auto codec = makePluginCodec(trunc, flatTensor(3, DType::kF32, rank, 4), run_seed);
      for (uint64_t step = 0; step < 3; ++step) codec->encode(step, 0, grad, {}, out);
      ASSERT_EQ(trunc->compress_calls.size(), 3u);
      for (const auto& c : trunc->compress_calls) EXPECT_EQ(c.seed, codec->info().seed);  // stable across calls
      seeds.push_back(codec->info().seed);
    }
  }
  EXPECT_EQ(std::set<uint64_t>(first.begin(), first.end()).size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const auto i = static_cast<std::size_t>(r);
    EXPECT_NE(first[i], second[i]) << "rank " << r;
    EXPECT_NE(first[i], codecSeed(1234, true, 0)) << "a per-rank seed equals the shared one";
    // Rebuilding gives the same value: the seed is a function of (run seed, rank) only.
    EXPECT_EQ(makePluginCodec(trunc, flatTensor(3, DType::kF32, r, 4), 1234)->info().seed, first[i]);
  }
}

TEST(PluginCodec, EncodeChecksRoundAndPrev) {
  auto codec = makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(8), 0);
  float grad[8] = {};
  std::vector<std::byte> out(payloadBytes(8));
  EXPECT_THROW(codec->encode(0, 1, grad, {}, out), InvalidArgument);   // only 1 round
  EXPECT_THROW(codec->encode(0, -1, grad, {}, out), InvalidArgument);  // negative
  EXPECT_THROW(codec->encode(0, 0, grad, out, out), InvalidArgument);  // a prev in round 0
  EXPECT_THROW(codec->encode(0, 0, nullptr, {}, out), InvalidArgument);
  EXPECT_EQ(codec->encode(0, 0, grad, {}, out), out.size());
}

// The output's capacity is a per-call size, checked once, in the compressor's bound call (core/plugin): the codec
// forwards a short span and the plugin's instance refuses it before the plugin runs.
TEST(PluginCodec, ShortOutputIsRefusedByTheCompressorsBoundCall) {
  auto good =
      CompressorPlugin::open(std::filesystem::path(TERSE_TEST_FIXTURE_PLUGIN_DIR) / "terse_compressor_good_c.so")
          ->instantiate();
  auto codec = makePluginCodec(good, flatTensor(12), 0);
  std::vector<float> grad(12, 1.0f);
  std::vector<std::byte> small(47);
  expectThrowWith<InvalidArgument>([&] { codec->encode(0, 0, grad.data(), {}, small); },
                                   {"compressor 'good_c'", "compress: output capacity 47 is below max_output_bytes 48",
                                    "tensor 0 (f32, numel 12, round 0)"});
  std::vector<std::byte> out(48);
  EXPECT_EQ(codec->encode(0, 0, grad.data(), {}, out), 48u);
}

TEST(PluginCodec, CudaTensorIsUnsupported) {
  TensorInfo t = flatTensor(16);
  t.device = TERSE_DEVICE_CUDA;
  t.device_index = 0;
  expectThrowWith<Unsupported>([&] { makePluginCodec(std::make_shared<TruncCompressor>(), t, 0); },
                               {"CUDA", "trunc", "tensor 0"});
}

TEST(PluginCodec, RejectsMalformedTensorInfo) {
  auto trunc = std::make_shared<TruncCompressor>();
  auto build = [&](const TensorInfo& t) { return makePluginCodec(trunc, t, 0); };

  TensorInfo t = flatTensor(12);
  t.ndim = 2;
  t.shape = {3, 5, 0, 0};
  expectThrowWith<InvalidArgument>([&] { build(t); }, {"numel 12", "15"});
  t.shape = {3, 4, 0, 0};
  EXPECT_NO_THROW(build(t));
  t.shape = {3, 4, 1, 0};  // beyond ndim must be 0
  EXPECT_THROW(build(t), InvalidArgument);
  t.shape = {-3, -4, 0, 0};
  EXPECT_THROW(build(t), InvalidArgument);

  t = flatTensor(12);
  t.ndim = 5;
  expectThrowWith<InvalidArgument>([&] { build(t); }, {"ndim", "5"});
  t.ndim = -1;
  EXPECT_THROW(build(t), InvalidArgument);

  t = flatTensor(12, DType::kF32, /*rank=*/4, /*world_size=*/4);
  expectThrowWith<InvalidArgument>([&] { build(t); }, {"rank", "4"});
  t = flatTensor(12, DType::kF32, 0, 0);
  EXPECT_THROW(build(t), InvalidArgument);
  t = flatTensor(12, DType::kF32, -1, 4);
  EXPECT_THROW(build(t), InvalidArgument);

  t = flatTensor(12);
  t.device = 0x4u;
  EXPECT_THROW(build(t), InvalidArgument);

  // ndim 0 is a flat vector of numel elements: any numel, no shape.
  t = flatTensor(12);
  t.ndim = 0;
  t.shape = {};
  EXPECT_NO_THROW(build(t));

  EXPECT_THROW(makePluginCodec(nullptr, flatTensor(1), 0), InvalidArgument);
  // A dtype the plugin does not answer for is its Unsupported.
  EXPECT_THROW(build(flatTensor(4, DType::kI32)), Unsupported);
}

TEST(PluginCodec, EmptyTensorRoundTrips) {
  auto codec = makePluginCodec(std::make_shared<TruncCompressor>(), flatTensor(0), 0);
  std::vector<std::byte> out(codec->sizes(0).max_output_bytes);
  const uint64_t bytes = codec->encode(0, 0, nullptr, {}, out);
  EXPECT_EQ(bytes, payloadBytes(0));
  codec->decode(0, std::span<const std::byte>(out).first(bytes), -1, nullptr, false);
}

TEST(Seed, Splitmix64MatchesTheReferenceSequence) {
  // Vigna's splitmix64.c with state 0: the first outputs are the finalizer of k * golden gamma.
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(splitmix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
}

// A plugin that advertises CUDA as well: what a CUDA tensor needs besides the device itself.
class CudaTrunc : public testing::TruncCompressor {
 public:
  CompressorCaps makeCaps(DType dtype) const override {
    CompressorCaps c = TruncCompressor::makeCaps(dtype);
    c.devices = TERSE_DEVICE_HOST | TERSE_DEVICE_CUDA;
    return c;
  }
};

TEST(PluginCodec, CudaTensorNeedsACudaBuildAndAStream) {
  TensorInfo t = flatTensor(16);
  t.device = TERSE_DEVICE_CUDA;
  t.device_index = 0;
  if (cuda::builtWithCuda()) {
    // The stream every call of the tensor is ordered on is not optional (checked before any device memory is taken).
    expectThrowWith<InvalidArgument>([&] { makePluginCodec(std::make_shared<CudaTrunc>(), t, 0); },
                                     {"needs the stream", "tensor 0"});
  } else {
    expectThrowWith<Unsupported>([&] { makePluginCodec(std::make_shared<CudaTrunc>(), t, 0); },
                                 {"needs a build with CUDA", "tensor 0"});
  }
  // A host tensor takes no stream: the ABI's host calls get NULL.
  int not_a_stream = 0;
  expectThrowWith<InvalidArgument>(
      [&] { makePluginCodec(std::make_shared<CudaTrunc>(), flatTensor(16), 0, &not_a_stream); }, {"takes no stream"});
  // The host path is unchanged: the placement says host, with no stream.
  auto codec = makePluginCodec(std::make_shared<CudaTrunc>(), flatTensor(16), 0);
  EXPECT_FALSE(codec->placement().device);
  EXPECT_EQ(codec->placement().stream, nullptr);
}

}  // namespace
}  // namespace terse
