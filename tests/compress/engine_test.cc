// The compression pipeline through every aggregation path, one thread per rank: SUM with the test plugins (test_lossy,
// the 2-round test_rounds), ALLGATHER and CUSTOM with in-test fakes, error feedback through the pipeline, communicator
// mismatches refused before anything runs, plugins that break their contract (the fixtures bad_caps and bad_custom)
// driven through the whole stack, payload bytes versus wire bytes, and the built-in compressors that exist in this
// build.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "core/comm/frame.h"
#include "core/common/runtime.h"
#include "core/compress/ef21.h"
#include "core/compress/engine.h"
#include "core/compress/error_feedback.h"
#include "core/compress/make_codec.h"
#include "core/compress/pipeline.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/loader.h"
#include "tests/comm/comm_test_util.h"
#include "tests/compress/fake_compressors.h"

namespace terse {
namespace {

using comm::HostCommunicator;
using comm::testing::World;
using terse::testing::FakeCompressor;
using terse::testing::FakeHeader;
using terse::testing::kFakeHeaderBytes;

TensorInfo tensorFor(uint64_t numel, int rank, int world, uint64_t id = 17) {
  TensorInfo t;
  t.numel = numel;
  t.ndim = 1;
  t.shape = {static_cast<int64_t>(numel), 0, 0, 0};
  t.tensor_id = id;
  t.rank = rank;
  t.world_size = world;
  t.source_rank = rank;
  return t;
}

std::vector<float> gradOf(int rank, uint64_t numel, uint64_t step) {
  std::vector<float> g(static_cast<std::size_t>(numel));
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = comm::testing::valueOf(rank, i, step);
  return g;
}

// Serializes the loader (it is thread-safe, but the tests open plugins once up front anyway).
PluginLoader buildTreeLoader() {
  return PluginLoader::withSearchDirs({SearchDir{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true},
                                       SearchDir{TERSE_TEST_PLUGIN_DIR, "test plugins", true}});
}

// ---- In-test fakes for the paths no test plugin covers.

// ALLGATHER, variable size: keeps |x| >= 4 as (uint32 index, float value) pairs. With fixed = true it sends every
// element as a pair, so the payload always has its maximum size and no size exchange is needed.
class SparseFake final : public FakeCompressor {
 public:
  static constexpr uint32_t kMagic = 0x53505253;
  explicit SparseFake(bool fixed) : FakeCompressor("sparse_fake"), fixed_(fixed) {}
  static float keep(float x) { return std::fabs(x) >= 4.0f ? x : 0.0f; }

  CompressorCaps makeCaps(DType) const override {
    CompressorCaps c;
    c.devices = TERSE_DEVICE_HOST;
    c.aggregation = Aggregation::kAllgather;
    c.fixed_size = fixed_;
    return c;
  }
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = kFakeHeaderBytes + 8 * info.numel;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch&,
                    std::span<std::byte> out, void*) const override {
    const auto* x = static_cast<const float*>(input);
    uint64_t k = 0;
    for (uint64_t i = 0; i < info.numel; ++i) {
      if (!fixed_ && keep(x[i]) == 0.0f) continue;
      const auto idx = static_cast<uint32_t>(i);
      const float v = keep(x[i]);
      std::memcpy(out.data() + kFakeHeaderBytes + 8 * k, &idx, 4);
      std::memcpy(out.data() + kFakeHeaderBytes + 8 * k + 4, &v, 4);
      ++k;
    }
    const FakeHeader h{kMagic, 0, k};
    std::memcpy(out.data(), &h, sizeof h);
    return kFakeHeaderBytes + 8 * k;
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    FakeHeader h{};
    if (payload.size() < kFakeHeaderBytes) TERSE_THROW(InvalidPayload, "sparse_fake: short payload");
    std::memcpy(&h, payload.data(), sizeof h);
    if (h.magic != kMagic || h.numel > info.numel || payload.size() != kFakeHeaderBytes + 8 * h.numel)
      TERSE_THROW(InvalidPayload, "sparse_fake: malformed payload");
    auto* o = static_cast<float*>(out);
    if (!accumulate) std::fill(o, o + info.numel, 0.0f);
    for (uint64_t k = 0; k < h.numel; ++k) {
      uint32_t idx;
      float v;
      std::memcpy(&idx, payload.data() + kFakeHeaderBytes + 8 * k, 4);
      std::memcpy(&v, payload.data() + kFakeHeaderBytes + 8 * k + 4, 4);
      if (idx >= info.numel) TERSE_THROW(InvalidPayload, "sparse_fake: index out of range");
      o[idx] += v;
    }
  }

 private:
  bool fixed_;
};

// CUSTOM: signSGD-style votes. Payload = header + numel int32 votes sign(x); reduce adds votes; decompress writes the
// vote counts, so the decoded aggregate is the sum of every rank's sign (the pipeline divides by n).
class VoteFake final : public FakeCompressor {
 public:
  static constexpr uint32_t kMagic = 0x45544f56;
  VoteFake() : FakeCompressor("vote_fake") {}
  CompressorCaps makeCaps(DType) const override {
    CompressorCaps c;
    c.devices = TERSE_DEVICE_HOST;
    c.aggregation = Aggregation::kCustom;
    c.fixed_size = true;
    return c;
  }
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = s.max_reduced_bytes = kFakeHeaderBytes + 4 * info.numel;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch&,
                    std::span<std::byte> out, void*) const override {
    const auto* x = static_cast<const float*>(input);
    for (uint64_t i = 0; i < info.numel; ++i) {
      const int32_t v = x[i] > 0 ? 1 : (x[i] < 0 ? -1 : 0);
      std::memcpy(out.data() + kFakeHeaderBytes + 4 * i, &v, 4);
    }
    const FakeHeader h{kMagic, 0, info.numel};
    std::memcpy(out.data(), &h, sizeof h);
    return kFakeHeaderBytes + 4 * info.numel;
  }
  uint64_t reduce(const TensorInfo& info, std::span<const std::byte> a, std::span<const std::byte> b, const Scratch&,
                  std::span<std::byte> out, void*) const override {
    check(a, info);
    check(b, info);
    ++reduce_calls;
    std::memcpy(out.data(), a.data(), kFakeHeaderBytes);
    for (uint64_t i = 0; i < info.numel; ++i) {
      int32_t x, y;
      std::memcpy(&x, a.data() + kFakeHeaderBytes + 4 * i, 4);
      std::memcpy(&y, b.data() + kFakeHeaderBytes + 4 * i, 4);
      x += y;
      std::memcpy(out.data() + kFakeHeaderBytes + 4 * i, &x, 4);
    }
    return a.size();
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    check(payload, info);
    auto* o = static_cast<float*>(out);
    for (uint64_t i = 0; i < info.numel; ++i) {
      int32_t v;
      std::memcpy(&v, payload.data() + kFakeHeaderBytes + 4 * i, 4);
      o[i] = (accumulate ? o[i] : 0.0f) + static_cast<float>(v);
    }
  }
  mutable int reduce_calls = 0;

 private:
  static void check(std::span<const std::byte> p, const TensorInfo& info) {
    FakeHeader h{};
    if (p.size() != kFakeHeaderBytes + 4 * info.numel) TERSE_THROW(InvalidPayload, "vote_fake: bad size");
    std::memcpy(&h, p.data(), sizeof h);
    if (h.magic != kMagic || h.numel != info.numel) TERSE_THROW(InvalidPayload, "vote_fake: bad header");
  }
};

// Caps and sizes chosen by the test, for the mismatch checks (compress/decompress are never reached).
class ConfiguredFake final : public FakeCompressor {
 public:
  ConfiguredFake(CompressorCaps caps, CompressorSizes sizes)
      : FakeCompressor("configured_fake"), caps_(caps), sizes_(sizes) {}
  CompressorCaps makeCaps(DType) const override { return caps_; }
  CompressorSizes sizes(const TensorInfo&) const override { return sizes_; }
  uint64_t compress(const TensorInfo&, const void*, std::span<const std::byte>, const Scratch&, std::span<std::byte>,
                    void*) const override {
    TERSE_THROW(InternalError, "configured_fake: compress must not be reached");
  }
  void decompress(const TensorInfo&, std::span<const std::byte>, const Scratch&, void*, bool, void*) const override {
    TERSE_THROW(InternalError, "configured_fake: decompress must not be reached");
  }

 private:
  CompressorCaps caps_;
  CompressorSizes sizes_;
};

