// Compressed pulls of the parameter server (param_server_shard.h, "Compressed pulls"): the worker's copy and the
// shard's replica of it stay the same bits through every delta pull, what a compressor drops travels with later pulls,
// the bytes on the way down are the compressor's, and every way a delta pull cannot be served is refused by name.
// Over the inproc transport, one thread per shard and per worker; the compressors are in-test fakes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "core/train/param_server_client.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_shard.h"
#include "core/train/param_server_wire.h"
#include "tests/comm/comm_test_util.h"

// A named namespace: the test target builds as one unit, where two files' anonymous namespaces would meet.
namespace terse::train::ps_pull_test {

using comm::InprocFabric;
using comm::testing::spawnRanks;

// Sends the one element of largest magnitude (the lower index on a tie) as magic, u32 index, f32 value: 12 bytes
// whatever the tensor's size, so a delta pull sends one element per piece and leaves the rest for later pulls.
class TopOne : public Compressor {
 public:
  static constexpr uint32_t kMagic = 0x31504f54;  // "TOP1"
  TopOne() {
    info_.name = "top1";
    info_.description = "in-test";
    info_.version = "0";
    info_.abi_version = 1;
  }
  const PluginInfo& plugin() const override { return info_; }
  const CompressorCaps& caps(DType) const override { return caps_; }
  CompressorSizes sizes(const TensorInfo&) const override {
    CompressorSizes s;
    s.max_output_bytes = 12;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch&,
                    std::span<std::byte> out, void*) const override {
    if (out.size() < 12) TERSE_THROW(InvalidArgument, "top1: output too small");
    const auto* in = static_cast<const float*>(input);
    uint32_t best = 0;
    for (uint32_t i = 1; i < info.numel; ++i)
      if (std::fabs(in[i]) > std::fabs(in[best])) best = i;
    const float v = info.numel == 0 ? 0.0f : in[best];
    std::memcpy(out.data(), &kMagic, 4);
    std::memcpy(out.data() + 4, &best, 4);
    std::memcpy(out.data() + 8, &v, 4);
    return 12;
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    uint32_t magic = 0, index = 0;
    float v = 0;
    if (payload.size() != 12) TERSE_THROW(InvalidPayload, "top1: payload of " << payload.size() << " B, expected 12");
    std::memcpy(&magic, payload.data(), 4);
    std::memcpy(&index, payload.data() + 4, 4);
    std::memcpy(&v, payload.data() + 8, 4);
    if (magic != kMagic) TERSE_THROW(InvalidPayload, "top1: bad magic");
    if (info.numel > 0 && index >= info.numel) TERSE_THROW(InvalidPayload, "top1: index " << index << " out of range");
    auto* o = static_cast<float*>(out);
    if (!accumulate) std::fill(o, o + info.numel, 0.0f);
    if (info.numel > 0) o[index] = (accumulate ? o[index] : 0.0f) + poison(v);
  }
  uint64_t reduce(const TensorInfo&, std::span<const std::byte>, std::span<const std::byte>, const Scratch&,
                  std::span<std::byte>, void*) const override {
    TERSE_THROW(InvalidArgument, "top1: no reduce");
  }

 protected:
  virtual float poison(float v) const { return v; }
  CompressorCaps caps_{.devices = TERSE_DEVICE_HOST, .aggregation = Aggregation::kSum, .wire_dtype = DType::kF32};

