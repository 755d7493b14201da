// Deferred payload verdicts (terse/device_verdict_v1.h, engine.h "Payload checks"), on the host where they can run
// here: an in-test compressor whose decompressDeferred leaves a refusal in the engine's word instead of throwing, three
// ranks on threads, SUM and ALLGATHER, fused groups and members alone, an empty tensor among them. Clean runs must
// decode as the ordinary path does; a raised word must fail every rank with the compressor's own message for the
// right payload, and the next step must run clean; a word that the ordinary decode does not explain names the plugin
// as broken. The real plugins' side: an SDK-built plugin exports the entry point (and on the host refuses at once), a
// C plugin without it does not defer.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/compress/engine.h"
#include "core/compress/make_codec.h"
#include "core/compress/pipeline.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/loader.h"
#include "tests/comm/comm_test_util.h"
#include "tests/compress/fake_compressors.h"

// A namespace of its own: unity builds compile this file with engine_test.cc, which has helpers of the same names.
namespace terse::deferred_verdict_test {
namespace {

using comm::HostCommunicator;
using comm::testing::World;
using terse::testing::FakeCompressor;
using terse::testing::FakeHeader;
using terse::testing::flatTensor;
using terse::testing::floatsOf;
using terse::testing::kFakeHeaderBytes;
using terse::testing::payloadBytes;

// The tensor and step whose payload one rank plants a fault in.
struct Fault {
  int rank = -1;
  uint64_t tensor = 0;
  uint64_t step = 0;
};

// Fixed size, header + the gradient's floats, SUM (the header stays home, the body is summed) or ALLGATHER. The
// planted fault is what crosses the network in each: a bad magic in a gathered payload, a NaN in a summed body (every
// rank's aggregate gets it). The check refuses both, naming the tensor and whose payload it was. With `defers`,
// decompressDeferred leaves the refusal in the word and counts its calls; with `disagree`, the ordinary decompress
// checks nothing (a broken plugin whose two entry points disagree).
class VerdictFake final : public FakeCompressor {
 public:
  static constexpr uint32_t kMagic = 0x56455244;
  VerdictFake(Aggregation aggregation, bool defers, bool disagree, Fault fault)
      : FakeCompressor("verdict_fake"),
        aggregation_(aggregation),
        defers_(defers),
        disagree_(disagree),
        fault_(fault) {}

  CompressorCaps makeCaps(DType) const override {
    CompressorCaps c;
    c.devices = TERSE_DEVICE_HOST;
    c.aggregation = aggregation_;
    c.fixed_size = true;
    c.wire_dtype = DType::kF32;
    return c;
  }
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = payloadBytes(info.numel);
    s.sum_header_bytes = aggregation_ == Aggregation::kSum ? kFakeHeaderBytes : 0;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch&,
                    std::span<std::byte> out, void*) const override {
    std::vector<float> values = floatsOf(input, info.numel);
    uint32_t magic = kMagic;
    if (info.rank == fault_.rank && info.tensor_id == fault_.tensor && info.step == fault_.step) {
      if (aggregation_ == Aggregation::kSum) {
        values.at(values.size() - 1) = std::numeric_limits<float>::quiet_NaN();
      } else {
        magic = ~kMagic;
      }
    }
    return writePayload(magic, 0, values, out);
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    if (!disagree_) {
      const std::string fault = check(info, payload);
      TERSE_CHECK(fault.empty(), InvalidPayload, fault);
    }
    writeOut(payload, info.numel, out, accumulate);
  }
  void decompressDeferred(const TensorInfo& info, const CompressorSizes&, std::span<const std::byte> payload,
                          const Scratch&, void* out, bool accumulate, uint32_t* verdict, void*) const override {
    ++deferred_calls;
    if (!check(info, payload).empty()) {
      ++raised_words;
      *verdict = 1;  // as a device check leaves it: nothing written, nothing thrown
      return;
    }
    writeOut(payload, info.numel, out, accumulate);
  }
  bool defersVerdicts() const override { return defers_; }

  mutable std::atomic<uint64_t> deferred_calls{0};
  mutable std::atomic<uint64_t> raised_words{0};