// A communicator that cannot sum f16, as a backend without 16-bit reductions would be.
class NoF16Communicator final : public HostCommunicator {
 public:
  using HostCommunicator::HostCommunicator;
  bool supportsSum(DType dtype) const noexcept override {
    return dtype != DType::kF16 && HostCommunicator::supportsSum(dtype);
  }
};

// Runs `steps` steps of one tensor on n ranks; codec_for(rank) builds each rank's codec. Returns every rank's output
// of every step and leaves the pipelines in `pipes` for inspection.
struct PipelineRun {
  std::vector<std::vector<std::vector<float>>> out;  // [step][rank][i]
  std::vector<std::unique_ptr<CompressionPipeline>> pipes;
};

PipelineRun runPipeline(World& world, uint64_t numel, uint64_t steps,
                        const std::function<std::unique_ptr<TensorCodec>(int)>& codec_for,
                        const std::function<std::vector<float>(int, uint64_t)>& grad_for = {}) {
  const int n = world.size();
  PipelineRun run;
  run.out.assign(steps, std::vector<std::vector<float>>(static_cast<std::size_t>(n)));
  for (int r = 0; r < n; ++r)
    run.pipes.push_back(std::make_unique<CompressionPipeline>(codec_for(r), *world.comms[static_cast<std::size_t>(r)]));
  world.runOk([&](int r, HostCommunicator& comm) {
    AggregationEngine engine(comm);  // each tensor alone: a group of one
    for (uint64_t s = 0; s < steps; ++s) {
      const std::vector<float> g = grad_for ? grad_for(r, s) : gradOf(r, numel, s);
      std::vector<float> o(static_cast<std::size_t>(numel), -123.0f);
      engine.run(s, *run.pipes[static_cast<std::size_t>(r)], g.data(), o.data());
      run.out[s][static_cast<std::size_t>(r)] = std::move(o);
    }
  });
  return run;
}

// ---- SUM

TEST(Pipeline, SumWithTestLossyPlugin) {
  auto loader = buildTreeLoader();
  auto plugin = loader.loadCompressor("test_lossy");
  const int n = 3;
  const uint64_t numel = 1001;
  World world(n);
  const PipelineRun run = runPipeline(world, numel, 3, [&](int r) {
    return makeCodec(plugin->instantiate({{"step", "0.5"}}), tensorFor(numel, r, n), 1, CodecOptions{});
  });
  for (uint64_t s = 0; s < 3; ++s) {
    for (std::size_t i = 0; i < numel; ++i) {
      // Multiples of 0.5 below 16 in magnitude: every partial sum is exact, in any order.
      float sum = 0;
      for (int r = 0; r < n; ++r) sum += std::trunc(gradOf(r, numel, s)[i] / 0.5f) * 0.5f;
      for (int r = 0; r < n; ++r) ASSERT_EQ(run.out[s][static_cast<std::size_t>(r)][i], sum / 3.0f) << s << " " << i;
    }
  }
  // Payload bytes are what the compressor produced; wire bytes what the transport counted for the tensor.
  for (int r = 0; r < n; ++r) {
    const PipelineStats& st = run.pipes[static_cast<std::size_t>(r)]->stats();
    EXPECT_EQ(st.steps, 3u);
    EXPECT_EQ(st.payload_bytes, 3 * (16 + 4 * numel));
    const auto traffic = world.comms[static_cast<std::size_t>(r)]->traffic();
    EXPECT_EQ(st.wire.sent_bytes, traffic.sent.tensor(17).bytes);
    EXPECT_EQ(st.wire.received_bytes, traffic.received.tensor(17).bytes);
    EXPECT_GT(st.wire.sent_bytes, 0u);
    EXPECT_NE(st.wire.sent_bytes, st.payload_bytes);
  }
}

TEST(Pipeline, TwoRoundSumWithTestRoundsPlugin) {
  auto loader = buildTreeLoader();
  auto plugin = loader.loadCompressor("test_rounds");
  for (int n : {1, 2, 5}) {
    const uint64_t numel = 257;
    World world(n);
    // Integer-valued inputs: test_rounds is then exact (its header comment), so the mean is exact too.
    auto grad = [&](int r, uint64_t s) {
      std::vector<float> g(numel);
      for (std::size_t i = 0; i < numel; ++i)
        g[i] = static_cast<float>(static_cast<int>(comm::testing::mix(r * 7 + s * 1000 + i) % 41) - 20);
      return g;
    };
    const PipelineRun run = runPipeline(
        world, numel, 3,
        [&](int r) { return makeCodec(plugin->instantiate(), tensorFor(numel, r, n), 1, CodecOptions{}); }, grad);
    for (uint64_t s = 0; s < 3; ++s) {
      for (std::size_t i = 0; i < numel; ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r) sum += grad(r, s)[i];
        for (int r = 0; r < n; ++r) ASSERT_EQ(run.out[s][static_cast<std::size_t>(r)][i], sum / static_cast<float>(n));
      }
    }
    // Two rounds: a 1-float payload, then the full one.
    EXPECT_EQ(run.pipes[0]->stats().payload_bytes, 3 * ((16 + 4) + (16 + 4 * numel)));
  }
}

// Error feedback through the pipeline: over T steps the averaged outputs carry every rank's gradients except what the
// residuals still hold (sum_t n * out_t = sum_t sum_r g_r - sum_r e_r).
TEST(Pipeline, ErrorFeedbackThroughThePipeline) {
  auto loader = buildTreeLoader();
  auto plugin = loader.loadCompressor("test_lossy");
  const int n = 3;
  const uint64_t numel = 513, steps = 12;
  World world(n);
  CodecOptions ef;
  ef.error_feedback = true;
  const PipelineRun run = runPipeline(world, numel, steps, [&](int r) {
    return makeCodec(plugin->instantiate({{"step", "0.25"}}), tensorFor(numel, r, n), 1, ef);
  });
  double max_gap = 0;
  for (std::size_t i = 0; i < numel; ++i) {
    double in = 0, out = 0, residual = 0;
    for (uint64_t s = 0; s < steps; ++s) {
      for (int r = 0; r < n; ++r) in += gradOf(r, numel, s)[i];
      out += n * static_cast<double>(run.out[s][0][i]);
    }
    for (int r = 0; r < n; ++r)
      residual += dynamic_cast<ErrorFeedback&>(run.pipes[static_cast<std::size_t>(r)]->codec()).residual()[i];
    max_gap = std::max(max_gap, std::abs(out - (in - residual)));
  }
  EXPECT_LT(max_gap, 1e-3);
}

// ---- ALLGATHER and CUSTOM

TEST(Pipeline, AllgatherVariableAndFixedSize) {
  for (bool fixed : {false, true}) {
    for (int n : {1, 4}) {
      const uint64_t numel = 700;
      World world(n, comm::testing::ringAllgather());  // the frame counts below are the ring's
      const PipelineRun run = runPipeline(world, numel, 2, [&](int r) {
        return makePluginCodec(std::make_shared<SparseFake>(fixed), tensorFor(numel, r, n), 1);
      });
      for (uint64_t s = 0; s < 2; ++s) {
        for (std::size_t i = 0; i < numel; ++i) {
          float sum = 0;  // each rank's kept value, accumulated in rank order as the pipeline does
          for (int r = 0; r < n; ++r) sum += SparseFake::keep(gradOf(r, numel, s)[i]);
          for (int r = 0; r < n; ++r)
            ASSERT_EQ(run.out[s][static_cast<std::size_t>(r)][i], sum / static_cast<float>(n)) << fixed << n << i;
        }
      }
      if (n > 1) {
        // A variable size costs a size exchange first: n-1 extra 8-byte frames per step.
        const auto traffic = world.comms[0]->traffic();
        uint64_t payload_frames = 0;
        for (int r = 0; r < n; ++r)
          if (r != 1) payload_frames += 1;  // rank 0 forwards every block but block 1, each one frame here
        EXPECT_EQ(traffic.sent.kind(comm::OpKind::kAllgather).frames,
                  2 * (payload_frames + (fixed ? 0 : static_cast<uint64_t>(n - 1))));
      }
    }
  }
}