 private:
  PluginInfo info_;
};

// Decodes every value to NaN: a plugin bug the shard must catch before the worker adds it to its parameters.
class NanTopOne : public TopOne {
 protected:
  float poison(float) const override { return std::numeric_limits<float>::quiet_NaN(); }
};

// Rounds every value to a multiple of 1/256: lossy everywhere, so each pull leaves a residual for the next.
class Grid256 : public TopOne {
 public:
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = 4 * info.numel;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch&,
                    std::span<std::byte> out, void*) const override {
    const auto* in = static_cast<const float*>(input);
    for (uint64_t i = 0; i < info.numel; ++i) {
      const float v = std::nearbyint(in[i] * 256.0f) / 256.0f;
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
    return 4 * info.numel;
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    if (payload.size() != 4 * info.numel) TERSE_THROW(InvalidPayload, "grid256: wrong length");
    auto* o = static_cast<float*>(out);
    for (uint64_t i = 0; i < info.numel; ++i) {
      float v;
      std::memcpy(&v, payload.data() + 4 * i, 4);
      o[i] = accumulate ? o[i] + v : v;
    }
  }
};

class TwoRounds : public TopOne {
 public:
  TwoRounds() { caps_.num_rounds = 2; }
};

// Stateless, but its decode depends on the decoding codec's own rank: the shard's mirror (one per piece for a
// stateless compressor) and worker 1's decoder disagree, which the reply's checksum must catch.
class RankTinted : public Grid256 {
 public:
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch& s, void* out,
                  bool accumulate, void* stream) const override {
    Grid256::decompress(info, payload, s, out, accumulate, stream);
    if (info.numel > 0) static_cast<float*>(out)[0] += 1e-3f * static_cast<float>(info.rank);
  }
};

// The quadratic of param_server_test.cc: worker w's gradient a_wi (x_i - c_i), one optimum for every worker.
float curvatureOf(int worker, std::size_t i) {
  return 0.5f + 0.25f * static_cast<float>((i + static_cast<std::size_t>(worker)) % 5);
}
float optimumAt(std::size_t i) {
  return std::sin(0.37f * static_cast<float>(i) + 0.5f);
}
float startAt(std::size_t i) {
  return 0.1f * static_cast<float>(i % 7) - 0.3f;
}

struct PullRun {
  std::vector<uint64_t> tensors{7, 0, 13, 1, 30};
  int shards = 2;
  int workers = 3;
  int steps = 25;
  ServerOptions server;
  std::shared_ptr<const Compressor> pull;
};

struct PullResult {
  PsPlan plan;
  std::vector<float> params;                 // the shards' parameters at the end, flat
  std::vector<std::vector<float>> last;      // per worker: its copy after its last pull
  std::vector<std::vector<float>> replicas;  // per worker: the shards' replicas of it, flat
  std::vector<uint64_t> pull_bytes;          // per worker: the pull replies' bodies
  std::vector<ServerStats> stats;
};

PullResult runPulls(const PullRun& cfg) {
  PullResult out;
  out.plan = planShards(cfg.tensors, cfg.shards);
  const PsPlan& plan = out.plan;
  auto fabric = InprocFabric::create(cfg.shards + cfg.workers);
  std::vector<std::unique_ptr<comm::Transport>> ts;
  for (int r = 0; r < cfg.shards + cfg.workers; ++r) ts.push_back(fabric->endpoint(r));
  std::vector<float> init(plan.total_numel);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = startAt(i);
  ServerOptions so = cfg.server;
  so.pull_compressor = cfg.pull;
  std::vector<std::unique_ptr<ParamServerShard>> shards;
  for (int k = 0; k < cfg.shards; ++k) {
    const auto [b, e] = plan.ranges[static_cast<std::size_t>(k)];
    shards.push_back(
        std::make_unique<ParamServerShard>(*ts[static_cast<std::size_t>(k)], plan, k, cfg.workers,
                                           std::vector<float>(init.begin() + static_cast<std::ptrdiff_t>(b),
                                                              init.begin() + static_cast<std::ptrdiff_t>(e)),
                                           so));
  }
  out.last.resize(static_cast<std::size_t>(cfg.workers));
  out.pull_bytes.resize(static_cast<std::size_t>(cfg.workers));
  auto spawn = spawnRanks(
      cfg.shards + cfg.workers,
      [&](int rank) {
        if (rank < cfg.shards) return shards[static_cast<std::size_t>(rank)]->run();
        const int w = rank - cfg.shards;
        ClientOptions co;
        co.pull_compressor = cfg.pull;
        ParamServerClient client(*ts[static_cast<std::size_t>(rank)], plan, w, cfg.workers, co);
        std::vector<float> x(plan.total_numel), g(plan.total_numel);
        for (int t = 0; t < cfg.steps; ++t) {
          client.pull(static_cast<uint64_t>(t), x);
          for (std::size_t i = 0; i < x.size(); ++i) g[i] = curvatureOf(w, i) * (x[i] - optimumAt(i));
          client.push(static_cast<uint64_t>(t), g);
        }
        out.last[static_cast<std::size_t>(w)] = x;
        out.pull_bytes[static_cast<std::size_t>(w)] = client.pullPayloadBytes();
        client.bye();
      },
      fabric.get(), std::chrono::seconds(60));
  comm::testing::expectNoErrors(spawn);
  out.replicas.resize(static_cast<std::size_t>(cfg.workers));
  for (int k = 0; k < cfg.shards; ++k) {
    const auto p = shards[static_cast<std::size_t>(k)]->params();
    out.params.insert(out.params.end(), p.begin(), p.end());
    out.stats.push_back(shards[static_cast<std::size_t>(k)]->stats());
    for (int w = 0; w < cfg.workers; ++w) {
      const auto r = shards[static_cast<std::size_t>(k)]->replica(w);
      out.replicas[static_cast<std::size_t>(w)].insert(out.replicas[static_cast<std::size_t>(w)].end(), r.begin(),
                                                       r.end());
    }
  }
  return out;
}

