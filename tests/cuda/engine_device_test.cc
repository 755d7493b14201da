// The engine's deferred payload verdicts on a device (core/compress/engine.h, "Payload checks"; label cuda, skips
// without a GPU): an NCCL communicator of world size 1, built-in plugins on its stream, fused groups of ALLGATHER
// (top-k, threshold) and SUM (fp16) tensors with an empty one among them. Each group decodes bit for bit as the same
// group whose codecs hide their deferral (every decode then synchronizes for its own verdict, as before the entry
// point). A payload corrupted on the device between its encode and the collective is refused by the engine -- the
// word read once for the run, then the payload decoded the ordinary way for the plugin's own message -- and the same
// engine's next step runs clean. Error feedback's own decode, deferred too, keeps the residual of a refused step.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/nccl_communicator.h"
#include "core/comm/store.h"
#include "core/common/cuda.h"
#include "core/common/device_buffer.h"
#include "core/compress/ef21.h"
#include "core/compress/engine.h"
#include "core/compress/error_feedback.h"
#include "core/compress/make_codec.h"
#include "core/compress/pipeline.h"
#include "core/plugin/loader.h"
#include "terse/sdk/half.hpp"
#include "tests/compress/fake_compressors.h"

namespace terse {
namespace {

// Forwards to a plugin's codec; `defers` false hides its deferred decode (the ordinary path), and at `corrupt_step` it
// flips one byte of the payload its encode wrote (on the device, before the collective).
class Tamper final : public TensorCodec {
 public:
  Tamper(std::unique_ptr<TensorCodec> inner, bool defers, uint64_t corrupt_step)
      : inner_(std::move(inner)), defers_(defers), corrupt_step_(corrupt_step) {}
  const CompressorCaps& caps() const override { return inner_->caps(); }
  const TensorInfo& info() const override { return inner_->info(); }
  std::span<const CompressorSizes> roundSizes() const override { return inner_->roundSizes(); }
  Placement placement() const override { return inner_->placement(); }
  uint64_t encode(uint64_t step, int round, const void* grad, std::span<const std::byte> prev,
                  std::span<std::byte> out) override {
    const uint64_t bytes = inner_->encode(step, round, grad, prev, out);
    if (step == corrupt_step_ && bytes > 0) {
      const cudaStream_t s = static_cast<cudaStream_t>(placement().stream);
      std::byte b{};
      TERSE_CUDA_CHECK(cudaMemcpyAsync(&b, out.data(), 1, cudaMemcpyDeviceToHost, s));
      TERSE_CUDA_CHECK(cudaStreamSynchronize(s));
      b ^= std::byte{0x01};  // the payload's first header byte: every plugin's check refuses it
      TERSE_CUDA_CHECK(cudaMemcpyAsync(out.data(), &b, 1, cudaMemcpyHostToDevice, s));
      TERSE_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    return bytes;
  }
  void decode(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out, bool accumulate) override {
    inner_->decode(step, payload, source_rank, out, accumulate);
  }
  bool defersVerdicts() const override { return defers_ && inner_->defersVerdicts(); }
  void decodeDeferred(uint64_t step, std::span<const std::byte> payload, int source_rank, void* out, bool accumulate,
                      uint32_t* verdict) override {
    inner_->decodeDeferred(step, payload, source_rank, out, accumulate, verdict);
  }
  using TensorCodec::reduce;
  uint64_t reduce(uint64_t step, int round, std::span<const std::byte> a, std::span<const std::byte> b,
                  std::span<std::byte> out) override {
    return inner_->reduce(step, round, a, b, out);
  }

 private:
  std::unique_ptr<TensorCodec> inner_;
  bool defers_;
  uint64_t corrupt_step_;
};

constexpr uint64_t kNever = ~uint64_t{0};

class EngineOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::DeviceSummary summary = cuda::deviceSummary();
    if (summary.count == 0) GTEST_SKIP() << "no CUDA device: " << summary.reason;
    TERSE_CUDA_CHECK(cudaGetDevice(&device_));
    comm::NcclOptions o;
    o.store_prefix = "engine/";
    comm_ = comm::connectNcclCommunicator(o, store_);
  }