TEST(Pipeline, CustomReduceFoldsInRankOrder) {
  const int n = 5;
  const uint64_t numel = 300;
  World world(n);
  std::vector<std::shared_ptr<VoteFake>> fakes;
  for (int r = 0; r < n; ++r) fakes.push_back(std::make_shared<VoteFake>());
  const PipelineRun run = runPipeline(world, numel, 2, [&](int r) {
    return makePluginCodec(fakes[static_cast<std::size_t>(r)], tensorFor(numel, r, n), 1);
  });
  for (uint64_t s = 0; s < 2; ++s) {
    for (std::size_t i = 0; i < numel; ++i) {
      int votes = 0;
      for (int r = 0; r < n; ++r) {
        const float g = gradOf(r, numel, s)[i];
        votes += g > 0 ? 1 : (g < 0 ? -1 : 0);
      }
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(run.out[s][static_cast<std::size_t>(r)][i], static_cast<float>(votes) / 5.0f);
    }
  }
  EXPECT_EQ(fakes[2]->reduce_calls, 2 * (n - 1));  // n-1 folds per step on every rank
}

// A backend that records every kernel region's cost, per thread, and leaves everything else to the one it replaces
// (real time here): what a simulation would be charged, without simulating.
class CostRecorder final : public rt::Backend {
 public:
  CostRecorder() : inner_(rt::backend()) { rt::installBackend(this); }
  ~CostRecorder() override { rt::installBackend(nullptr); }
  CostRecorder(const CostRecorder&) = delete;
  CostRecorder& operator=(const CostRecorder&) = delete;
  bool simulated() const noexcept override { return inner_.simulated(); }
  rt::Clock::time_point now() override { return inner_.now(); }
  void sleepUntil(rt::Clock::time_point t) override { inner_.sleepUntil(t); }
  std::unique_ptr<rt::MutexImpl> makeMutex() override { return inner_.makeMutex(); }
  std::unique_ptr<rt::CondVarImpl> makeCondVar() override { return inner_.makeCondVar(); }
  std::unique_ptr<rt::ThreadImpl> startThread(const std::string& name, int place, std::function<void()> fn) override {
    return inner_.startThread(name, place, std::move(fn));
  }
  void endKernel(const rt::Cost& cost) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    costs_[std::this_thread::get_id()].push_back(cost);
  }
  // Each thread's regions of `kind`, their phases in the order they closed.
  std::vector<std::vector<int>> phases(rt::CostKind kind) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::vector<int>> out;
    for (const auto& [thread, costs] : costs_) {
      out.emplace_back();
      for (const rt::Cost& c : costs)
        if (c.kind == kind) out.back().push_back(c.phase);
    }
    return out;
  }

 private:
  rt::Backend& inner_;
  mutable std::mutex mutex_;
  std::map<std::thread::id, std::vector<rt::Cost>> costs_;
};

// terse/phases_v1.h: every codec region a pipeline opens names the phase of its step, on the SUM path (compress and
// the aggregate's decode) and the CUSTOM one (the reduces of the fold too), which a CALIBRATED simulation charges
// apiece (experiments/runner/calibration.h); tests/runner's calibrated run covers the gathers' decode end to end.
TEST(Pipeline, EveryCodecRegionNamesItsStepsPhase) {
  const int n = 3;
  const uint64_t numel = 64, steps = 5;
  const std::vector<uint64_t> boundaries{2, 4};                // phases: steps 0-1, 2-3, 4
  const std::vector<int> want{0, 0, 1, 1, 2};                  // a region a step
  const std::vector<int> folds{0, 0, 0, 0, 1, 1, 1, 1, 2, 2};  // n - 1 reduces a step
  for (const bool custom : {false, true}) {
    SCOPED_TRACE(custom ? "CUSTOM" : "SUM");
    // Installed before the ranks' threads exist and removed after they are gone (the World goes first).
    const CostRecorder recorder;
    World world(n);
    std::vector<std::shared_ptr<FakeCompressor>> fakes;
    for (int r = 0; r < n; ++r) {
      fakes.push_back(custom ? std::shared_ptr<FakeCompressor>(std::make_shared<VoteFake>())
                             : std::shared_ptr<FakeCompressor>(std::make_shared<testing::TruncCompressor>()));
      fakes.back()->setPhaseSteps(boundaries);
    }
    runPipeline(world, numel, steps,
                [&](int r) { return makePluginCodec(fakes[static_cast<std::size_t>(r)], tensorFor(numel, r, n), 1); });
    const std::vector<std::vector<int>> compress = recorder.phases(rt::CostKind::kCompress);
    const std::vector<std::vector<int>> decompress = recorder.phases(rt::CostKind::kDecompress);
    const std::vector<std::vector<int>> reduce = recorder.phases(rt::CostKind::kReduce);
    const auto ranks = [](const std::vector<std::vector<int>>& per_thread) {
      std::vector<std::vector<int>> out;
      for (const auto& t : per_thread)
        if (!t.empty()) out.push_back(t);
      return out;
    };
    EXPECT_EQ(ranks(compress), std::vector<std::vector<int>>(n, want));
    EXPECT_EQ(ranks(decompress), std::vector<std::vector<int>>(n, want));
    if (custom) {
      EXPECT_EQ(ranks(reduce), std::vector<std::vector<int>>(n, folds));
    }
  }
}

// ---- Mismatches, refused at construction before any frame is sent.

template <class E>
void expectRefused(const CompressorCaps& caps, const CompressorSizes& sizes, const std::string& needle,
                   bool no_f16 = false) {
  auto fabric = comm::InprocFabric::create(2);
  std::unique_ptr<HostCommunicator> c = no_f16 ? std::make_unique<NoF16Communicator>(fabric->endpoint(0))
                                               : std::make_unique<HostCommunicator>(fabric->endpoint(0));
  auto codec = makePluginCodec(std::make_shared<ConfiguredFake>(caps, sizes), tensorFor(10, 0, 2), 1);
  try {
    CompressionPipeline p(std::move(codec), *c);
    ADD_FAILURE() << "accepted; expected: " << needle;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(fabric->traffic()[0].sent.total().frames, 0u);
}

// What the pipeline itself owns: whether the communicator can carry the codec's path.
TEST(Pipeline, CommunicatorMismatchesAreRefusedBeforeRunning) {
  CompressorCaps sum;
  sum.devices = TERSE_DEVICE_HOST;
  sum.aggregation = Aggregation::kSum;
  sum.fixed_size = true;
  CompressorSizes sizes;
  sizes.max_output_bytes = 56;
  sizes.sum_header_bytes = 16;

  CompressorCaps f16 = sum;
  f16.wire_dtype = DType::kF16;
  expectRefused<Unsupported>(f16, sizes, "wire dtype f16 cannot be summed", true);

  // A codec built for another rank than the communicator's.
  auto fabric = comm::InprocFabric::create(2);
  HostCommunicator c1(fabric->endpoint(1));
  auto codec = makePluginCodec(std::make_shared<SparseFake>(false), tensorFor(10, 0, 2), 1);
  EXPECT_THROW(CompressionPipeline(std::move(codec), c1), InvalidArgument);
}

// ---- A plugin that breaks its contract, driven through the whole stack. The caps' and sizes' rules and every per-call
// size are checked once, in core/plugin (compressor_plugin.cc); the codec, the pipeline and the engine trust them.
// These cases show the guarantee did not weaken on the way up: the same clear PluginError reaches the caller, before
// any frame for what is wrong at setup, and on every rank at the call that lied.

std::shared_ptr<Compressor> lyingFixture(const std::string& name, const std::string& mode) {
  const std::filesystem::path file =
      std::filesystem::path(TERSE_TEST_FIXTURE_PLUGIN_DIR) / PluginLoader::fileNameFor(PluginKind::kCompressor, name);
  return CompressorPlugin::open(file)->instantiate({{"mode", mode}});
}

TEST(Pipeline, PluginContractBreachesAreRefusedWhenTheTensorIsBound) {
  struct Case {
    const char* fixture;
    const char* mode;
    const char* needle;
  };
  // Tensors of 10 f32: the fixtures' payload is 40 bytes.
  const std::vector<Case> cases = {
      {"bad_caps", "sum_not_fixed", "aggregation sum requires TERSE_CAP_FIXED_SIZE"},
      {"bad_caps", "bad_wire", "aggregation sum needs f32, f16 or bf16"},
      {"bad_caps", "rounds_allgather", "num_rounds = 2 needs aggregation sum or custom, got allgather"},
      {"bad_caps", "many_rounds", "num_rounds = 9, must be in 1..8"},
      {"bad_caps", "custom_no_reduce", "aggregation custom requires the function pointer 'reduce'"},
      {"bad_caps", "bad_header", "sum_header_bytes = 2 is not a multiple of the wire dtype f32's 4 bytes"},
      {"bad_caps", "header_over", "sum_header_bytes = 44 exceeds max_output_bytes = 40"},
      {"bad_caps", "ragged_body", "is not a whole number of f32 elements"},
      {"bad_custom", "reduced_small", "max_reduced_bytes = 36 is below max_output_bytes = 40"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.mode);
    auto fabric = comm::InprocFabric::create(2);
    HostCommunicator comm(fabric->endpoint(0));
    try {
      CompressionPipeline p(makeCodec(lyingFixture(c.fixture, c.mode), tensorFor(10, 0, 2), 1, {}), comm);
      ADD_FAILURE() << "accepted; expected: " << c.needle;
    } catch (const PluginError& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("compressor '") + c.fixture + "'"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(fabric->traffic()[0].sent.total().frames, 0u);
  }
}

TEST(Engine, APluginsPerCallLieStopsEveryRankAtTheLyingCall) {
  struct Case {
    const char* fixture;
    const char* mode;
    const char* needle;
  };
  const std::vector<Case> cases = {
      // SUM, fixed size: a short payload would be summed against the peers' longer ones.
      {"bad_caps", "fixed_lies",
       "compress failed [plugin error]: it returned 36 bytes, but its caps say fixed size and max_output_bytes is 40"},
      // ALLGATHER, variable size: a payload above its buffer (sized to max_output_bytes, so the pipeline's buffers
      // leave too_big no room to lie; loader_test.cc has it) would overrun the slot every peer reserved for it.
      {"bad_caps", "overflow", "compress failed [plugin error]: it reported 41 bytes written into a buffer of 40"},
      // CUSTOM: the fold's output is the next fold's input and the decoded aggregate.
      {"bad_custom", "reduce_overflow",
       "reduce failed [plugin error]: it reported 41 bytes written into a buffer of 40"}};
  for (const int n : {1, 2, 3}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.mode) + " on " + std::to_string(n) + " ranks");
      World world(n);
      std::vector<std::unique_ptr<CompressionPipeline>> pipes;
      for (int r = 0; r < n; ++r) {
        pipes.push_back(std::make_unique<CompressionPipeline>(
            makeCodec(lyingFixture(c.fixture, c.mode), tensorFor(10, r, n), 1, {}),
            *world.comms[static_cast<std::size_t>(r)]));
      }
      const auto result = world.run([&](int r, HostCommunicator& comm) {
        AggregationEngine engine(comm);
        const std::vector<float> g = gradOf(r, 10, 0);
        std::vector<float> o(10);
        engine.run(0, *pipes[static_cast<std::size_t>(r)], g.data(), o.data());
      });
      ASSERT_FALSE(result.watchdog_fired);
      // A reduce runs only with a peer to fold in: alone, a CUSTOM rank decodes its own payload.
      const bool folds = std::string(c.fixture) == "bad_custom";
      for (int r = 0; r < n; ++r) {
        if (folds && n == 1) {
          EXPECT_EQ(result.message(r), "") << "rank " << r;
          continue;
        }
        EXPECT_NE(result.message(r).find(c.needle), std::string::npos) << "rank " << r << ": " << result.message(r);
        EXPECT_NE(result.message(r).find("compressor '" + std::string(c.fixture) + "'"), std::string::npos)
            << result.message(r);
      }
    }
  }
}