double farthestFromOptimum(std::span<const float> x) {
  double d = 0;
  for (std::size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(x[i]) - optimumAt(i)));
  return d;
}

TEST(PsCompressedPull, EachWorkersCopyIsItsReplicaBitForBitAndTheWayDownCarriesThePayloads) {
  for (const int shards : {1, 2, 3}) {
    PullRun cfg;
    cfg.shards = shards;
    cfg.server.staleness_bound = 0;
    cfg.server.lr = 0.5;
    cfg.pull = std::make_shared<TopOne>();
    const PullResult r = runPulls(cfg);
    for (int w = 0; w < cfg.workers; ++w) {
      const auto& mine = r.last[static_cast<std::size_t>(w)];
      const auto& replica = r.replicas[static_cast<std::size_t>(w)];
      ASSERT_EQ(mine.size(), replica.size());
      EXPECT_EQ(std::memcmp(mine.data(), replica.data(), mine.size() * sizeof(float)), 0)
          << "worker " << w << ", " << shards << " shards";
      // One element a piece a pull: the copy lags the parameters, which the test would not see were pulls exact.
      std::size_t apart = 0;
      for (std::size_t i = 0; i < mine.size(); ++i) apart += mine[i] != r.params[i] ? 1 : 0;
      EXPECT_GT(apart, 0u) << "worker " << w;
      // The first pull's body: versions and f32 values; each later one per shard: versions, then per piece a length
      // and the 12-byte payload padded to 16, then the checksum.
      uint64_t want = 0;
      for (int k = 0; k < shards; ++k) {
        const uint64_t pieces = r.plan.shard_pieces[static_cast<std::size_t>(k)].size();
        want += psPullBodyBytes(r.plan, k, DType::kF32) +
                static_cast<uint64_t>(cfg.steps - 1) * (pieces * 8 + pieces * (8 + 16) + 8);
      }
      EXPECT_EQ(r.pull_bytes[static_cast<std::size_t>(w)], want) << "worker " << w;
    }
    for (const auto& s : r.stats) {
      EXPECT_EQ(s.refused, 0u);
      // The frames go back to their pools (a delta frame to the delta pool, at the compressor's size): in lockstep a
      // step's replies are at most one per worker in flight, so a handful of frames serve all 75 pulls.
      EXPECT_LE(s.pull_frames_allocated, static_cast<uint64_t>(2 * cfg.workers)) << shards << " shards";
      // Every worker's pulls after its first are delta pulls; top-1 leaves most of each change behind.
      EXPECT_EQ(s.delta_pulls, static_cast<uint64_t>(cfg.workers * (cfg.steps - 1)));
      EXPECT_GT(s.pull_residual_sq, 1e-3 * s.pull_params_sq);
    }
  }
}