 private:
  static std::string whose(const TensorInfo& info) {
    return info.source_rank < 0 ? std::string("the aggregate") : "rank " + std::to_string(info.source_rank) + "'s";
  }
  // Empty when the payload is clean, else what is wrong with it.
  static std::string check(const TensorInfo& info, std::span<const std::byte> payload) {
    const std::string who = "verdict_fake: tensor " + std::to_string(info.tensor_id) + ": " + whose(info) + " payload";
    if (payload.size() != payloadBytes(info.numel)) return who + " has " + std::to_string(payload.size()) + " bytes";
    FakeHeader h{};
    std::memcpy(&h, payload.data(), sizeof h);
    if (h.magic != kMagic || h.numel != info.numel) return who + " has a bad header";
    for (uint64_t i = 0; i < info.numel; ++i) {
      float v;
      std::memcpy(&v, payload.data() + kFakeHeaderBytes + i * sizeof(float), sizeof v);
      if (!std::isfinite(v)) return who + " has a non-finite value at " + std::to_string(i);
    }
    return {};
  }

  Aggregation aggregation_;
  bool defers_;
  bool disagree_;
  Fault fault_;
};

constexpr int kWorld = 3;
// Tensor ids 100 + m, an empty tensor and an odd size among them. The fault goes into tensor 101 (76 elements), at its
// last value, neither the first nor the last member of a fused group. The sizes keep every payload of the host's fused
// SUM at the ABI's 16-byte alignment in the concatenation (300 and 76 floats: 1,200 and 304 bytes), so each is decoded
// where it was summed, and the empty member after the faulty one writes its header over the faulty payload's last 16
// bytes, the NaN among them: its word must be read before that (engine.cc, decodeSummed).
const std::vector<uint64_t> kNumels = {300, 76, 0, 5};
constexpr uint64_t kFaultTensor = 101;

float gradValue(int rank, std::size_t m, std::size_t i, uint64_t step) {
  return static_cast<float>(rank + 1) * 0.25f + static_cast<float>(m) - static_cast<float>(i % 13) * 0.125f +
         static_cast<float>(step) * 0.5f;
}

// Every rank's pipelines and engine over one world, kept across world.run calls so that a failed step can be followed
// by a clean one on the same engine.
struct Ranks {
  World world{kWorld};
  std::vector<std::vector<std::unique_ptr<CompressionPipeline>>> pipes;
  std::vector<std::unique_ptr<AggregationEngine>> engines;
  explicit Ranks(const std::shared_ptr<Compressor>& codec) {
    for (int r = 0; r < kWorld; ++r) {
      HostCommunicator& comm = *world.comms[static_cast<std::size_t>(r)];
      pipes.emplace_back();
      for (std::size_t m = 0; m < kNumels.size(); ++m)
        pipes.back().push_back(std::make_unique<CompressionPipeline>(
            makePluginCodec(codec, flatTensor(kNumels[m], DType::kF32, r, kWorld, 100 + m), 1), comm));
      engines.push_back(std::make_unique<AggregationEngine>(comm));
    }
  }
  // One step on rank r, fused or member by member; returns the outputs.
  std::vector<std::vector<float>> step(int r, uint64_t step, bool fused) {
    std::vector<std::vector<float>> grads, outs;
    std::vector<GroupMember> members;
    for (std::size_t m = 0; m < kNumels.size(); ++m) {
      grads.emplace_back(kNumels[m]);
      for (std::size_t i = 0; i < grads[m].size(); ++i) grads[m][i] = gradValue(r, m, i, step);
      outs.emplace_back(kNumels[m], -7.0f);
    }
    for (std::size_t m = 0; m < kNumels.size(); ++m)
      members.push_back(GroupMember{pipes[static_cast<std::size_t>(r)][m].get(), grads[m].data(), outs[m].data()});
    AggregationEngine& engine = *engines[static_cast<std::size_t>(r)];
    if (fused) {
      engine.run(step, members);
    } else {
      for (const GroupMember& m : members) engine.run(step, *m.pipeline, m.grad, m.out);
    }
    return outs;
  }
};

std::string aggName(Aggregation a) {
  return std::string(aggregationName(a));
}

TEST(DeferredVerdict, CleanRunsDecodeAsTheOrdinaryPath) {
  for (const Aggregation agg : {Aggregation::kSum, Aggregation::kAllgather}) {
    for (const bool fused : {true, false}) {
      SCOPED_TRACE(aggName(agg) + (fused ? ", fused" : ", alone"));
      auto deferring = std::make_shared<VerdictFake>(agg, true, false, Fault{});
      auto ordinary = std::make_shared<VerdictFake>(agg, false, false, Fault{});
      Ranks a(deferring), b(ordinary);
      std::vector<std::vector<std::vector<float>>> out_a(kWorld), out_b(kWorld);
      for (uint64_t step = 0; step < 3; ++step) {
        a.world.runOk([&](int r, HostCommunicator&) { out_a[static_cast<std::size_t>(r)] = a.step(r, step, fused); });
        b.world.runOk([&](int r, HostCommunicator&) { out_b[static_cast<std::size_t>(r)] = b.step(r, step, fused); });
        EXPECT_EQ(out_a, out_b) << "step " << step;
      }
      // Every decode call went through the deferred entry point: a SUM decodes each member's aggregate once a rank, a
      // gather each member once per rank's payload.
      const uint64_t per_step = kWorld * kNumels.size() * (agg == Aggregation::kSum ? 1 : kWorld);
      EXPECT_EQ(deferring->deferred_calls.load(), 3 * per_step);
      EXPECT_EQ(ordinary->deferred_calls.load(), 0u);
      // The averages are the ordinary path's, and real: member 0, element 0 at step 2 is the mean of the ranks'.
      float mean = 0;
      for (int r = 0; r < kWorld; ++r) mean += gradValue(r, 0, 0, 2);
      EXPECT_NEAR(out_a[0][0][0], mean / kWorld, 1e-6f);
    }
  }
}

TEST(DeferredVerdict, ARaisedWordFailsEveryRankWithThePluginsMessageAndTheNextStepRunsClean) {
  for (const Aggregation agg : {Aggregation::kSum, Aggregation::kAllgather}) {
    for (const bool fused : {true, false}) {
      SCOPED_TRACE(aggName(agg) + (fused ? ", fused" : ", alone"));
      const Fault fault{1, kFaultTensor, 1};
      auto codec = std::make_shared<VerdictFake>(agg, true, false, fault);
      auto clean = std::make_shared<VerdictFake>(agg, false, false, Fault{});
      Ranks ranks(codec), twin(clean);
      ranks.world.runOk([&](int r, HostCommunicator&) { ranks.step(r, 0, fused); });
      const auto failed = ranks.world.run([&](int r, HostCommunicator&) { ranks.step(r, 1, fused); });
      ASSERT_FALSE(failed.watchdog_fired);
      const std::string expected = agg == Aggregation::kSum
                                       ? "verdict_fake: tensor 101: the aggregate payload has a non-finite value at 75"
                                       : "verdict_fake: tensor 101: rank 1's payload has a bad header";
      // The refusal came through the words, one a rank (the ordinary path would give the same message): in a SUM every
      // rank's aggregate holds the NaN, in a gather every rank decodes rank 1's payload.
      EXPECT_EQ(codec->raised_words.load(), static_cast<uint64_t>(kWorld));
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_NE(failed.message(r).find(expected), std::string::npos) << "rank " << r << ": " << failed.message(r);
        ASSERT_NE(failed.errors[static_cast<std::size_t>(r)], nullptr);
        EXPECT_THROW(std::rethrow_exception(failed.errors[static_cast<std::size_t>(r)]), InvalidPayload);
      }
      // The same engines and pipelines run the next step clean, as a twin that never failed does: no word of the
      // failed step is left raised.
      std::vector<std::vector<std::vector<float>>> out(kWorld), want(kWorld);
      ranks.world.runOk([&](int r, HostCommunicator&) { out[static_cast<std::size_t>(r)] = ranks.step(r, 2, fused); });
      twin.world.runOk([&](int r, HostCommunicator&) { want[static_cast<std::size_t>(r)] = twin.step(r, 2, fused); });
      EXPECT_EQ(out, want);
    }
  }
}