// ---- Built-in compressors (compressors/), each run through the pipeline when this build has it.

TEST(Pipeline, BuiltinCompressorsThroughEveryPath) {
  struct Case {
    const char* name;
    Params params;
  };
  const std::vector<Case> cases = {{"none", {}},
                                   {"fp16", {}},
                                   {"bf16", {}},
                                   {"topk", {{"ratio", "0.1"}}},
                                   {"randomk", {{"ratio", "0.1"}}},
                                   {"signsgd", {}},
                                   {"powersgd", {{"rank", "2"}}},
                                   {"threshold", {{"tau", "4"}}},
                                   {"qsgd", {}},
                                   {"terngrad", {}},
                                   {"natural", {}},
                                   {"onebit", {}},
                                   {"dgc", {{"ratio", "0.1"}}}};
  auto loader = buildTreeLoader();
  int ran = 0;
  std::string names;
  for (const Case& c : cases) {
    const std::filesystem::path file =
        std::filesystem::path(TERSE_TEST_BUILD_PLUGIN_DIR) / PluginLoader::fileNameFor(PluginKind::kCompressor, c.name);
    if (!std::filesystem::exists(file)) continue;
    SCOPED_TRACE(c.name);
    std::shared_ptr<Compressor> compressor;
    try {
      compressor = loader.loadCompressor(c.name)->instantiate(c.params);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << " did not load: " << e.what();
      continue;
    }
    const int n = 3;
    TensorInfo t = tensorFor(32 * 33, 0, n, 5);
    t.ndim = 2;
    t.shape = {32, 33, 0, 0};
    World world(n);
    CodecOptions ef;
    ef.error_feedback = true;
    const PipelineRun run = runPipeline(world, t.numel, 3, [&](int r) {
      TensorInfo tr = t;
      tr.rank = r;
      tr.source_rank = r;
      return makeCodec(compressor, tr, 99, ef);
    });
    const Aggregation agg = run.pipes[0]->aggregation();
    for (std::size_t i = 0; i < t.numel; ++i) {
      for (int r = 1; r < n; ++r)
        ASSERT_EQ(run.out[2][static_cast<std::size_t>(r)][i], run.out[2][0][i]) << "ranks disagree at " << i;
      ASSERT_TRUE(std::isfinite(run.out[2][0][i]));
    }
    // SUM and ALLGATHER: the average is that of what each rank transmitted (its own payload decoded), the ABI's
    // per-rank decompress rule. Each of the n-1 pairwise adds rounds once in the wire dtype (16-bit for fp16/bf16
    // SUM wires) at a magnitude of at most sum_r |t_r|, which bounds the difference.
    if (agg != Aggregation::kCustom) {
      const CompressorCaps& caps = run.pipes[0]->codec().caps();
      const double eps = agg != Aggregation::kSum || caps.wire_dtype == DType::kF32 ? 1.2e-7
                         : caps.wire_dtype == DType::kF16                           ? 9.8e-4
                                                                                    : 7.9e-3;
      for (std::size_t i = 0; i < t.numel; ++i) {
        double sum = 0, magnitude = 0;
        for (int r = 0; r < n; ++r) {
          const float v =
              dynamic_cast<ErrorFeedback&>(run.pipes[static_cast<std::size_t>(r)]->codec()).transmitted()[i];
          sum += v;
          magnitude += std::abs(v);
        }
        ASSERT_NEAR(run.out[2][0][i], sum / n, eps * magnitude + 1e-6) << "element " << i;
      }
    }
    ++ran;
    names += std::string(names.empty() ? "" : ", ") + c.name + " (" + std::string(aggregationName(agg)) + ")";
  }
  if (ran == 0) GTEST_SKIP() << "no built-in compressor plugin in this build yet";
  std::cout << "[ pipeline ] built-in compressors run: " << names << '\n';
}

// ---- EF21 (core/compress/ef21.h) through the engine: the pipeline hands it every step's decoded aggregate once.

std::shared_ptr<Compressor> builtinOrNull(PluginLoader& loader, const std::string& name, const Params& params) {
  const std::filesystem::path file =
      std::filesystem::path(TERSE_TEST_BUILD_PLUGIN_DIR) / PluginLoader::fileNameFor(PluginKind::kCompressor, name);
  if (!std::filesystem::exists(file)) return nullptr;
  return loader.loadCompressor(name)->instantiate(params);
}