TEST(PsCompressedPull, EmptyTensorsAndShardsPullLikeTheOthers) {
  // A piece of no elements leaves its shard an empty range, and an empty replica is still a replica.
  for (const std::vector<uint64_t>& tensors : {std::vector<uint64_t>{0}, std::vector<uint64_t>{0, 3, 0}}) {
    PullRun cfg;
    cfg.tensors = tensors;
    cfg.shards = 3;
    cfg.workers = 2;
    cfg.steps = 4;
    cfg.pull = std::make_shared<TopOne>();
    const PullResult r = runPulls(cfg);
    for (const auto& s : r.stats) EXPECT_EQ(s.refused, 0u) << ::testing::PrintToString(s.errors);
    for (int w = 0; w < cfg.workers; ++w) EXPECT_EQ(r.last[static_cast<std::size_t>(w)].size(), r.params.size());
  }
}

TEST(PsCompressedPull, WhatTheCompressorDroppedTravelsWithLaterPulls) {
  const PsPlan plan = planShards(std::vector<uint64_t>{5, 3}, 1);
  auto fabric = InprocFabric::create(2);
  auto st = fabric->endpoint(0), wt = fabric->endpoint(1);
  ServerOptions so;
  so.lr = 1.0;
  so.pull_compressor = std::make_shared<TopOne>();
  // Multiples of 1/8 throughout: every difference and sum below is exact, so nothing but what top-1 left is left.
  std::vector<float> init(8);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = 0.25f * static_cast<float>(i) - 1.0f;
  ParamServerShard shard(*st, plan, 0, 1, init, so);
  std::vector<std::vector<float>> seen;
  auto spawn = spawnRanks(
      2,
      [&](int rank) {
        if (rank == 0) return shard.run();
        ClientOptions co;
        co.pull_compressor = so.pull_compressor;
        ParamServerClient client(*wt, plan, 0, 1, co);
        std::vector<float> x(8), g(8);
        client.pull(0, x);
        seen.push_back(x);
        // Distinct magnitudes, so top-1's order is known: piece 0's elements 4, 3, 2, 1, 0, piece 1's 7, 6, 5.
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.125f * static_cast<float>(i + 1);
        client.push(0, g);
        for (int t = 0; t < 6; ++t) {
          client.pull(1, x);  // no push between them: only what earlier pulls left behind travels
          seen.push_back(x);
        }
        client.bye();
      },
      fabric.get(), std::chrono::seconds(30));
  comm::testing::expectNoErrors(spawn);
  const std::vector<float> p = shard.params();
  EXPECT_EQ(seen.front(), init);
  // Pull t changes exactly the t-th largest change of each piece (piece 1 is done after 3).
  for (std::size_t t = 1; t < seen.size(); ++t) {
    std::vector<std::size_t> changed;
    for (std::size_t i = 0; i < 8; ++i)
      if (seen[t][i] != seen[t - 1][i]) changed.push_back(i);
    std::vector<std::size_t> want{5 - t};
    if (t <= 3) want.push_back(8 - t);
    if (t > 5) want.clear();
    EXPECT_EQ(changed, want) << "pull " << t;
  }
  EXPECT_EQ(seen.back(), p);
  EXPECT_EQ(std::memcmp(seen.back().data(), shard.replica(0).data(), 8 * sizeof(float)), 0);
  // The residual after each pull, summed: (5^2 + ... + 1^2 + 4^2 + 3^2 + 2^2 + 1^2 ...) / 64 for the two pieces' still
  // unsent changes 0.125 (i + 1), pull by pull, and nothing once all went.
  const ServerStats stats = shard.stats();
  EXPECT_EQ(stats.delta_pulls, 6u);
  double want = 0;
  for (int t = 1; t <= 6; ++t)
    for (int i = 0; i < 8; ++i) {
      const int rank_in_piece = i < 5 ? 4 - i : 7 - i;  // 0 for the largest change of its piece, sent first
      if (rank_in_piece >= t) want += (0.125 * (i + 1)) * (0.125 * (i + 1));
    }
  EXPECT_DOUBLE_EQ(stats.pull_residual_sq, want);
}