TEST(DeferredVerdict, AWordTheOrdinaryDecodeDoesNotExplainNamesThePlugin) {
  for (const Aggregation agg : {Aggregation::kSum, Aggregation::kAllgather}) {
    SCOPED_TRACE(aggName(agg));
    auto codec = std::make_shared<VerdictFake>(agg, true, true, Fault{1, kFaultTensor, 0});
    Ranks ranks(codec);
    const auto failed = ranks.world.run([&](int r, HostCommunicator&) { ranks.step(r, 0, true); });
    ASSERT_FALSE(failed.watchdog_fired);
    for (int r = 0; r < kWorld; ++r) {
      const std::string m = failed.message(r);
      EXPECT_NE(m.find("tensor 101"), std::string::npos) << m;
      EXPECT_NE(m.find(agg == Aggregation::kSum ? "refused the aggregate payload of step 0"
                                                : "refused rank 1's payload of step 0"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("two decompress entry points disagree"), std::string::npos) << m;
      EXPECT_THROW(std::rethrow_exception(failed.errors[static_cast<std::size_t>(r)]), PluginError);
    }
  }
}

// A group split around its collectives (SplitSum, the DDP hook's chained path) with Settle::kLater: the last round's
// finishSum leaves its checks' verdicts in the split's words, and settleSums reads those of several splits at once, as
// the hook does at a step's end. Every member sums alone (sumInPlaceFrom), so none is decoded from the concatenation,
// which the host reads at once. Two splits of two members each, finished in the other order than begun, three ranks:
// a clean step decodes as run() does and settles quietly; at the faulty step finishSum returns and the fault shows
// only at settleSums, on every rank, with the plugin's message for the right tensor, and both splits are read; the
// next step runs clean. With Settle::kNow the same fault fails finishSum itself.
TEST(DeferredVerdict, SplitSumsSettledLaterFailAtTheSettleAndTheNextStepRunsClean) {
  const Fault fault{1, kFaultTensor, 1};
  auto codec = std::make_shared<VerdictFake>(Aggregation::kSum, true, false, fault);
  auto clean = std::make_shared<VerdictFake>(Aggregation::kSum, false, false, Fault{});
  Ranks ranks(codec), twin(clean);
  for (auto& engine : ranks.engines) engine->sumInPlaceFrom(1);
  std::vector<SplitSum> splits(2 * kWorld);  // rank r's: [2r] members {0, 1} (the fault's), [2r + 1] {2, 3}
  const auto sumAll = [](HostCommunicator& comm, SplitSum& split) {
    std::vector<comm::WireBytes> wires;
    for (const SplitSum::Sum& x : split.sums)
      wires.push_back(comm.allreduce(x.data.data(), x.data.size() / 4, x.wire, comm::ReduceOp::kSum, x.tensor));
    return wires;
  };
  std::array<uint64_t, kWorld> finished{};  // rank r's steps whose finishSums both returned
  // One step of rank r through both splits.
  const auto step = [&](int r, HostCommunicator& comm, uint64_t s, AggregationEngine::Settle settle) {
    std::vector<std::vector<float>> grads, outs;
    std::vector<GroupMember> members;
    for (std::size_t m = 0; m < kNumels.size(); ++m) {
      grads.emplace_back(kNumels[m]);
      for (std::size_t i = 0; i < grads[m].size(); ++i) grads[m][i] = gradValue(r, m, i, s);
      outs.emplace_back(kNumels[m], -7.0f);
    }
    for (std::size_t m = 0; m < kNumels.size(); ++m)
      members.push_back(
          GroupMember{ranks.pipes[static_cast<std::size_t>(r)][m].get(), grads[m].data(), outs[m].data()});
    AggregationEngine& engine = *ranks.engines[static_cast<std::size_t>(r)];
    SplitSum& a = splits[2 * static_cast<std::size_t>(r)];
    SplitSum& b = splits[2 * static_cast<std::size_t>(r) + 1];
    engine.beginSum(s, std::span<const GroupMember>(members).subspan(0, 2), a);
    engine.beginSum(s, std::span<const GroupMember>(members).subspan(2, 2), b);
    const auto wa = sumAll(comm, a), wb = sumAll(comm, b);
    EXPECT_FALSE(engine.finishSum(b, wb, settle));
    EXPECT_FALSE(engine.finishSum(a, wa, settle));
    ++finished[static_cast<std::size_t>(r)];
    if (settle == AggregationEngine::Settle::kLater) {
      EXPECT_TRUE(a.verdictsPending());
      EXPECT_TRUE(b.verdictsPending());
      // The faulty split first: a settle that stopped at it would leave the other unread.
      const std::array<SplitSum*, 2> both{&a, &b};
      struct Read {  // both splits are read, whether the settle throws or not
        SplitSum &a, &b;
        ~Read() { EXPECT_FALSE(a.verdictsPending() || b.verdictsPending()) << "a split's words were left unread"; }
      } read{a, b};
      engine.settleSums(both);
    }
    return outs;
  };
  using Settle = AggregationEngine::Settle;
  std::vector<std::vector<std::vector<float>>> out(kWorld), want(kWorld);
  ranks.world.runOk(
      [&](int r, HostCommunicator& comm) { out[static_cast<std::size_t>(r)] = step(r, comm, 0, Settle::kLater); });
  twin.world.runOk([&](int r, HostCommunicator&) { want[static_cast<std::size_t>(r)] = twin.step(r, 0, true); });
  EXPECT_EQ(out, want);
  const uint64_t calls = codec->deferred_calls.load();
  EXPECT_EQ(calls, kWorld * kNumels.size()) << "every decode went through the deferred entry point";

  const auto failed = ranks.world.run([&](int r, HostCommunicator& comm) { step(r, comm, 1, Settle::kLater); });
  ASSERT_FALSE(failed.watchdog_fired);
  EXPECT_EQ(codec->raised_words.load(), static_cast<uint64_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(finished[static_cast<std::size_t>(r)], 2u) << "rank " << r << ": a finishSum threw; settleSums should";
    EXPECT_NE(failed.message(r).find("verdict_fake: tensor 101: the aggregate payload has a non-finite value at 75"),
              std::string::npos)
        << "rank " << r << ": " << failed.message(r);
    ASSERT_NE(failed.errors[static_cast<std::size_t>(r)], nullptr);
    EXPECT_THROW(std::rethrow_exception(failed.errors[static_cast<std::size_t>(r)]), InvalidPayload);
  }

  ranks.world.runOk(
      [&](int r, HostCommunicator& comm) { out[static_cast<std::size_t>(r)] = step(r, comm, 2, Settle::kLater); });
  twin.world.runOk([&](int r, HostCommunicator&) { twin.step(r, 1, true); });
  twin.world.runOk([&](int r, HostCommunicator&) { want[static_cast<std::size_t>(r)] = twin.step(r, 2, true); });
  EXPECT_EQ(out, want);

  // Settled at once, the fault of a later step fails the faulty split's finish itself.
  auto now_codec = std::make_shared<VerdictFake>(Aggregation::kSum, true, false, Fault{1, kFaultTensor, 0});
  Ranks now(now_codec);
  for (auto& engine : now.engines) engine->sumInPlaceFrom(1);
  const auto at_finish = now.world.run([&](int r, HostCommunicator& comm) {
    std::vector<std::vector<float>> grads, outs;
    std::vector<GroupMember> members;
    for (std::size_t m = 0; m < 2; ++m) {
      grads.emplace_back(kNumels[m], 1.0f);
      outs.emplace_back(kNumels[m], 0.0f);
      members.push_back(GroupMember{now.pipes[static_cast<std::size_t>(r)][m].get(), grads[m].data(), outs[m].data()});
    }
    SplitSum split;
    AggregationEngine& engine = *now.engines[static_cast<std::size_t>(r)];
    engine.beginSum(0, members, split);
    const auto wires = sumAll(comm, split);
    try {
      engine.finishSum(split, wires);
    } catch (const InvalidPayload&) {
      EXPECT_FALSE(split.verdictsPending());
      throw;
    }
    ADD_FAILURE() << "rank " << r << ": finishSum returned";
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(at_finish.message(r).find("tensor 101: the aggregate payload has a non-finite value"), std::string::npos)
        << at_finish.message(r);
  }
}

// TERSE_DEFER_VERDICTS, read when an engine is made, for comparing both ways in one run; restored afterwards.
class DeferEnv {
 public:
  explicit DeferEnv(const char* value) {
    if (const char* v = std::getenv(kName)) saved_ = v;
    ::setenv(kName, value, 1);
  }
  ~DeferEnv() {
    if (saved_) {
      ::setenv(kName, saved_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }
  DeferEnv(const DeferEnv&) = delete;
  DeferEnv& operator=(const DeferEnv&) = delete;

 private:
  static constexpr const char* kName = "TERSE_DEFER_VERDICTS";
  std::optional<std::string> saved_;
};

TEST(DeferredVerdict, TheEnvironmentTurnsItOffAndABadValueIsRefused) {
  auto codec = std::make_shared<VerdictFake>(Aggregation::kAllgather, true, false, Fault{1, kFaultTensor, 0});
  {
    const DeferEnv off("0");
    Ranks ranks(codec);
    EXPECT_FALSE(ranks.engines[0]->defersVerdicts());
    // The ordinary decode refuses the fault at once, with the same message, and no call took the deferred way.
    const auto failed = ranks.world.run([&](int r, HostCommunicator&) { ranks.step(r, 0, true); });
    ASSERT_FALSE(failed.watchdog_fired);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_NE(failed.message(r).find("verdict_fake: tensor 101: rank 1's payload has a bad header"),
                std::string::npos)
          << failed.message(r);
    }
    EXPECT_EQ(codec->deferred_calls.load(), 0u);
  }
  {
    const DeferEnv on("1");
    Ranks ranks(codec);
    EXPECT_TRUE(ranks.engines[0]->defersVerdicts());
    ranks.engines[0]->deferVerdicts(false);
    EXPECT_FALSE(ranks.engines[0]->defersVerdicts());
  }
  const DeferEnv bad("yes");
  World world(1);
  terse::testing::expectThrowWith<InvalidArgument>([&] { AggregationEngine engine(*world.comms[0]); },
                                                   {"TERSE_DEFER_VERDICTS", "got 'yes'"});
}

// The real plugins' side of the ABI: an SDK-built plugin exports terse_compressor_decompress_deferred_v1 and so defers;
// on the host it ignores the word and refuses a bad payload at once, as decompress does. A C plugin without the symbol
// does not defer, and its decodes take the ordinary entry point.
TEST(DeferredVerdict, SdkPluginsExportTheEntryPointAndCPluginsNeedNot) {
  const auto file = [](const std::filesystem::path& dir, const std::string& name) {
    return dir / PluginLoader::fileNameFor(PluginKind::kCompressor, name);
  };
  auto lossy = CompressorPlugin::open(file(TERSE_TEST_PLUGIN_DIR, "test_lossy"))->instantiate({});
  auto c_plugin = CompressorPlugin::open(file(TERSE_TEST_FIXTURE_PLUGIN_DIR, "good_c"))->instantiate({});
  EXPECT_TRUE(lossy->defersVerdicts());
  EXPECT_FALSE(c_plugin->defersVerdicts());

  auto codec = makePluginCodec(lossy, flatTensor(10, DType::kF32, 0, 1, 5), 1);
  EXPECT_TRUE(codec->defersVerdicts());
  std::vector<float> grad(10, 1.5f), out(10, -1.0f);
  std::vector<std::byte> payload(static_cast<std::size_t>(codec->sizes(0).max_output_bytes));
  const uint64_t bytes = codec->encode(0, 0, grad.data(), {}, payload);
  std::vector<float> ordinary(10, -1.0f);
  codec->decode(0, std::span<const std::byte>(payload.data(), bytes), -1, ordinary.data(), false);
  uint32_t word = 0;
  codec->decodeDeferred(0, std::span<const std::byte>(payload.data(), bytes), -1, out.data(), false, &word);
  EXPECT_EQ(word, 0u);
  EXPECT_EQ(out, ordinary);
  EXPECT_NE(out, std::vector<float>(10, -1.0f));
  std::fill(out.begin(), out.end(), -1.0f);
  EXPECT_THROW(
      codec->decodeDeferred(0, std::span<const std::byte>(payload.data(), bytes - 4), -1, out.data(), false, &word),
      InvalidPayload);
  EXPECT_EQ(word, 0u);
  EXPECT_EQ(out, std::vector<float>(10, -1.0f));
  EXPECT_THROW(
      codec->decodeDeferred(0, std::span<const std::byte>(payload.data(), bytes), -1, out.data(), false, nullptr),
      InvalidArgument);
}

// The words' read order (engine.h, VerdictWords::firstRaised): from first_read on first, so that a refused prev, whose
// word [2k, 3k) of a run comes after the decodes' that it makes refuse too, is the one explained. Host words; a
// check of prev is a device's only, so a host run hands out none.
TEST(DeferredVerdict, AReadLooksAtTheWordsFromFirstReadFirst) {
  VerdictWords words;
  words.begin(6, true, Placement::host(), 4);
  *words.word(1) = 1;
  *words.word(5) = 1;
  EXPECT_EQ(words.settle(), 5u);
  EXPECT_EQ(words.settle(), VerdictWords::npos);  // read once
  words.begin(6, true, Placement::host(), 4);
  *words.word(1) = 1;
  EXPECT_EQ(words.settle(), 1u);
  words.begin(6, true, Placement::host(), 4);
  *words.word(4) = 1;
  *words.word(0) = 1;
  EXPECT_EQ(words.settle(), 4u);
  words.begin(6, true, Placement::host(), 4);
  EXPECT_EQ(words.settle(), VerdictWords::npos);
  EXPECT_NE(words.word(4), nullptr);
  EXPECT_EQ(words.prevWord(4), nullptr);
  EXPECT_EQ(words.ownWord(1), nullptr);
}

// The deferred compress (terse/device_verdict_v1.h): an SDK-built plugin exports terse_compressor_compress_deferred_v1
// and so may defer its check of prev, a C plugin without the symbol does not. A host tensor never defers it: the codec
// and the pipeline say so, and an encode handed a word checks prev at once, with the plugin's message, the word left
// alone; a clean prev gives the ordinary encode's bytes.
TEST(DeferredVerdict, PowerSgdExportsTheDeferredCompressAndAHostTensorChecksPrevAtOnce) {
  const auto file = [](const std::filesystem::path& dir, const std::string& name) {
    return dir / PluginLoader::fileNameFor(PluginKind::kCompressor, name);
  };
  auto powersgd = CompressorPlugin::open(file(TERSE_TEST_BUILD_PLUGIN_DIR, "powersgd"))->instantiate({{"rank", "2"}});
  auto c_plugin = CompressorPlugin::open(file(TERSE_TEST_FIXTURE_PLUGIN_DIR, "good_c"))->instantiate({});
  EXPECT_TRUE(powersgd->defersPrevVerdicts());
  EXPECT_FALSE(c_plugin->defersPrevVerdicts());

  TensorInfo t = flatTensor(48, DType::kF32, 0, 1, 7);
  t.ndim = 2;
  t.shape = {8, 6, 0, 0};
  World world(1);
  CompressionPipeline pipeline(makePluginCodec(powersgd, t, 1), *world.comms[0]);
  EXPECT_FALSE(pipeline.codec().defersPrevVerdicts());
  EXPECT_FALSE(pipeline.defersPrevVerdicts());

  TensorCodec& codec = pipeline.codec();
  std::vector<float> grad(48);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(0.3f * static_cast<float>(i)) + 0.01f;
  std::vector<std::byte> p0(static_cast<std::size_t>(codec.sizes(0).max_output_bytes));
  std::vector<std::byte> want(static_cast<std::size_t>(codec.sizes(1).max_output_bytes)), got(want.size());
  const auto prev = [&](uint64_t bytes) { return std::span<const std::byte>(p0.data(), bytes); };
  uint64_t n0 = codec.encode(0, 0, grad.data(), {}, p0);
  const uint64_t n1 = codec.encode(0, 1, grad.data(), prev(n0), want);
  n0 = codec.encode(0, 0, grad.data(), {}, p0);
  uint32_t word = 0;
  ASSERT_EQ(codec.encodeDeferred(0, 1, grad.data(), prev(n0), got, {.prev = &word}), n1);
  EXPECT_EQ(word, 0u);
  EXPECT_EQ(want, got);

  std::string ordinary, deferred;
  p0[0] ^= std::byte{0x01};
  try {
    (void)codec.encode(0, 1, grad.data(), prev(n0), want);
  } catch (const InvalidPayload& e) {
    ordinary = e.what();
  }
  try {
    (void)codec.encodeDeferred(0, 1, grad.data(), prev(n0), got, {.prev = &word});
  } catch (const InvalidPayload& e) {
    deferred = e.what();
  }
  EXPECT_FALSE(ordinary.empty());
  EXPECT_EQ(ordinary, deferred);
  EXPECT_EQ(word, 0u);
}

}  // namespace
}  // namespace terse::deferred_verdict_test