// ALLGATHER (top-k), three ranks, gradients that change every step: each rank's output equals EF21's equations run
// here with plain codecs of the same compressor, bit for bit: v, h and H per rank, every payload decoded in rank order
// into the aggregate, H + aggregate, then the pipeline's division by the world.
TEST(Pipeline, Ef21MatchesItsEquationsThroughAnAllgather) {
  auto loader = buildTreeLoader();
  const auto topk = builtinOrNull(loader, "topk", {{"ratio", "0.05"}});
  if (!topk) GTEST_SKIP() << "no built-in topk in this build";
  const int n = 3;
  const uint64_t numel = 1001, steps = 6;
  for (const float eta : {1.0f, 0.5f}) {
    SCOPED_TRACE(eta);
    World world(n);
    CodecOptions options;
    options.error_feedback = true;
    options.error_feedback_rule = ErrorFeedbackRule::kEf21;
    options.ef21_momentum = eta;
    const PipelineRun run =
        runPipeline(world, numel, steps, [&](int r) { return makeCodec(topk, tensorFor(numel, r, n), 99, options); });

    std::vector<std::unique_ptr<TensorCodec>> plain;
    for (int r = 0; r < n; ++r) plain.push_back(makeCodec(topk, tensorFor(numel, r, n), 99, CodecOptions{}));
    std::vector<std::vector<float>> v(n, std::vector<float>(numel)), h(n, std::vector<float>(numel, 0.0f));
    std::vector<float> sum(numel, 0.0f);
    for (uint64_t s = 0; s < steps; ++s) {
      std::vector<std::vector<std::byte>> payloads(n);
      for (int r = 0; r < n; ++r) {
        const auto ri = static_cast<std::size_t>(r);
        const std::vector<float> g = gradOf(r, numel, s);
        std::vector<float> input(numel), t(numel);
        for (std::size_t i = 0; i < numel; ++i) {
          v[ri][i] = s == 0 || eta == 1.0f ? g[i] : (1.0f - eta) * v[ri][i] + eta * g[i];
          input[i] = v[ri][i] - h[ri][i];
        }
        payloads[ri].resize(plain[ri]->sizes(0).max_output_bytes);
        payloads[ri].resize(plain[ri]->encode(s, 0, input.data(), {}, payloads[ri]));
        plain[ri]->decode(s, payloads[ri], r, t.data(), false);
        for (std::size_t i = 0; i < numel; ++i) h[ri][i] = h[ri][i] + t[i];
      }
      std::vector<float> aggregate(numel, 0.0f);
      for (int r = 0; r < n; ++r) plain[0]->decode(s, payloads[static_cast<std::size_t>(r)], r, aggregate.data(), true);
      for (std::size_t i = 0; i < numel; ++i) {
        sum[i] = sum[i] + aggregate[i];
        for (int r = 0; r < n; ++r)
          ASSERT_EQ(run.out[s][static_cast<std::size_t>(r)][i], sum[i] / 3.0f)
              << "step " << s << " rank " << r << " element " << i;
      }
    }
    for (int r = 0; r < n; ++r) {
      const auto& codec = dynamic_cast<const Ef21&>(run.pipes[static_cast<std::size_t>(r)]->codec());
      for (std::size_t i = 0; i < numel; ++i) {
        ASSERT_EQ(codec.estimate()[i], h[static_cast<std::size_t>(r)][i]) << "rank " << r << " element " << i;
        ASSERT_EQ(codec.estimateSum()[i], sum[i]) << "rank " << r << " element " << i;
      }
    }
  }
}

// Every aggregation path EF21 takes (ALLGATHER top-k, SUM f32 random-k, two-round SUM PowerSGD), three ranks, each
// with a gradient that does not change: the ranks agree bit for bit, the sum of the estimates is the sum of each
// rank's up to f32 rounding, and the output reaches the mean gradient, which error feedback's does not. A 16-bit SUM
// wire is refused (ef21.h: its sums' rounding would stay in H).
TEST(Pipeline, Ef21ReachesAFixedMeanGradientOnEveryPath) {
  struct Case {
    const char* name;
    Params params;
    uint64_t steps;
    double tolerance;  // of max |out - mean g| after `steps`
    double wire_eps;   // relative rounding of one sum on the wire
  };
  // Random-k at 1/2 sends a shared half of the differences exactly each step: after 40 steps an element is left out
  // with probability 2^-40. PowerSGD at rank 2 of a 32 x 33 matrix takes the difference two directions a step.
  // Measured: top-k 3.2e-7, random-k 3.2e-7, PowerSGD 3.7e-6; error feedback's outputs are more than 100 tolerances
  // off.
  const std::vector<Case> cases = {{"topk", {{"ratio", "0.1"}}, 12, 1e-6, 1.2e-7},
                                   {"randomk", {{"ratio", "0.5"}}, 40, 1e-6, 1.2e-7},
                                   {"powersgd", {{"rank", "2"}}, 60, 2e-5, 1.2e-7}};
  auto loader = buildTreeLoader();
  int ran = 0;
  for (const Case& c : cases) {
    const auto compressor = builtinOrNull(loader, c.name, c.params);
    if (!compressor) continue;
    SCOPED_TRACE(c.name);
    const int n = 3;
    TensorInfo t = tensorFor(32 * 33, 0, n, 5);
    t.ndim = 2;
    t.shape = {32, 33, 0, 0};
    const auto fixed = [&](int r, uint64_t) { return gradOf(r, t.numel, 0); };
    std::vector<double> mean(t.numel, 0.0);
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < t.numel; ++i) mean[i] += gradOf(r, t.numel, 0)[i] / 3.0;
    const auto farthest = [&](const std::vector<float>& out) {
      double worst = 0;
      for (std::size_t i = 0; i < t.numel; ++i) worst = std::max(worst, std::abs(out[i] - mean[i]));
      return worst;
    };
    for (const bool ef21 : {true, false}) {
      World world(n);
      CodecOptions options;
      options.error_feedback = true;
      if (ef21) options.error_feedback_rule = ErrorFeedbackRule::kEf21;
      const PipelineRun run = runPipeline(
          world, t.numel, c.steps,
          [&](int r) {
            TensorInfo tr = t;
            tr.rank = r;
            tr.source_rank = r;
            return makeCodec(compressor, tr, 99, options);
          },
          fixed);
      const std::vector<float>& last = run.out[c.steps - 1][0];
      for (int r = 1; r < n; ++r) ASSERT_EQ(run.out[c.steps - 1][static_cast<std::size_t>(r)], last) << "rank " << r;
      if (!ef21) {
        EXPECT_GT(farthest(last), 100 * c.tolerance) << "error feedback";
        continue;
      }
      EXPECT_LE(farthest(last), c.tolerance);
      for (std::size_t i = 0; i < t.numel; ++i) {
        double estimates = 0, magnitude = 0;
        for (int r = 0; r < n; ++r) {
          const float h = dynamic_cast<const Ef21&>(run.pipes[static_cast<std::size_t>(r)]->codec()).estimate()[i];
          estimates += h;
          magnitude += std::abs(h);
        }
        ASSERT_NEAR(last[i] * 3.0, estimates, 2 * c.wire_eps * magnitude + 1e-5) << "element " << i;
      }
    }
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no built-in compressor plugin in this build";
}

// A codec that says its tensor is on a CUDA device: the pipeline must refuse a host communicator for it before any
// step (its buffers would be device pointers that the host transport dereferences).
class DevicePlacedCodec final : public TensorCodec {
 public:
  DevicePlacedCodec() {
    info_.dtype = DType::kF32;
    info_.numel = 8;
    info_.device = TERSE_DEVICE_CUDA;
    info_.device_index = 0;
    info_.world_size = 1;
    caps_.aggregation = Aggregation::kSum;
    caps_.wire_dtype = DType::kF32;
    caps_.fixed_size = true;
    sizes_.max_output_bytes = 32;
  }
  const CompressorCaps& caps() const override { return caps_; }
  const TensorInfo& info() const override { return info_; }
  std::span<const CompressorSizes> roundSizes() const override { return {&sizes_, 1}; }
  Placement placement() const override { return Placement::cuda(&stream_); }
  uint64_t encode(uint64_t, int, const void*, std::span<const std::byte>, std::span<std::byte>) override { return 0; }
  void decode(uint64_t, std::span<const std::byte>, int, void*, bool) override {}
  using TensorCodec::reduce;
  uint64_t reduce(uint64_t, int, std::span<const std::byte>, std::span<const std::byte>,
                  std::span<std::byte>) override {
    return 0;
  }

 private:
  TensorInfo info_;
  CompressorCaps caps_;
  CompressorSizes sizes_;
  mutable int stream_ = 0;  // only its address is used, as a stream handle that is not null
};

// ---- The engine's groups: a fused group is the math of its members run alone, a group of one is exactly the
// unfused path on the wire, and a caller's mistake is refused before any frame is sent.

// Gradients of member m on rank r: different tensors, so a misplaced segment would show.
std::vector<float> memberGrad(int member, int rank, uint64_t numel, uint64_t step) {
  return gradOf(rank + 7 * member, numel, step);
}

// One step's gradients (memberGrad), outputs (-1 everywhere, so an unwritten one shows) and the group over them.
struct StepGroup {
  std::vector<std::vector<float>> grads, outputs;
  std::vector<GroupMember> members;
};

StepGroup stepGroup(const std::vector<std::unique_ptr<CompressionPipeline>>& pipes, const std::vector<uint64_t>& numels,
                    int rank, uint64_t step) {
  StepGroup g;
  for (std::size_t m = 0; m < numels.size(); ++m) {
    g.grads.push_back(memberGrad(static_cast<int>(m), rank, numels[m], step));
    g.outputs.emplace_back(numels[m], -1.0f);
  }
  for (std::size_t m = 0; m < numels.size(); ++m)
    g.members.push_back(GroupMember{pipes[m].get(), g.grads[m].data(), g.outputs[m].data()});
  return g;
}