TEST(PsCompressedPull, AsyncWorkersConvergeThroughALossyPull) {
  PullRun cfg;
  cfg.workers = 4;
  cfg.steps = 120;
  cfg.server.lr = 0.5;
  cfg.pull = std::make_shared<Grid256>();
  const PullResult r = runPulls(cfg);
  std::vector<float> x0(r.plan.total_numel);
  for (std::size_t i = 0; i < x0.size(); ++i) x0[i] = startAt(i);
  EXPECT_GT(farthestFromOptimum(x0), 0.5);
  // The replica's residual feeds back, so the copies' error stays under the grid's half step and the parameters
  // settle within a few grid steps of the optimum; without the feedback the rounding would be lost every pull.
  EXPECT_LT(farthestFromOptimum(r.params), 4.0 / 256);
  for (int w = 0; w < cfg.workers; ++w)
    EXPECT_EQ(std::memcmp(r.last[static_cast<std::size_t>(w)].data(), r.replicas[static_cast<std::size_t>(w)].data(),
                          r.params.size() * sizeof(float)),
              0)
        << "worker " << w;
}

// A request frame sent by hand to shard 0 (rank 0), and the refusal it gets.
std::string refusalOf(comm::Transport& t, const PsRequestHeader& h, std::size_t payload = 0) {
  PsRequestHeader hh = h;
  hh.payload_bytes = payload;
  std::vector<std::byte> f(kPsRequestHeaderBytes + payload);
  encodePsRequest(hh, std::span<std::byte, kPsRequestHeaderBytes>(f.data(), kPsRequestHeaderBytes));
  t.send(serverRank(0), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag}, f);
  std::vector<std::byte> r(4096);
  const uint64_t n = t.recv(serverRank(0), comm::FrameMeta{comm::OpKind::kP2P, kPsReplyTag}, r);
  const PsReplyHeader rh = decodePsReply(std::span<const std::byte>(r.data(), n));
  if (rh.status != PsStatus::kError) return "(not refused)";
  return std::string(reinterpret_cast<const char*>(r.data() + kPsReplyHeaderBytes), rh.payload_bytes);
}

TEST(PsCompressedPull, EachDeltaPullThatCannotBeServedIsRefusedAndTheShardGoesOn) {
  const PsPlan plan = planShards(std::vector<uint64_t>{6, 4}, 1);
  PsRequestHeader delta;
  delta.op = PsOp::kPullDelta;
  delta.step = 0;
  for (const bool with_pull : {false, true}) {
    auto fabric = InprocFabric::create(2);
    auto st = fabric->endpoint(0), wt = fabric->endpoint(1);
    ServerOptions so;
    if (with_pull) so.pull_compressor = std::make_shared<NanTopOne>();
    ParamServerShard shard(*st, plan, 0, 1, std::vector<float>(10, 1.0f), so);
    std::vector<std::string> got;
    auto spawn = spawnRanks(
        2,
        [&](int rank) {
          if (rank == 0) return shard.run();
          if (!with_pull) {
            got.push_back(refusalOf(*wt, delta));
            ParamServerClient client(*wt, plan, 0, 1, {});
            std::vector<float> x(10);
            client.pull(0, x);  // the shard still serves
            got.push_back(x == std::vector<float>(10, 1.0f) ? "served" : "wrong values");
            client.bye();
            return;
          }
          got.push_back(refusalOf(*wt, delta));     // before the full pull
          got.push_back(refusalOf(*wt, delta, 8));  // a payload where none belongs
          ClientOptions co;
          co.pull_compressor = so.pull_compressor;
          ParamServerClient client(*wt, plan, 0, 1, co);
          std::vector<float> x(10), g(10, 0.5f);
          client.pull(0, x);
          client.push(0, g);
          try {
            client.pull(1, x);
            got.push_back("(a NaN reached the worker)");
          } catch (const PsRefused& e) {
            got.push_back(e.what());
          }
          got.push_back(refusalOf(*wt, delta));  // the replica went with the refusal
          client.bye();
        },
        fabric.get(), std::chrono::seconds(30));
    comm::testing::expectNoErrors(spawn);
    const std::vector<std::string> needles =
        with_pull ? std::vector<std::string>{"before a full f32 pull", "carries 8 payload bytes",
                                             "non-finite value at 0 (pull compressor 'top1')", "before a full f32 pull"}
                  : std::vector<std::string>{"has no pull compressor (parameter_server.pull_compressor)", "served"};
    ASSERT_EQ(got.size(), needles.size());
    for (std::size_t i = 0; i < needles.size(); ++i)
      EXPECT_NE(got[i].find(needles[i]), std::string::npos) << "case " << i << ": " << got[i];
    EXPECT_EQ(shard.stats().refused, with_pull ? 4u : 1u);
  }
}