  // A flat tensor of rank 0 of 1 on the test's device.
  TensorInfo deviceTensor(uint64_t numel, uint64_t id) const {
    TensorInfo t = testing::flatTensor(numel, DType::kF32, 0, 1, id);
    t.device = TERSE_DEVICE_CUDA;
    t.device_index = device_;
    return t;
  }

  // One group of tensors over `compressor` with error feedback, on the device; `rows`, where given, make member m a
  // rows[m] x (numels[m] / rows[m]) matrix (PowerSGD's), else it is flat.
  std::vector<std::unique_ptr<CompressionPipeline>> efGroup(const std::string& compressor, const Params& params,
                                                            const std::vector<uint64_t>& numels,
                                                            const std::vector<uint64_t>& rows = {},
                                                            CodecOptions o = CodecOptions{.error_feedback = true}) {
    auto loader = PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
    auto instance = loader.loadCompressor(compressor)->instantiate(params);
    std::vector<std::unique_ptr<CompressionPipeline>> pipes;
    for (std::size_t m = 0; m < numels.size(); ++m) {
      TensorInfo t = deviceTensor(numels[m], 300 + m);
      if (m < rows.size() && rows[m] > 0) {
        t.ndim = 2;
        t.shape = {static_cast<int64_t>(rows[m]), static_cast<int64_t>(numels[m] / rows[m]), 0, 0};
      }
      pipes.push_back(
          std::make_unique<CompressionPipeline>(makeCodec(instance, t, 3, o, comm_->deviceStream()), *comm_));
    }
    return pipes;
  }
  // A residual on the host.
  std::vector<float> residualOf(CompressionPipeline& p) {
    const auto* ef = dynamic_cast<const ErrorFeedback*>(&p.codec());
    EXPECT_NE(ef, nullptr);
    std::vector<float> out(ef->residual().size());
    const auto s = static_cast<cudaStream_t>(comm_->deviceStream());
    if (!out.empty())
      TERSE_CUDA_CHECK(
          cudaMemcpyAsync(out.data(), ef->residual().data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    TERSE_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
  }
  // A device buffer of floats on the host.
  std::vector<float> hostCopy(std::span<const float> device) {
    std::vector<float> out(device.size());
    const auto s = static_cast<cudaStream_t>(comm_->deviceStream());
    if (!out.empty())
      TERSE_CUDA_CHECK(
          cudaMemcpyAsync(out.data(), device.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    TERSE_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
  }
  // One step of a group whose gradients are device copies of `grads`; returns the outputs on the host.
  std::vector<std::vector<float>> efStep(AggregationEngine& engine,
                                         std::vector<std::unique_ptr<CompressionPipeline>>& pipes,
                                         const std::vector<std::vector<float>>& grads, uint64_t step) {
    const auto s = static_cast<cudaStream_t>(comm_->deviceStream());
    std::vector<std::unique_ptr<cuda::DeviceBuffer>> in, out;
    std::vector<GroupMember> members;
    for (std::size_t m = 0; m < pipes.size(); ++m) {
      const std::size_t bytes = grads[m].size() * sizeof(float);
      in.push_back(std::make_unique<cuda::DeviceBuffer>(bytes, s));
      out.push_back(std::make_unique<cuda::DeviceBuffer>(bytes, s));
      if (bytes > 0) in.back()->copyFromHost(grads[m].data(), bytes, s);
      members.push_back(GroupMember{pipes[m].get(), in.back()->data(), out.back()->data()});
    }
    engine.run(step, members);
    std::vector<std::vector<float>> outs;
    for (std::size_t m = 0; m < pipes.size(); ++m) {
      outs.emplace_back(grads[m].size());
      if (!outs.back().empty()) out[m]->copyToHost(outs.back().data(), outs.back().size() * sizeof(float), s);
    }
    TERSE_CUDA_CHECK(cudaStreamSynchronize(s));
    return outs;
  }

  // One group of `numels` tensors over `compressor`, its member `corrupt` tampered with at `corrupt_step`.
  struct Group {
    std::vector<std::unique_ptr<CompressionPipeline>> pipes;
    std::vector<std::unique_ptr<cuda::DeviceBuffer>> grads, outs;
  };
  Group makeGroup(const std::string& compressor, const Params& params, const std::vector<uint64_t>& numels, bool defers,
                  std::size_t corrupt, uint64_t corrupt_step) {
    auto loader = PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
    auto instance = loader.loadCompressor(compressor)->instantiate(params);
    Group g;
    void* const stream = comm_->deviceStream();
    for (std::size_t m = 0; m < numels.size(); ++m) {
      const TensorInfo t = deviceTensor(numels[m], 200 + m);
      auto codec = std::make_unique<Tamper>(makePluginCodec(instance, t, 3, stream), defers,
                                            m == corrupt ? corrupt_step : kNever);
      g.pipes.push_back(std::make_unique<CompressionPipeline>(std::move(codec), *comm_));
      const std::size_t bytes = numels[m] * sizeof(float);
      g.grads.push_back(std::make_unique<cuda::DeviceBuffer>(bytes, static_cast<cudaStream_t>(stream)));
      g.outs.push_back(std::make_unique<cuda::DeviceBuffer>(bytes, static_cast<cudaStream_t>(stream)));
    }
    return g;
  }
  // One step of the group, each member a group of its own; returns the members' outputs on the host.
  std::vector<std::vector<float>> stepAlone(AggregationEngine& engine, Group& g, uint64_t step) {
    return this->step(engine, g, step, false);
  }
  // The group's members with this step's gradients on the device.
  std::vector<GroupMember> membersOf(Group& g, uint64_t step) {
    const auto s = static_cast<cudaStream_t>(comm_->deviceStream());
    std::vector<GroupMember> members;
    for (std::size_t m = 0; m < g.pipes.size(); ++m) {
      const uint64_t n = g.pipes[m]->codec().info().numel;
      std::vector<float> x(n);
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>((i * 37 + m * 11 + step * 5) % 101) * 0.01f - 0.5f;
      if (n > 0) g.grads[m]->copyFromHost(x.data(), n * sizeof(float), s);
      members.push_back(GroupMember{g.pipes[m].get(), g.grads[m]->data(), g.outs[m]->data()});
    }
    return members;
  }
  // The members' outputs on the host.
  std::vector<std::vector<float>> outputsOf(Group& g) {
    const auto s = static_cast<cudaStream_t>(comm_->deviceStream());
    std::vector<std::vector<float>> outs;
    for (std::size_t m = 0; m < g.pipes.size(); ++m) {
      outs.emplace_back(g.pipes[m]->codec().info().numel);
      if (!outs.back().empty()) g.outs[m]->copyToHost(outs.back().data(), outs.back().size() * sizeof(float), s);
    }
    TERSE_CUDA_CHECK(cudaStreamSynchronize(s));
    return outs;
  }
  // One step of the group, fused (or member by member); returns the members' outputs on the host.
  std::vector<std::vector<float>> step(AggregationEngine& engine, Group& g, uint64_t step, bool fused = true) {
    const std::vector<GroupMember> members = membersOf(g, step);
    if (fused) {
      engine.run(step, members);
    } else {
      for (const GroupMember& m : members) engine.run(step, *m.pipeline, m.grad, m.out);
    }
    return outputsOf(g);
  }

  comm::MemoryStore store_;
  std::unique_ptr<comm::NcclCommunicator> comm_;
  int device_ = 0;
};

struct Way {
  const char* compressor;
  Params params;
};

const std::vector<Way> kWays = {{"topk", {{"ratio", "0.05"}}}, {"threshold", {{"tau", "0.5"}}}, {"fp16", {}}};
// Odd sizes, an empty tensor, one past the sparsifiers' one-block cut (terse/kit/one_block.hpp).
const std::vector<uint64_t> kNumels = {1000, 0, 70001, 7};

TEST_F(EngineOnDevice, DeferredVerdictsDecodeAsTheOrdinaryPath) {
  for (const Way& w : kWays) {
    SCOPED_TRACE(w.compressor);
    Group deferred = makeGroup(w.compressor, w.params, kNumels, true, 0, kNever);
    Group ordinary = makeGroup(w.compressor, w.params, kNumels, false, 0, kNever);
    ASSERT_TRUE(deferred.pipes[0]->defersVerdicts()) << "the built-in does not export the deferred entry point";
    ASSERT_FALSE(ordinary.pipes[0]->defersVerdicts());
    AggregationEngine a(*comm_), b(*comm_);
    for (uint64_t s = 0; s < 3; ++s) EXPECT_EQ(step(a, deferred, s), step(b, ordinary, s)) << "step " << s;
  }
}

// A fused group concatenates its members' bodies (SUM) or payloads (ALLGATHER) on the device, the small ones in one
// batched launch (engine.cc, addCopy) and the larger with cudaMemcpyAsync: at world 1 every member's result must be
// what it gives run alone (no concatenation at all), bit for bit, for fp16 (SUM) and top-k (ALLGATHER), over small and
// large members, an empty one among them.
TEST_F(EngineOnDevice, AFusedGroupEqualsItsMembersRunAlone) {
  const std::vector<uint64_t> numels = {7, 1000, 0, 70001, 33, 40000};
  for (const Way& w : {Way{"fp16", {}}, Way{"topk", {{"ratio", "0.05"}}}}) {
    SCOPED_TRACE(w.compressor);
    Group fused = makeGroup(w.compressor, w.params, numels, true, 0, kNever);
    Group alone = makeGroup(w.compressor, w.params, numels, true, 0, kNever);
    AggregationEngine a(*comm_), b(*comm_);
    for (uint64_t s = 0; s < 2; ++s) {
      const std::vector<std::vector<float>> want = stepAlone(b, alone, s);
      EXPECT_EQ(step(a, fused, s), want) << "step " << s;
    }
  }
}

// The SUM half of the test above cannot see a copy that does nothing at world 1 (the bodies are summed with nothing),
// so a split sum stands in for a second rank: beginSum lays out the concatenation (the batched copies in), the test
// doubles every summed fp16 element on the host as a peer with the same gradient would, and finishSum copies the sums
// back and decodes. Every output must be exactly twice the member's own round trip.
TEST_F(EngineOnDevice, ASplitSumCarriesEveryBodyThroughTheConcatenation) {
  const std::vector<uint64_t> numels = {7, 1000, 0, 70001, 33, 3001};
  Group fused = makeGroup("fp16", {}, numels, true, 0, kNever);
  Group alone = makeGroup("fp16", {}, numels, true, 0, kNever);
  AggregationEngine a(*comm_), b(*comm_);
  const std::vector<std::vector<float>> once = stepAlone(b, alone, 0);
  SplitSum split;
  a.beginSum(0, membersOf(fused, 0), split);
  ASSERT_EQ(split.sums.size(), 1u) << "every member fused into one sum";
  const auto s = static_cast<cudaStream_t>(comm_->deviceStream());
  for (const SplitSum::Sum& sum : split.sums) {
    ASSERT_EQ(sum.wire, DType::kF16);
    std::vector<uint16_t> h(sum.data.size() / 2);
    TERSE_CUDA_CHECK(cudaMemcpyAsync(h.data(), sum.data.data(), sum.data.size(), cudaMemcpyDeviceToHost, s));
    TERSE_CUDA_CHECK(cudaStreamSynchronize(s));
    for (uint16_t& v : h) v = sdk::floatToHalf(2.0f * sdk::halfToFloat(v));
    TERSE_CUDA_CHECK(cudaMemcpyAsync(sum.data.data(), h.data(), sum.data.size(), cudaMemcpyHostToDevice, s));
  }
  const std::vector<comm::WireBytes> wires(split.sums.size());
  EXPECT_FALSE(a.finishSum(split, wires));
  const std::vector<std::vector<float>> twice = outputsOf(fused);
  ASSERT_EQ(twice.size(), once.size());
  for (std::size_t m = 0; m < once.size(); ++m) {
    std::vector<float> want = once[m];
    for (float& v : want) v *= 2.0f;
    EXPECT_EQ(twice[m], want) << "member " << m;
  }
}

TEST_F(EngineOnDevice, ACorruptedPayloadIsRefusedWithThePluginsMessageAndTheNextStepRunsClean) {
  for (const Way& w : kWays) {
    SCOPED_TRACE(w.compressor);
    // Member 2 (70,001 elements: the grid-wide decodes) is corrupted at step 1.
    Group tampered = makeGroup(w.compressor, w.params, kNumels, true, 2, 1);
    Group twin = makeGroup(w.compressor, w.params, kNumels, true, 0, kNever);
    AggregationEngine engine(*comm_), clean(*comm_);
    step(engine, tampered, 0);
    try {
      step(engine, tampered, 1);
      ADD_FAILURE() << "the corrupted payload was accepted";
    } catch (const InvalidPayload& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + w.compressor + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("decompress"), std::string::npos) << what;
    }
    EXPECT_EQ(step(engine, tampered, 2), step(clean, twin, 2));
  }
}

// The DDP hook's chained path on CUDA (ddp_aggregator.h): split sums finished with Settle::kLater leave their payload
// checks on the device, and settleSums reads those of a step's splits with one synchronization. Two fp16 splits (SUM,
// world 1: nothing to sum), one of them tampered with at step 1 in its third member, which sums alone (so its words
// sit past the first run's), finished in the other order than begun: a clean step decodes as run() does once
// settled, both splits; at step 1 both finishes return, the verdicts still pending, and the refusal comes from
// settleSums with the plugin's message, both splits read (the faulty one first); step 2 runs clean.
TEST_F(EngineOnDevice, SplitSumsSettledTogetherRefuseAtTheSettle) {
  Group tampered = makeGroup("fp16", {}, kNumels, true, 2, 1);
  Group other = makeGroup("fp16", {}, kNumels, true, 0, kNever);
  Group twin = makeGroup("fp16", {}, kNumels, true, 0, kNever);
  AggregationEngine engine(*comm_), clean(*comm_);
  engine.sumInPlaceFrom(70001 * 2);  // member 2's fp16 body: runs {0, 1}, {2}, {3}
  clean.sumInPlaceFrom(70001 * 2);
  SplitSum a, b;
  for (uint64_t s = 0; s < 3; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    engine.beginSum(s, membersOf(tampered, s), a);
    engine.beginSum(s, membersOf(other, s), b);
    ASSERT_EQ(a.sums.size(), 3u) << "runs {0, 1}, {2}, {3}";
    const std::vector<comm::WireBytes> wa(a.sums.size()), wb(b.sums.size());
    EXPECT_FALSE(engine.finishSum(b, wb, AggregationEngine::Settle::kLater));
    EXPECT_FALSE(engine.finishSum(a, wa, AggregationEngine::Settle::kLater));
    EXPECT_TRUE(a.verdictsPending());
    EXPECT_TRUE(b.verdictsPending());
    const std::array<SplitSum*, 2> both{&a, &b};
    if (s == 1) {
      try {
        engine.settleSums(both);
        ADD_FAILURE() << "the corrupted payload was accepted";
      } catch (const InvalidPayload& e) {
        EXPECT_NE(std::string(e.what()).find("'fp16'"), std::string::npos) << e.what();
      }
      EXPECT_FALSE(a.verdictsPending() || b.verdictsPending()) << "a split's words were left unread";
      continue;
    }
    engine.settleSums(both);
    EXPECT_FALSE(a.verdictsPending() || b.verdictsPending());
    const std::vector<std::vector<float>> want = step(clean, twin, s);
    EXPECT_EQ(outputsOf(tampered), want);
    EXPECT_EQ(outputsOf(other), want);
  }
}

std::vector<std::vector<float>> efGrads(const std::vector<uint64_t>& numels, uint64_t step) {
  std::vector<std::vector<float>> g;
  for (std::size_t m = 0; m < numels.size(); ++m) {
    g.emplace_back(numels[m]);
    for (std::size_t i = 0; i < g[m].size(); ++i)
      g[m][i] = static_cast<float>((i * 29 + m * 3 + step * 7) % 97) * 0.02f - 0.9f;
  }
  return g;
}

// Error feedback's own decode (D(C(p))) on a device with a plugin that validates its own payloads (top-k, qsgd):
// deferred, its residual update waits for the verdict on the device. Three clean steps give the same outputs and
// residuals as with deferral off (every own decode synchronizing), bit for bit; a NaN gradient fails the step with the
// plugin's message and leaves that tensor's residual as it was, and the next clean step runs.
TEST_F(EngineOnDevice, ErrorFeedbacksOwnDecodeWaitsOnTheDeviceAndARefusalKeepsTheResidual) {
  const std::vector<uint64_t> numels = {1000, 0, 70001, 7};
  for (const Way& w : {Way{"topk", {{"ratio", "0.05"}}}, Way{"qsgd", {}}}) {
    SCOPED_TRACE(w.compressor);
    auto deferred = efGroup(w.compressor, w.params, numels);
    auto waiting = efGroup(w.compressor, w.params, numels);
    AggregationEngine a(*comm_), b(*comm_);
    b.deferVerdicts(false);
    for (uint64_t s = 0; s < 3; ++s) {
      EXPECT_EQ(efStep(a, deferred, efGrads(numels, s), s), efStep(b, waiting, efGrads(numels, s), s)) << "step " << s;
      for (std::size_t m = 0; m < numels.size(); ++m) EXPECT_EQ(residualOf(*deferred[m]), residualOf(*waiting[m]));
    }
    const std::vector<float> before = residualOf(*deferred[2]);
    std::vector<std::vector<float>> bad = efGrads(numels, 3);
    bad[2][12345] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW(efStep(a, deferred, bad, 3), InvalidPayload);
    EXPECT_EQ(residualOf(*deferred[2]), before) << "a refused own payload changed the residual";
    EXPECT_NO_THROW(efStep(a, deferred, efGrads(numels, 4), 4));
  }
}

// EF21 on the device (core/compress/ef21.h, its kernels in device_kernels.cu): at world 1 the aggregate is the rank's
// own payload, so every step's outputs, estimates and sums equal EF21's run on the host with the same plugin, bit for
// bit, deferred or not, plain and with EF21-SGDM's momentum (ALLGATHER top-k and qsgd, SUM f32 random-k). A NaN
// gradient's refused own payload fails the step with the estimates, the momentum and their sum as they were (the
// commit kernel reads the own word and the decodes' words), and the next step runs.
TEST_F(EngineOnDevice, Ef21OnTheDeviceEqualsTheHostAndARefusalKeepsItsState) {
  const std::vector<uint64_t> numels = {1000, 0, 70001, 7};
  auto loader = PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
  for (const double eta : {1.0, 0.5}) {
    for (const Way& w : {Way{"topk", {{"ratio", "0.05"}}}, Way{"qsgd", {}}, Way{"randomk", {{"ratio", "0.05"}}}}) {
      SCOPED_TRACE(std::string(w.compressor) + " eta " + std::to_string(eta));
      const CodecOptions o{
          .error_feedback = true, .error_feedback_rule = ErrorFeedbackRule::kEf21, .ef21_momentum = eta};
      auto deferred = efGroup(w.compressor, w.params, numels, {}, o);
      auto waiting = efGroup(w.compressor, w.params, numels, {}, o);
      auto instance = loader.loadCompressor(w.compressor)->instantiate(w.params);
      std::vector<std::unique_ptr<TensorCodec>> host;
      for (std::size_t m = 0; m < numels.size(); ++m)
        host.push_back(makeCodec(instance, testing::flatTensor(numels[m], DType::kF32, 0, 1, 300 + m), 3, o));
      const auto ef21 = [](CompressionPipeline& p) -> const Ef21& { return dynamic_cast<const Ef21&>(p.codec()); };
      AggregationEngine a(*comm_), b(*comm_);
      b.deferVerdicts(false);
      for (uint64_t s = 0; s < 3; ++s) {
        const std::vector<std::vector<float>> grads = efGrads(numels, s);
        const std::vector<std::vector<float>> out = efStep(a, deferred, grads, s);
        EXPECT_EQ(out, efStep(b, waiting, grads, s)) << "step " << s;
        for (std::size_t m = 0; m < numels.size(); ++m) {
          TensorCodec& c = *host[m];
          std::vector<std::byte> payload(c.sizes(0).max_output_bytes);
          const uint64_t bytes = c.encode(s, 0, grads[m].data(), {}, payload);
          const bool sum = c.caps().aggregation == Aggregation::kSum;
          std::vector<float> expected(numels[m], 0.0f);
          c.decode(s, std::span<const std::byte>(payload).first(bytes), sum ? -1 : 0, expected.data(), !sum);
          c.aggregated(s, expected.data(), nullptr, 0);
          EXPECT_EQ(out[m], expected) << "step " << s << " member " << m;
          const auto& h = dynamic_cast<const Ef21&>(c);
          EXPECT_EQ(hostCopy(ef21(*deferred[m]).estimate()),
                    std::vector<float>(h.estimate().begin(), h.estimate().end()));
          EXPECT_EQ(hostCopy(ef21(*deferred[m]).estimateSum()),
                    std::vector<float>(h.estimateSum().begin(), h.estimateSum().end()));
        }
      }
      if (std::string(w.compressor) == "randomk") continue;  // top-k's and qsgd's own payloads refuse a NaN
      const std::vector<float> estimate = hostCopy(ef21(*deferred[2]).estimate());
      const std::vector<float> sum = hostCopy(ef21(*deferred[2]).estimateSum());
      const std::vector<float> momentum = hostCopy(ef21(*deferred[2]).momentum());
      std::vector<std::vector<float>> bad = efGrads(numels, 3);
      bad[2][12345] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_THROW(efStep(a, deferred, bad, 3), InvalidPayload);
      EXPECT_EQ(hostCopy(ef21(*deferred[2]).estimate()), estimate) << "a refused own payload moved the estimate";
      EXPECT_EQ(hostCopy(ef21(*deferred[2]).estimateSum()), sum) << "a refused step moved the sum";
      EXPECT_EQ(hostCopy(ef21(*deferred[2]).momentum()), momentum) << "a refused step moved the momentum";
      EXPECT_NO_THROW(efStep(a, deferred, efGrads(numels, 4), 4));
    }
  }
}

// PowerSGD's round 1 on a device leaves its check of prev (the summed P) in a word of the run (compress_deferred,
// terse/device_verdict_v1.h), read with the run's decode words: no synchronization a tensor in that round. With error
// feedback, over matrices of odd shapes and a vector (passed through) and an empty tensor, three clean steps give the
// outputs and residuals that deferral off gives (every check waiting), bit for bit. A NaN in one gradient makes its
// summed P non-finite: the step fails with the plugin's message about P -- the check of prev is the word explained,
// not the decodes it makes refuse -- and that tensor's residual is as it was; the next step runs.
TEST_F(EngineOnDevice, PowerSgdsCheckOfPrevIsReadWithTheRunAndARefusalNamesP) {
  const std::vector<uint64_t> numels = {33 * 31, 0, 300 * 257, 7};
  const std::vector<uint64_t> rows = {33, 0, 300, 0};
  const Params params = {{"rank", "2"}};
  auto deferred = efGroup("powersgd", params, numels, rows);
  auto waiting = efGroup("powersgd", params, numels, rows);
  ASSERT_TRUE(deferred[0]->defersPrevVerdicts()) << "the built-in does not export the deferred compress";
  AggregationEngine a(*comm_), b(*comm_);
  b.deferVerdicts(false);
  for (uint64_t s = 0; s < 3; ++s) {
    EXPECT_EQ(efStep(a, deferred, efGrads(numels, s), s), efStep(b, waiting, efGrads(numels, s), s)) << "step " << s;
    for (std::size_t m = 0; m < numels.size(); ++m) EXPECT_EQ(residualOf(*deferred[m]), residualOf(*waiting[m]));
  }
  const std::vector<float> before = residualOf(*deferred[0]);
  std::vector<std::vector<float>> bad = efGrads(numels, 3);
  bad[0][40] = std::numeric_limits<float>::quiet_NaN();
  try {
    efStep(a, deferred, bad, 3);
    ADD_FAILURE() << "a non-finite P was accepted";
  } catch (const InvalidPayload& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("non-finite"), std::string::npos) << what;
    EXPECT_NE(what.find("'powersgd'"), std::string::npos) << what;
  }
  EXPECT_EQ(residualOf(*deferred[0]), before) << "a refused prev changed the residual";
  EXPECT_NO_THROW(efStep(a, deferred, efGrads(numels, 4), 4));
}

}  // namespace
}  // namespace terse