// One pipeline per member over `codec` (test_lossy in the tests below), each tensor its own id.
std::vector<std::unique_ptr<CompressionPipeline>> pipelinesOf(const std::shared_ptr<Compressor>& codec,
                                                              const std::vector<uint64_t>& numels, int rank, int world,
                                                              HostCommunicator& comm) {
  std::vector<std::unique_ptr<CompressionPipeline>> pipes;
  for (std::size_t m = 0; m < numels.size(); ++m)
    pipes.push_back(std::make_unique<CompressionPipeline>(
        makePluginCodec(codec, tensorFor(numels[m], rank, world, 100 + m), 1), comm));
  return pipes;
}

// A step's outputs into outs[rank * members + m] (the last step's stay).
void keepOutputs(std::vector<std::vector<float>>& outs, int rank, const std::vector<std::vector<float>>& outputs) {
  for (std::size_t m = 0; m < outputs.size(); ++m)
    outs[static_cast<std::size_t>(rank) * outputs.size() + m] = outputs[m];
}

TEST(Engine, FusedGroupEqualsItsMembersRunAlone) {
  // Two ranks, so a fused SUM is bit-identical too (a + b == b + a; engine.h).
  const int n = 2;
  const std::vector<uint64_t> numels = {301, 0, 77, 1000, 5};
  auto loader = buildTreeLoader();
  auto lossy = loader.loadCompressor("test_lossy")->instantiate({});
  auto variable = std::make_shared<SparseFake>(false);
  auto vote = std::make_shared<VoteFake>();
  // Members: SUM, SUM (fused with the first), variable ALLGATHER, variable ALLGATHER (fused: a size table), CUSTOM.
  auto codecFor = [&](std::size_t m, int r) -> std::unique_ptr<TensorCodec> {
    const TensorInfo t = tensorFor(numels[m], r, n, 100 + m);
    switch (m) {
      case 0:
      case 1:
        return makePluginCodec(lossy, t, 1);
      case 2:
        return makePluginCodec(variable, t, 1);
      case 3:
        return makePluginCodec(variable, t, 1);
      default:
        return makePluginCodec(vote, t, 1);
    }
  };
  std::array<std::vector<uint64_t>, 2> collectives;
  std::array<std::vector<std::vector<float>>, 2> outs;  // [grouped][rank * members + m]
  for (int grouped = 0; grouped < 2; ++grouped) {
    World world(n);
    outs[grouped].assign(static_cast<std::size_t>(n) * numels.size(), {});
    collectives[grouped].assign(static_cast<std::size_t>(n), 0);
    world.runOk([&](int r, HostCommunicator& comm) {
      std::vector<std::unique_ptr<CompressionPipeline>> pipes;
      for (std::size_t m = 0; m < numels.size(); ++m)
        pipes.push_back(std::make_unique<CompressionPipeline>(codecFor(m, r), comm));
      AggregationEngine engine(comm);
      for (uint64_t step = 0; step < 3; ++step) {
        StepGroup g = stepGroup(pipes, numels, r, step);
        const std::vector<GroupMember>& members = g.members;
        const std::vector<std::vector<float>>& outputs = g.outputs;
        if (grouped == 1) {
          engine.run(step, members);
        } else {
          for (const GroupMember& m : members) engine.run(step, *m.pipeline, m.grad, m.out);
        }
        keepOutputs(outs[grouped], r, outputs);
      }
      collectives[grouped][static_cast<std::size_t>(r)] = engine.collectives();
    });
  }
  for (std::size_t i = 0; i < outs[0].size(); ++i) EXPECT_EQ(outs[0][i], outs[1][i]) << "rank*members+member " << i;
  // Alone, per step: 2 allreduces, 2 x (size exchange + allgatherv), 1 allgatherv for the fixed-size vote. Grouped:
  // 1 allreduce, 1 size exchange + 1 allgatherv, 1 allgatherv.
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(collectives[0][static_cast<std::size_t>(r)], 3u * 7u);
    EXPECT_EQ(collectives[1][static_cast<std::size_t>(r)], 3u * 4u);
  }
}

// EF21 through fused groups (a SUM run decoded from the concatenation, a variable ALLGATHER run with its size table,
// an empty member): every member's outputs and estimates equal its run alone, bit for bit, over three steps. Two
// ranks, as above, so the fused sums are bit-identical too. aggregated() called twice or not at all for a fused member
// would part the two.
TEST(Engine, Ef21FusedGroupEqualsItsMembersRunAlone) {
  const int n = 2;
  const std::vector<uint64_t> numels = {301, 0, 77, 1000};
  auto loader = buildTreeLoader();
  auto lossy = loader.loadCompressor("test_lossy")->instantiate({});
  auto variable = std::make_shared<SparseFake>(false);
  CodecOptions o;
  o.error_feedback = true;
  o.error_feedback_rule = ErrorFeedbackRule::kEf21;
  o.ef21_momentum = 0.5;
  std::array<std::vector<std::vector<float>>, 2> outs, estimates;  // [grouped][rank * members + m]
  for (int grouped = 0; grouped < 2; ++grouped) {
    World world(n);
    outs[grouped].assign(static_cast<std::size_t>(n) * numels.size(), {});
    estimates[grouped].assign(static_cast<std::size_t>(n) * numels.size(), {});
    world.runOk([&](int r, HostCommunicator& comm) {
      std::vector<std::unique_ptr<CompressionPipeline>> pipes;
      for (std::size_t m = 0; m < numels.size(); ++m)
        pipes.push_back(std::make_unique<CompressionPipeline>(
            makeCodec(m < 2 ? lossy : variable, tensorFor(numels[m], r, n, 100 + m), 1, o), comm));
      AggregationEngine engine(comm);
      for (uint64_t step = 0; step < 3; ++step) {
        StepGroup g = stepGroup(pipes, numels, r, step);
        if (grouped == 1) {
          engine.run(step, g.members);
        } else {
          for (const GroupMember& m : g.members) engine.run(step, *m.pipeline, m.grad, m.out);
        }
        keepOutputs(outs[grouped], r, g.outputs);
      }
      for (std::size_t m = 0; m < numels.size(); ++m) {
        const auto& h = dynamic_cast<const Ef21&>(pipes[m]->codec()).estimate();
        estimates[grouped][static_cast<std::size_t>(r) * numels.size() + m].assign(h.begin(), h.end());
      }
    });
  }
  for (std::size_t i = 0; i < outs[0].size(); ++i) {
    EXPECT_EQ(outs[0][i], outs[1][i]) << "rank*members+member " << i;
    EXPECT_EQ(estimates[0][i], estimates[1][i]) << "rank*members+member " << i;
  }
}

// sumInPlaceFrom (the DDP hook's setting): a SUM member whose body reaches the threshold leaves its fusion run and is
// summed alone in place; the members around it still fuse. Two ranks: the sums are bit-identical to the fused run's,
// and so are the payload bytes; the wire carries the same bodies in more frames (one 32-byte frame header each).
TEST(Engine, LargeSumMembersSumAloneInPlace) {
  const int n = 2;
  const std::vector<uint64_t> numels = {301, 77, 5000, 40, 4000, 0, 9};
  auto loader = buildTreeLoader();
  auto lossy = loader.loadCompressor("test_lossy")->instantiate({});
  std::array<std::vector<std::vector<float>>, 2> outs;  // [in place][rank * members + m]
  std::array<std::array<uint64_t, 2>, 2> collectives{}, sent{}, frames{}, payload{};
  for (int in_place = 0; in_place < 2; ++in_place) {
    World world(n);
    outs[in_place].assign(static_cast<std::size_t>(n) * numels.size(), {});
    world.runOk([&](int r, HostCommunicator& comm) {
      const auto pipes = pipelinesOf(lossy, numels, r, n, comm);
      AggregationEngine engine(comm);
      // The threshold is member 4's body: members 2 and 4 sum alone, {0, 1}, {3} and {5, 6} fuse.
      if (in_place == 1) engine.sumInPlaceFrom(pipes[4]->maxPayloadBytes(0) - pipes[4]->sumHeaderBytes(0));
      for (uint64_t step = 0; step < 3; ++step) {
        StepGroup g = stepGroup(pipes, numels, r, step);
        engine.run(step, g.members);
        keepOutputs(outs[in_place], r, g.outputs);
      }
      collectives[in_place][static_cast<std::size_t>(r)] = engine.collectives();
      for (const auto& p : pipes) {
        sent[in_place][static_cast<std::size_t>(r)] += p->stats().wire.sent_bytes;
        frames[in_place][static_cast<std::size_t>(r)] += p->stats().wire.sent_frames;
        payload[in_place][static_cast<std::size_t>(r)] += p->stats().payload_bytes;
      }
    });
  }
  for (std::size_t i = 0; i < outs[0].size(); ++i) EXPECT_EQ(outs[0][i], outs[1][i]) << "rank*members+member " << i;
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(collectives[0][r], 3u * 1u) << "fused: one allreduce a step";
    EXPECT_EQ(collectives[1][r], 3u * 5u) << "in place: {0, 1}, {2}, {3}, {4}, {5, 6}";
    EXPECT_EQ(payload[0][r], payload[1][r]) << "the same payloads";
    EXPECT_GT(frames[1][r], frames[0][r]);
    EXPECT_EQ(sent[1][r] - sent[0][r], (frames[1][r] - frames[0][r]) * comm::kFrameHeaderBytes)
        << "the same bodies sent, in more frames";
  }
}