TEST(PsCompressedPull, ACopyThatDriftsFromItsReplicaFailsThePullNamingTheCompressor) {
  const PsPlan plan = planShards(std::vector<uint64_t>{6}, 1);
  auto fabric = InprocFabric::create(3);
  auto st = fabric->endpoint(0), w0 = fabric->endpoint(1), w1 = fabric->endpoint(2);
  ServerOptions so;
  so.pull_compressor = std::make_shared<RankTinted>();
  ParamServerShard shard(*st, plan, 0, 2, std::vector<float>(6, 0.5f), so);
  std::string outcome[2];
  auto spawn = spawnRanks(
      3,
      [&](int rank) {
        if (rank == 0) return shard.run();
        const int w = rank - 1;
        ClientOptions co;
        co.pull_compressor = so.pull_compressor;
        ParamServerClient client(w == 0 ? *w0 : *w1, plan, w, 2, co);
        std::vector<float> x(6), g(6, 1.0f);
        client.pull(0, x);
        client.push(0, g);
        try {
          client.pull(1, x);
          outcome[w] = "pulled";
        } catch (const InvalidPayload& e) {
          outcome[w] = e.what();
        }
        client.bye();
      },
      fabric.get(), std::chrono::seconds(30));
  comm::testing::expectNoErrors(spawn);
  EXPECT_EQ(outcome[0], "pulled");  // rank 0 decodes as the shard's mirror does
  EXPECT_NE(outcome[1].find("worker 1's copy is not the shard's replica of it"), std::string::npos) << outcome[1];
  EXPECT_NE(outcome[1].find("pull compressor 'top1' decodes differently on the two sides"), std::string::npos)
      << outcome[1];
}