// A fused SUM on the host is decoded where it was summed (engine.h): each member's header goes in front of its summed
// body in the concatenation, unless that payload would not start 16-byte aligned, and only then is the body copied
// back. test_lossy's header is 16 bytes, so a member whose body starts at a multiple of 16 decodes in place; bodies of
// 64, 4, 13, 32, 0 and 7 floats start at bytes 0, 256, 272, 324, 452 and 452 of the concatenation: the first three
// decode there, the last three are copied back. Two ranks: bit for bit the members run alone.
TEST(Engine, FusedSumDecodesWhereItWasSummed) {
  const int n = 2;
  const std::vector<uint64_t> numels = {64, 4, 13, 32, 0, 7};
  const uint64_t bodies = 4 * (64 + 4 + 13 + 32 + 0 + 7);
  const uint64_t copied_back = 4 * (32 + 0 + 7);
  const uint64_t steps = 3;
  auto loader = buildTreeLoader();
  auto lossy = loader.loadCompressor("test_lossy")->instantiate({});
  std::array<std::vector<std::vector<float>>, 2> outs;  // [grouped][rank * members + m]
  std::array<std::array<uint64_t, 2>, 2> copied{};
  for (int grouped = 0; grouped < 2; ++grouped) {
    World world(n);
    outs[grouped].assign(static_cast<std::size_t>(n) * numels.size(), {});
    world.runOk([&](int r, HostCommunicator& comm) {
      const auto pipes = pipelinesOf(lossy, numels, r, n, comm);
      AggregationEngine engine(comm);
      for (uint64_t step = 0; step < steps; ++step) {
        StepGroup g = stepGroup(pipes, numels, r, step);
        if (grouped == 1) {
          engine.run(step, g.members);
        } else {
          for (const GroupMember& m : g.members) engine.run(step, *m.pipeline, m.grad, m.out);
        }
        keepOutputs(outs[grouped], r, g.outputs);
      }
      copied[grouped][static_cast<std::size_t>(r)] = engine.copiedBodyBytes();
    });
  }
  for (std::size_t i = 0; i < outs[0].size(); ++i) EXPECT_EQ(outs[0][i], outs[1][i]) << "rank*members+member " << i;
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(copied[0][r], 0u) << "alone: each sums in place behind its header";
    EXPECT_EQ(copied[1][r], steps * (bodies + copied_back))
        << "fused: every body into the concatenation, and back only the three that cannot decode there";
  }
}

// A one-round SUM group split around its collectives (SplitSum: the DDP hook's chained path) gives run()'s bits: the
// same fusion (with sumInPlaceFrom, one member alone), so the same collectives, summed here by the test through the
// communicator as the hook sums them through torch. Three ranks, where a different cut could change a sum's last bit:
// the same cut must not. Two groups are in flight at once (both begun, summed, then finished in the other order), as
// DDP's buckets are; the counts of collectives, copies and wire bytes are run()'s. A member of another kind is
// refused before anything is encoded.
TEST(Engine, ASplitSumEqualsTheRunOfItsGroup) {
  const int n = 3;
  const std::vector<uint64_t> first = {301, 77, 5000, 40, 0, 9};
  const std::vector<uint64_t> second = {13, 64, 7};
  auto loader = buildTreeLoader();
  auto lossy = loader.loadCompressor("test_lossy")->instantiate({});
  std::array<std::vector<std::vector<float>>, 2> outs;  // [split][(rank * 2 + group) * members + m]
  std::array<std::array<uint64_t, 3>, 2> collectives{}, copied{}, sent{};
  for (int split = 0; split < 2; ++split) {
    World world(n);
    outs[split].assign(static_cast<std::size_t>(n) * 2 * first.size(), {});
    world.runOk([&](int r, HostCommunicator& comm) {
      auto pipes_a = pipelinesOf(lossy, first, r, n, comm);
      auto pipes_b = pipelinesOf(lossy, second, r, n, comm);
      AggregationEngine engine(comm);
      engine.sumInPlaceFrom(pipes_a[2]->maxPayloadBytes(0) - pipes_a[2]->sumHeaderBytes(0));
      SplitSum sa, sb;
      for (uint64_t step = 0; step < 3; ++step) {
        StepGroup a = stepGroup(pipes_a, first, r, step);
        StepGroup b = stepGroup(pipes_b, second, r, step);
        if (split == 0) {
          engine.run(step, a.members);
          engine.run(step, b.members);
        } else {
          engine.beginSum(step, a.members, sa);
          engine.beginSum(step, b.members, sb);
          EXPECT_EQ(sa.sums.size(), 3u) << "{0, 1}, {2} alone, {3, 4, 5}";
          EXPECT_EQ(sb.sums.size(), 1u);
          std::vector<comm::WireBytes> wa, wb;
          for (const SplitSum::Sum& x : sa.sums)
            wa.push_back(comm.allreduce(x.data.data(), x.data.size() / 4, x.wire, comm::ReduceOp::kSum, x.tensor));
          for (const SplitSum::Sum& x : sb.sums)
            wb.push_back(comm.allreduce(x.data.data(), x.data.size() / 4, x.wire, comm::ReduceOp::kSum, x.tensor));
          EXPECT_FALSE(engine.finishSum(sb, wb)) << "a one-round split ends at its first finish";
          EXPECT_FALSE(engine.finishSum(sa, wa));
          EXPECT_TRUE(sa.sums.empty());
        }
        for (std::size_t m = 0; m < a.outputs.size(); ++m)
          outs[split][(static_cast<std::size_t>(r) * 2) * first.size() + m] = a.outputs[m];
        for (std::size_t m = 0; m < b.outputs.size(); ++m)
          outs[split][(static_cast<std::size_t>(r) * 2 + 1) * first.size() + m] = b.outputs[m];
      }
      collectives[split][static_cast<std::size_t>(r)] = engine.collectives();
      copied[split][static_cast<std::size_t>(r)] = engine.copiedBodyBytes();
      for (const auto* pipes : {&pipes_a, &pipes_b})
        for (const auto& p : *pipes) sent[split][static_cast<std::size_t>(r)] += p->stats().wire.sent_bytes;
      if (split == 1 && r == 0) {
        // Another kind of member: refused before any encode (the pipeline's payload count stays).
        auto variable = std::make_shared<SparseFake>(false);
        CompressionPipeline gather(makePluginCodec(variable, tensorFor(10, r, n, 7), 1), comm);
        std::vector<float> g(10, 1.0f), o(10);
        const std::vector<GroupMember> mixed = {GroupMember{pipes_b[0].get(), g.data(), o.data()},
                                                GroupMember{&gather, g.data(), o.data()}};
        const uint64_t before = pipes_b[0]->stats().payload_bytes;
        SplitSum bad;
        EXPECT_THROW(engine.beginSum(9, mixed, bad), InvalidArgument);
        EXPECT_EQ(pipes_b[0]->stats().payload_bytes, before) << "a member was encoded before the refusal";
        // SUM members of different rounds cannot advance together.
        auto rounds = loader.loadCompressor("test_rounds")->instantiate({});
        CompressionPipeline two(makePluginCodec(rounds, tensorFor(10, r, n, 8), 1), comm);
        const std::vector<GroupMember> uneven = {GroupMember{pipes_b[0].get(), g.data(), o.data()},
                                                 GroupMember{&two, g.data(), o.data()}};
        EXPECT_THROW(engine.beginSum(9, uneven, bad), InvalidArgument);
        EXPECT_EQ(pipes_b[0]->stats().payload_bytes, before) << "a member was encoded before the rounds' refusal";
      }
    });
  }
  for (std::size_t i = 0; i < outs[0].size(); ++i) EXPECT_EQ(outs[0][i], outs[1][i]) << "slot " << i;
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(collectives[1][r], collectives[0][r]);
    EXPECT_EQ(collectives[1][r], 3u * 4u);
    EXPECT_EQ(copied[1][r], copied[0][r]);
    EXPECT_EQ(sent[1][r], sent[0][r]);
  }
}

TEST(Engine, MultiRoundMembersFuseRoundByRound) {
  // SUM members with the same rounds share one allreduce a round (engine.h): a group of k costs `rounds` allreduces a
  // step, not k x rounds, and each member's math is its own. Split round by round (SplitSum: beginSum, the test's
  // allreduce of each sum, finishSum until it returns false), the group gives run()'s bits and collectives. test_rounds
  // is exact on integer-valued gradients, so at 3 ranks (where a ring's sum order follows the cut) grouped and alone
  // still agree bit for bit; PowerSGD, with two matrices, a vector and an empty tensor, at 2 ranks (a + b == b + a).
  auto loader = buildTreeLoader();
  struct Case {
    std::string plugin;
    Params params;
    int world;
    std::vector<std::array<int64_t, 2>> shapes;  // {rows, cols}; cols 0: a vector
  };
  const std::vector<Case> cases = {
      {"test_rounds", {}, 3, {{301, 0}, {0, 0}, {77, 0}, {5, 0}}},
      {"powersgd", {{"rank", "2"}}, 2, {{32, 24}, {40, 0}, {0, 0}, {16, 48}}},
  };
  for (const Case& c : cases) {
    auto plugin = loader.loadCompressor(c.plugin)->instantiate(c.params);
    const std::size_t k = c.shapes.size();
    auto infoFor = [&](std::size_t m, int r) {
      const auto [rows, cols] = c.shapes[m];
      TensorInfo t = tensorFor(static_cast<uint64_t>(cols == 0 ? rows : rows * cols), r, c.world, 200 + m);
      if (cols > 0) {
        t.ndim = 2;
        t.shape = {rows, cols, 0, 0};
      }
      return t;
    };
    auto gradFor = [&](std::size_t m, int r, uint64_t numel, uint64_t step) {
      std::vector<float> g(numel);
      for (std::size_t i = 0; i < numel; ++i)
        g[i] = static_cast<float>(static_cast<int>(comm::testing::mix(r * 7 + m * 31 + step * 1000 + i) % 41) - 20);
      return g;
    };
    std::array<std::vector<std::vector<float>>, 3> outs;
    std::array<uint64_t, 3> collectives{};
    for (int grouped = 0; grouped < 3; ++grouped) {
      World world(c.world);
      outs[grouped].assign(static_cast<std::size_t>(c.world) * k, {});
      world.runOk([&](int r, HostCommunicator& comm) {
        std::vector<std::unique_ptr<CompressionPipeline>> pipes;
        for (std::size_t m = 0; m < k; ++m)
          pipes.push_back(std::make_unique<CompressionPipeline>(makePluginCodec(plugin, infoFor(m, r), 1), comm));
        AggregationEngine engine(comm);
        for (uint64_t step = 0; step < 3; ++step) {
          std::vector<std::vector<float>> grads, outputs;
          std::vector<GroupMember> members;
          for (std::size_t m = 0; m < k; ++m) {
            grads.push_back(gradFor(m, r, pipes[m]->codec().info().numel, step));
            outputs.emplace_back(pipes[m]->codec().info().numel, -1.0f);
          }
          for (std::size_t m = 0; m < k; ++m)
            members.push_back(GroupMember{pipes[m].get(), grads[m].data(), outputs[m].data()});
          if (grouped == 2) {
            SplitSum split;
            engine.beginSum(step, members, split);
            std::vector<comm::WireBytes> wires;
            int rounds = 0;
            do {
              wires.clear();
              for (const SplitSum::Sum& x : split.sums)
                wires.push_back(comm.allreduce(x.data.data(), x.data.size() / dtypeSize(x.wire), x.wire,
                                               comm::ReduceOp::kSum, x.tensor));
              ++rounds;
            } while (engine.finishSum(split, wires));
            EXPECT_EQ(rounds, 2) << c.plugin;
          } else if (grouped == 1) {
            engine.run(step, members);
          } else {
            for (const GroupMember& m : members) engine.run(step, *m.pipeline, m.grad, m.out);
          }
          for (std::size_t m = 0; m < k; ++m) outs[grouped][static_cast<std::size_t>(r) * k + m] = outputs[m];
        }
        if (r == 0) collectives[grouped] = engine.collectives();
      });
    }
    for (std::size_t i = 0; i < outs[0].size(); ++i) EXPECT_EQ(outs[0][i], outs[1][i]) << c.plugin << " rank*k+m " << i;
    for (std::size_t i = 0; i < outs[0].size(); ++i) EXPECT_EQ(outs[2][i], outs[1][i]) << c.plugin << " split " << i;
    EXPECT_EQ(collectives[0], 3u * 2u * k) << c.plugin << ": alone, two rounds a member a step";
    EXPECT_EQ(collectives[1], 3u * 2u) << c.plugin << ": grouped, two rounds a step";
    EXPECT_EQ(collectives[2], collectives[1]) << c.plugin << ": split, run()'s collectives";
  }
}

TEST(Engine, GroupOfOneGathersThePayloadAsIsWithoutATable) {
  // What a lone variable-size tensor costs is one size exchange and one allgatherv of the bare payloads: the same
  // frames and bytes as those two collectives called by hand with this rank's payload.
  const int n = 3;
  const uint64_t numel = 500;
  auto sparse = std::make_shared<SparseFake>(false);
  World engine_world(n), hand_world(n);
  std::vector<comm::WireBytes> via_engine(n), by_hand(n);
  engine_world.runOk([&](int r, HostCommunicator& comm) {
    CompressionPipeline pipe(makePluginCodec(sparse, tensorFor(numel, r, n), 1), comm);
    AggregationEngine engine(comm);
    const std::vector<float> g = gradOf(r, numel, 0);
    std::vector<float> out(numel);
    engine.run(0, pipe, g.data(), out.data());
    via_engine[static_cast<std::size_t>(r)] = pipe.stats().wire;
  });
  hand_world.runOk([&](int r, HostCommunicator& comm) {
    auto codec = makePluginCodec(sparse, tensorFor(numel, r, n), 1);
    std::vector<std::byte> payload(codec->sizes(0).max_output_bytes);
    const std::vector<float> g = gradOf(r, numel, 0);
    payload.resize(codec->encode(0, 0, g.data(), {}, payload));
    std::vector<uint64_t> sizes(n);
    comm::WireBytes w = comm.allgatherSizes(payload.size(), sizes, 17);
    uint64_t total = 0;
    for (uint64_t s : sizes) total += s;
    std::vector<std::byte> all(total);
    w += comm.allgatherv(payload, all, sizes, 17);
    by_hand[static_cast<std::size_t>(r)] = w;
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(via_engine[static_cast<std::size_t>(r)], by_hand[static_cast<std::size_t>(r)]) << r;
}

TEST(Engine, NullOutputIsRefusedBeforeAnyFrame) {
  World world(2);
  auto loader = buildTreeLoader();
  auto lossy = loader.loadCompressor("test_lossy")->instantiate({});
  world.runOk([&](int r, HostCommunicator& comm) {
    CompressionPipeline pipe(makePluginCodec(lossy, tensorFor(10, r, 2), 1), comm);
    AggregationEngine engine(comm);
    const std::vector<float> g(10, 1.0f);
    EXPECT_THROW(engine.run(0, pipe, g.data(), nullptr), InvalidArgument);
    EXPECT_THROW(engine.run(0, std::span<const GroupMember>(std::vector<GroupMember>{{nullptr, g.data(), nullptr}})),
                 InvalidArgument);
  });
  EXPECT_EQ(world.fabric->traffic()[0].sent.total().frames, 0u);
}

TEST(Pipeline, DeviceTensorNeedsADeviceCommunicator) {
  World world(1);
  try {
    CompressionPipeline pipe(std::make_unique<DevicePlacedCodec>(), *world.comms[0]);
    FAIL() << "a CUDA tensor was accepted by a host communicator";
  } catch (const Unsupported& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a CUDA tensor needs a communicator on device memory"), std::string::npos) << what;
    EXPECT_NE(what.find("works on host memory"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace terse