TEST(PsCompressedPull, SetupsThatCannotWorkAreRefusedAtConstruction) {
  const auto expectRefusal = [](auto&& make, const std::string& needle) {
    try {
      make();
      ADD_FAILURE() << "accepted; expected a refusal naming '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const PsPlan plan = planShards(std::vector<uint64_t>{4}, 1);
  auto ts = comm::makeInprocTransports(2);
  ServerOptions so;
  so.pull_compressor = std::make_shared<TwoRounds>();
  expectRefusal([&] { ParamServerShard(*ts[0], plan, 0, 1, std::vector<float>(4), so); },
                "pull compressor 'top1' has 2 rounds; only single-round compressors can pull");
  ClientOptions co;
  co.pull_compressor = so.pull_compressor;
  expectRefusal([&] { ParamServerClient(*ts[1], plan, 0, 1, co); }, "2 rounds");
  co.pull_compressor = std::make_shared<TopOne>();
  co.pull_dtype = DType::kBF16;
  expectRefusal([&] { ParamServerClient(*ts[1], plan, 0, 1, co); }, "a pull compressor needs pull dtype f32, got bf16");
  // Row-sparse tensors travel as rows, outside every compressor.
  PsPlan sparse = planShards(std::vector<uint64_t>{12}, 1);
  markRowSparse(sparse, 0, 3);
  so.pull_compressor = co.pull_compressor;
  co.pull_dtype = DType::kF32;
  expectRefusal([&] { ParamServerShard(*ts[0], sparse, 0, 1, std::vector<float>(12), so); }, "tensor 0 is row-sparse");
  expectRefusal([&] { ParamServerClient(*ts[1], sparse, 0, 1, co); }, "tensor 0 is row-sparse");
}

TEST(PsCompressedPull, DeltaPullBodiesAreCheckedPieceByPiece) {
  // Two pieces: payloads of 3 and 9 bytes, each padded to 8.
  const std::vector<uint64_t> max{4, 16};
  std::vector<std::byte> body(static_cast<std::size_t>(psDeltaPullMaxBodyBytes(max)), std::byte{0x5a});
  for (int i = 0; i < 2; ++i) {
    const uint64_t v = 40 + static_cast<uint64_t>(i);
    std::memcpy(body.data() + 8 * i, &v, 8);
  }
  uint64_t at = 16;
  for (uint64_t n : {uint64_t{3}, uint64_t{9}}) {
    for (uint64_t j = 0; j < n; ++j) body[static_cast<std::size_t>(at + 8 + j)] = std::byte{static_cast<uint8_t>(n)};
    at += encodePsDeltaPullEntry(body, at, n);
  }
  EXPECT_EQ(at, 16u + (8 + 8) + (8 + 16));
  at = encodePsDeltaPullChecksum(body, at, 0x0123456789abcdefull);
  EXPECT_EQ(at, body.size());
  std::vector<uint64_t> versions(2);
  const PsDeltaPullBody decoded = decodePsDeltaPullBody(body, versions, max);
  const auto& payloads = decoded.payloads;
  EXPECT_EQ(decoded.checksum, 0x0123456789abcdefull);
  EXPECT_EQ(versions, (std::vector<uint64_t>{40, 41}));
  ASSERT_EQ(payloads.size(), 2u);
  EXPECT_EQ(payloads[0].size(), 3u);
  EXPECT_EQ(payloads[1].size(), 9u);
  EXPECT_EQ(payloads[1][8], std::byte{9});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(payloads[1].data()) % 8, reinterpret_cast<uintptr_t>(body.data()) % 8);
  const auto refusal = [&](std::vector<std::byte> b, std::vector<uint64_t> bounds = {4, 16}) {
    try {
      decodePsDeltaPullBody(b, versions, bounds);
    } catch (const InvalidPayload& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  auto longer = body;
  longer.push_back(std::byte{0});
  EXPECT_NE(refusal(longer).find("9 B after the last piece, expected the 8-byte checksum"), std::string::npos)
      << refusal(longer);
  EXPECT_NE(refusal(body, {2, 16}).find("piece 0's payload of 3 B exceeds the pull compressor's 2 B"),
            std::string::npos);
  auto padded = body;
  padded[16 + 8 + 5] = std::byte{1};
  EXPECT_NE(refusal(padded).find("piece 0's padding is not zero"), std::string::npos) << refusal(padded);
  auto cut = body;
  cut.resize(cut.size() - 16);
  EXPECT_NE(refusal(cut).find("piece 1's payload of 9 B runs past the body's end"), std::string::npos) << refusal(cut);
  auto huge = body;
  const uint64_t far = ~uint64_t{0} - 3;  // padding it would wrap around
  std::memcpy(huge.data() + 16, &far, 8);
  EXPECT_NE(refusal(huge, {~uint64_t{0}, 16}).find("runs past the body's end"), std::string::npos)
      << refusal(huge, {~uint64_t{0}, 16});
  EXPECT_NE(refusal(std::vector<std::byte>(12)).find("shorter than its 2 versions"), std::string::npos);
  cut.resize(20);
  EXPECT_NE(refusal(cut).find("ends before piece 0's length"), std::string::npos) << refusal(cut);
}

}  // namespace terse::train::ps_pull_test
