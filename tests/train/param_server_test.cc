// The parameter server over the inproc transport, one thread per shard and per worker (docs/STYLE.md 9), on a synthetic
// quadratic whose sync data-parallel trajectory is computed locally: f_w(x) = 1/2 sum_i a_i (x_i - c_wi)^2, so
// grad_w(x)_i = a_i (x_i - c_wi) and the mean objective's optimum is the mean of the c_w.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "core/compress/make_codec.h"
#include "core/train/param_server_client.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_shard.h"
#include "core/train/param_server_wire.h"
#include "terse/sdk/half.hpp"
#include "tests/comm/comm_test_util.h"

namespace terse::train {
namespace {

using comm::InprocFabric;
using comm::testing::spawnRanks;

// Lossy, deterministic, stateless SUM compressor: values rounded to multiples of 1/64 behind a 16-byte header
// (magic, numel). Lossy so error feedback has a residual to keep; decompress validates like a real plugin.
class QuantCompressor : public Compressor {
 public:
  static constexpr uint32_t kMagic = 0x544e5551;  // "QUNT"
  QuantCompressor() {
    info_.name = "quant64";
    info_.description = "in-test";
    info_.version = "0";
    info_.abi_version = 1;
  }
  static float q(float x) { return std::nearbyint(x * 64.0f) / 64.0f; }

 protected:
  CompressorCaps caps_{
      .devices = TERSE_DEVICE_HOST, .aggregation = Aggregation::kSum, .wire_dtype = DType::kF32, .fixed_size = true};

 public:
  const PluginInfo& plugin() const override { return info_; }
  // Compressor::caps answers a reference that lives as long as the instance.
  const CompressorCaps& caps(DType) const override { return caps_; }
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = 16 + info.numel * 4;
    s.sum_header_bytes = 16;
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch&,
                    std::span<std::byte> out, void*) const override {
    const uint64_t n = 16 + info.numel * 4;
    if (out.size() < n) TERSE_THROW(InvalidArgument, "quant: output too small");
    const uint32_t magic = kMagic, pad = 0;
    std::memcpy(out.data(), &magic, 4);
    std::memcpy(out.data() + 4, &pad, 4);
    std::memcpy(out.data() + 8, &info.numel, 8);
    const auto* in = static_cast<const float*>(input);
    for (uint64_t i = 0; i < info.numel; ++i) {
      const float v = q(in[i]);
      std::memcpy(out.data() + 16 + 4 * i, &v, 4);
    }
    return n;
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch&, void* out,
                  bool accumulate, void*) const override {
    uint32_t magic = 0;
    uint64_t numel = 0;
    if (payload.size() < 16) TERSE_THROW(InvalidPayload, "quant: payload shorter than its header");
    std::memcpy(&magic, payload.data(), 4);
    std::memcpy(&numel, payload.data() + 8, 8);
    if (magic != kMagic) TERSE_THROW(InvalidPayload, "quant: bad magic");
    if (numel != info.numel || payload.size() != 16 + numel * 4)
      TERSE_THROW(InvalidPayload, "quant: payload of " << payload.size() << " B for " << info.numel << " values");
    auto* o = static_cast<float*>(out);
    for (uint64_t i = 0; i < numel; ++i) {
      float v;
      std::memcpy(&v, payload.data() + 16 + 4 * i, 4);
      o[i] = accumulate ? o[i] + v : v;
    }
  }
  uint64_t reduce(const TensorInfo&, std::span<const std::byte>, std::span<const std::byte>, const Scratch&,
                  std::span<std::byte>, void*) const override {
    TERSE_THROW(InvalidArgument, "quant: no reduce");
  }

 private:
  PluginInfo info_;
};

// Stateful ALLGATHER compressor: delta coding against what the receiver already holds. The encoder's state and the
// decoder's state are the running reconstruction r; a payload carries d = g - r (after both sides add it, r is the
// same bits on both), so a decoder shared by two senders would reconstruct garbage. That is why the shard keeps one
// decoder per (worker, piece).
class DeltaCompressor : public Compressor {
 public:
  static constexpr uint32_t kMagic = 0x544c4544;  // "DELT"
  DeltaCompressor() {
    info_.name = "delta";
    info_.description = "in-test";
    info_.version = "0";
    info_.abi_version = 1;
  }
  const PluginInfo& plugin() const override { return info_; }
  const CompressorCaps& caps(DType) const override { return caps_; }
  CompressorCaps caps_{.devices = TERSE_DEVICE_HOST, .aggregation = Aggregation::kAllgather, .stateful = true};
  CompressorSizes sizes(const TensorInfo& info) const override {
    CompressorSizes s;
    s.max_output_bytes = 16 + info.numel * 4;
    s.state_bytes = std::max<uint64_t>(info.numel * 4, 4);
    return s;
  }
  uint64_t compress(const TensorInfo& info, const void* input, std::span<const std::byte>, const Scratch& scratch,
                    std::span<std::byte> out, void*) const override {
    const uint64_t n = 16 + info.numel * 4;
    if (out.size() < n) TERSE_THROW(InvalidArgument, "delta: output too small");
    const uint32_t magic = kMagic, pad = 0;
    std::memcpy(out.data(), &magic, 4);
    std::memcpy(out.data() + 4, &pad, 4);
    std::memcpy(out.data() + 8, &info.numel, 8);
    const auto* in = static_cast<const float*>(input);
    auto* r = reinterpret_cast<float*>(scratch.state.data());
    for (uint64_t i = 0; i < info.numel; ++i) {
      const float d = in[i] - r[i];
      r[i] += d;
      std::memcpy(out.data() + 16 + 4 * i, &d, 4);
    }
    return n;
  }
  void decompress(const TensorInfo& info, std::span<const std::byte> payload, const Scratch& scratch, void* out,
                  bool accumulate, void*) const override {
    uint32_t magic = 0;
    uint64_t numel = 0;
    if (payload.size() < 16) TERSE_THROW(InvalidPayload, "delta: payload shorter than its header");
    std::memcpy(&magic, payload.data(), 4);
    std::memcpy(&numel, payload.data() + 8, 8);
    if (magic != kMagic || numel != info.numel || payload.size() != 16 + numel * 4)
      TERSE_THROW(InvalidPayload, "delta: malformed payload");
    auto* r = reinterpret_cast<float*>(scratch.state.data());
    auto* o = static_cast<float*>(out);
    for (uint64_t i = 0; i < numel; ++i) {
      float d;
      std::memcpy(&d, payload.data() + 16 + 4 * i, 4);
      r[i] += d;
      o[i] = accumulate ? o[i] + r[i] : r[i];
    }
  }
  uint64_t reduce(const TensorInfo&, std::span<const std::byte>, std::span<const std::byte>, const Scratch&,
                  std::span<std::byte>, void*) const override {
    TERSE_THROW(InvalidArgument, "delta: no reduce");
  }

 private:
  PluginInfo info_;
};

// Workers see different curvatures (their data differ) but share the optimum, so plain async SGD converges to it
// exactly instead of to a neighbourhood, which keeps the convergence test sharp.
float curvature(int worker, std::size_t i) {
  return 0.5f + 0.25f * static_cast<float>((i + static_cast<std::size_t>(worker)) % 5);
}
float target(std::size_t i) {
  return std::sin(0.37f * static_cast<float>(i) + 0.5f);
}
float initial(std::size_t i) {
  return 0.1f * static_cast<float>(i % 7) - 0.3f;
}

void gradient(int worker, std::span<const float> x, std::span<float> g) {
  for (std::size_t i = 0; i < x.size(); ++i) g[i] = curvature(worker, i) * (x[i] - target(i));
}

double distanceToOptimum(std::span<const float> x) {
  double d = 0;
  for (std::size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(x[i]) - target(i)));
  return d;
}

struct RunConfig {
  std::vector<uint64_t> tensors{7, 0, 13, 1, 30};
  int shards = 2;
  int workers = 2;
  int steps = 20;
  ServerOptions server;
  ClientOptions client;
  // Optional per-worker sleep between pull and push (compute time: stragglers, random interleavings).
  std::function<void(int worker, int step)> delay;
};

struct RunResult {
  std::vector<float> params;  // flat, gathered from the shards
  std::vector<ServerStats> stats;
  std::vector<comm::RankTraffic> traffic;
  std::vector<std::vector<uint64_t>> versions;
  PsPlan plan;
};

RunResult runPs(const RunConfig& cfg) {
  RunResult result;
  result.plan = planShards(cfg.tensors, cfg.shards);
  const PsPlan& plan = result.plan;
  auto fabric = InprocFabric::create(cfg.shards + cfg.workers);
  std::vector<std::unique_ptr<comm::Transport>> ts;
  for (int r = 0; r < cfg.shards + cfg.workers; ++r) ts.push_back(fabric->endpoint(r));
  std::vector<float> init(plan.total_numel);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = initial(i);
  std::vector<std::unique_ptr<ParamServerShard>> shards;
  for (int k = 0; k < cfg.shards; ++k) {
    const auto [b, e] = plan.ranges[static_cast<std::size_t>(k)];
    shards.push_back(
        std::make_unique<ParamServerShard>(*ts[static_cast<std::size_t>(k)], plan, k, cfg.workers,
                                           std::vector<float>(init.begin() + static_cast<std::ptrdiff_t>(b),
                                                              init.begin() + static_cast<std::ptrdiff_t>(e)),
                                           cfg.server));
  }
  auto spawn = spawnRanks(
      cfg.shards + cfg.workers,
      [&](int rank) {
        if (rank < cfg.shards) {
          shards[static_cast<std::size_t>(rank)]->run();
          return;
        }
        const int w = rank - cfg.shards;
        ParamServerClient client(*ts[static_cast<std::size_t>(rank)], plan, w, cfg.workers, cfg.client);
        std::vector<float> x(plan.total_numel), g(plan.total_numel);
        for (int t = 0; t < cfg.steps; ++t) {
          client.pull(static_cast<uint64_t>(t), x);
          if (cfg.delay) cfg.delay(w, t);  // compute time: between the read and the push, where staleness grows
          gradient(w, x, g);
          client.push(static_cast<uint64_t>(t), g);
        }
        client.bye();
      },
      fabric.get(), std::chrono::seconds(60));
  comm::testing::expectNoErrors(spawn);
  for (int k = 0; k < cfg.shards; ++k) {
    auto p = shards[static_cast<std::size_t>(k)]->params();
    result.params.insert(result.params.end(), p.begin(), p.end());
    result.stats.push_back(shards[static_cast<std::size_t>(k)]->stats());
    result.versions.push_back(shards[static_cast<std::size_t>(k)]->versions());
  }
  result.traffic = fabric->traffic();
  return result;
}

// Sync data-parallel SGD, computed locally: x <- x - lr * mean_w D(C_w(grad_w(x))), with each worker's codec chain
// (error feedback included) built exactly as the client builds it, per piece.
std::vector<float> syncReference(const RunConfig& cfg, const PsPlan& plan) {
  std::vector<float> x(plan.total_numel);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = initial(i);
  std::vector<std::vector<std::unique_ptr<TensorCodec>>> enc(static_cast<std::size_t>(cfg.workers));
  std::vector<std::vector<std::unique_ptr<TensorCodec>>> dec(static_cast<std::size_t>(cfg.workers));
  if (cfg.client.compressor) {
    for (int w = 0; w < cfg.workers; ++w)
      for (const PsPiece& p : plan.pieces) {
        TensorInfo t;
        t.numel = p.numel;
        t.ndim = 1;
        t.shape = {static_cast<int64_t>(p.numel), 0, 0, 0};
        t.tensor_id = p.id;
        t.rank = t.source_rank = w;
        t.world_size = cfg.workers;
        enc[static_cast<std::size_t>(w)].push_back(
            makeCodec(cfg.client.compressor, t, cfg.client.run_seed, cfg.client.codec));
        dec[static_cast<std::size_t>(w)].push_back(makePluginCodec(cfg.client.compressor, t, cfg.client.run_seed));
      }
  }
  std::vector<float> g(x.size()), d(x.size());
  std::vector<double> sum(x.size());
  for (int t = 0; t < cfg.steps; ++t) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int w = 0; w < cfg.workers; ++w) {
      gradient(w, x, g);
      if (cfg.client.compressor) {
        for (const PsPiece& p : plan.pieces) {
          std::vector<std::byte> buf(enc[static_cast<std::size_t>(w)][p.id]->sizes(0).max_output_bytes);
          const uint64_t n = enc[static_cast<std::size_t>(w)][p.id]->encode(static_cast<uint64_t>(t), 0,
                                                                            g.data() + p.flat_begin, {}, buf);
          dec[static_cast<std::size_t>(w)][p.id]->decode(
              static_cast<uint64_t>(t), std::span<const std::byte>(buf.data(), n), w, d.data() + p.flat_begin, false);
        }
      } else {
        d = g;
      }
      for (std::size_t i = 0; i < x.size(); ++i) sum[i] += d[i];
    }
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(x[i] - cfg.server.lr / cfg.workers * sum[i]);
  }
  return x;
}

void expectClose(const std::vector<float>& got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// ---- sharding ----

TEST(PsPlan, CoversTheVectorContiguouslyAndBalanced) {
  for (const std::vector<uint64_t>& sizes : std::vector<std::vector<uint64_t>>{
           {5, 0, 7, 1, 13}, {1000}, {100, 100, 100}, {}, {0, 0}, {3}, {1, 1, 1, 1, 1, 1, 1}}) {
    for (int S = 1; S <= 5; ++S) {
      const PsPlan plan = planShards(sizes, S);
      uint64_t total = 0;
      for (auto n : sizes) total += n;
      ASSERT_EQ(plan.total_numel, total);
      ASSERT_EQ(plan.ranges.size(), static_cast<std::size_t>(S));
      uint64_t at = 0;
      for (int k = 0; k < S; ++k) {
        EXPECT_EQ(plan.ranges[static_cast<std::size_t>(k)].first, at);
        at = plan.ranges[static_cast<std::size_t>(k)].second;
        // Balanced: within the snapping tolerance (total / 4S on each cut) plus rounding of the ideal.
        const double ideal = static_cast<double>(total) / S;
        const double len = static_cast<double>(plan.ranges[static_cast<std::size_t>(k)].second -
                                               plan.ranges[static_cast<std::size_t>(k)].first);
        EXPECT_LE(std::fabs(len - ideal), 2.0 * (static_cast<double>(total) / (4.0 * S)) + 2.0)
            << "shard " << k << " of " << S;
      }
      EXPECT_EQ(at, total);
      uint64_t flat = 0;
      for (const PsPiece& p : plan.pieces) {
        EXPECT_GT(p.numel, 0u);
        EXPECT_EQ(p.flat_begin, flat);
        flat += p.numel;
        const auto [b, e] = plan.ranges[static_cast<std::size_t>(p.shard)];
        EXPECT_GE(p.flat_begin, b);
        EXPECT_LE(p.flat_begin + p.numel, e);
      }
      EXPECT_EQ(flat, total);
    }
  }
  // Tensor boundaries are kept where they are close to the balanced cut: three equal tensors on three shards.
  const PsPlan even = planShards(std::vector<uint64_t>{100, 100, 100}, 3);
  ASSERT_EQ(even.pieces.size(), 3u);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(even.pieces[static_cast<std::size_t>(k)].shard, k);
  // ... and a tensor is split when no boundary is near.
  const PsPlan one = planShards(std::vector<uint64_t>{1000}, 3);
  ASSERT_EQ(one.pieces.size(), 3u);
  EXPECT_EQ(one.pieces[1].offset, 333u);
  EXPECT_THROW(planShards(std::vector<uint64_t>{1}, 0), InvalidArgument);
}

// ---- s = 0 equals sync; accounting ----

void checkAccounting(const RunConfig& cfg, const RunResult& r) {
  for (int k = 0; k < cfg.shards; ++k) {
    const ServerStats& s = r.stats[static_cast<std::size_t>(k)];
    const uint64_t pieces = r.plan.shard_pieces[static_cast<std::size_t>(k)].size();
    EXPECT_EQ(s.pushes_applied, pieces * static_cast<uint64_t>(cfg.workers * cfg.steps)) << "shard " << k;
    EXPECT_EQ(s.pulls_served, pieces ? static_cast<uint64_t>(cfg.workers * cfg.steps) : 0u) << "shard " << k;
    EXPECT_EQ(s.refused, 0u);
    uint64_t hist = 0;
    for (auto [tau, n] : s.staleness) hist += n;
    EXPECT_EQ(hist, s.pushes_applied) << "shard " << k;
    for (uint64_t v : r.versions[static_cast<std::size_t>(k)])
      EXPECT_EQ(v, static_cast<uint64_t>(cfg.workers * cfg.steps));
    // The shard's own per-worker counts add up to what the transport counted on its rank.
    uint64_t in = 0, out = 0;
    for (auto b : s.bytes_in) in += b;
    for (auto b : s.bytes_out) out += b;
    EXPECT_EQ(in, r.traffic[static_cast<std::size_t>(k)].received.total().bytes) << "shard " << k;
    EXPECT_EQ(out, r.traffic[static_cast<std::size_t>(k)].sent.total().bytes) << "shard " << k;
    // Every worker sent every shard a bye at least.
    for (auto b : s.bytes_in) EXPECT_GE(b, comm::frameWireBytes(kPsRequestHeaderBytes));
  }
}

class PsGrid : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(PsGrid, LockstepEqualsSyncDataParallelSgd) {
  RunConfig cfg;
  std::tie(cfg.shards, cfg.workers) = GetParam();
  cfg.server.staleness_bound = 0;
  cfg.server.lr = 0.5;
  // Random per-step delays: the interleaving changes, the result must not (beyond summation order).
  cfg.delay = [](int w, int t) {
    if ((w * 7 + t * 3) % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
  };
  const RunResult r = runPs(cfg);
  // The shard adds W scaled gradients one at a time in arrival order, the reference sums them first in double: equal
  // up to float rounding of the order.
  expectClose(r.params, syncReference(cfg, r.plan), 2e-5f);
  checkAccounting(cfg, r);
  for (const auto& s : r.stats)
    for (auto [tau, n] : s.staleness)
      EXPECT_LT(tau, static_cast<uint64_t>(cfg.workers)) << "s = 0 admits only this step's pushes";
}

TEST_P(PsGrid, LockstepWithCompressionAndErrorFeedbackEqualsSync) {
  RunConfig cfg;
  std::tie(cfg.shards, cfg.workers) = GetParam();
  cfg.server.staleness_bound = 0;
  cfg.server.lr = 0.5;
  auto c = std::make_shared<QuantCompressor>();
  cfg.server.compressor = c;
  cfg.client.compressor = c;
  cfg.client.codec.error_feedback = true;
  const RunResult r = runPs(cfg);
  expectClose(r.params, syncReference(cfg, r.plan), 2e-5f);
  // The reference without error feedback differs: the test sees the residual.
  RunConfig no_ef = cfg;
  no_ef.client.codec.error_feedback = false;
  const auto other = syncReference(no_ef, r.plan);
  float diff = 0;
  for (std::size_t i = 0; i < other.size(); ++i) diff = std::max(diff, std::fabs(other[i] - r.params[i]));
  EXPECT_GT(diff, 1e-4f);
  checkAccounting(cfg, r);
}

TEST_P(PsGrid, LockstepWithAStatefulAllgatherDecoderEqualsSync) {
  RunConfig cfg;
  std::tie(cfg.shards, cfg.workers) = GetParam();
  cfg.server.staleness_bound = 0;
  cfg.server.lr = 0.5;
  auto c = std::make_shared<DeltaCompressor>();
  cfg.server.compressor = c;
  cfg.client.compressor = c;
  const RunResult r = runPs(cfg);
  expectClose(r.params, syncReference(cfg, r.plan), 2e-5f);
  checkAccounting(cfg, r);
}

INSTANTIATE_TEST_SUITE_P(ShardsWorkers, PsGrid,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2, 4)));

TEST(PsEdge, EmptyShardsAndAllEmptyModel) {
  // Three shards for two elements: the plan leaves a shard empty; its server only ever sees byes and must finish.
  RunConfig cfg;
  cfg.tensors = {0, 2, 0};
  cfg.shards = 3;
  cfg.workers = 2;
  cfg.server.staleness_bound = 0;
  cfg.server.lr = 0.5;
  const RunResult r = runPs(cfg);
  std::size_t empty = 0;
  for (const auto& p : r.plan.shard_pieces) empty += p.empty() ? 1 : 0;
  EXPECT_GE(empty, 1u);
  expectClose(r.params, syncReference(cfg, r.plan), 2e-5f);
  checkAccounting(cfg, r);
  // No parameters at all: nothing to pull or push, the run still completes.
  RunConfig none;
  none.tensors = {0};
  none.shards = 2;
  const RunResult n = runPs(none);
  EXPECT_TRUE(n.params.empty());
}

// ---- async and SSP ----

TEST(PsAsync, ConvergesOnTheQuadratic) {
  for (bool aware : {false, true}) {
    RunConfig cfg;
    cfg.shards = 2;
    cfg.workers = 4;
    cfg.steps = 120;
    cfg.server.lr = 0.5;
    cfg.server.staleness_aware_lr = aware;
    cfg.delay = [](int w, int t) {
      if ((w + t) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(100 * (w + 1)));
    };
    const RunResult r = runPs(cfg);
    std::vector<float> x0(r.plan.total_numel);
    for (std::size_t i = 0; i < x0.size(); ++i) x0[i] = initial(i);
    const double start = distanceToOptimum(x0);
    const double end = distanceToOptimum(r.params);
    EXPECT_GT(start, 0.5);
    EXPECT_LT(end, 1e-3) << "staleness-aware " << aware << ", started at " << start;
    uint64_t hist = 0;
    for (const auto& s : r.stats)
      for (auto [tau, n] : s.staleness) hist += n;
    EXPECT_EQ(hist, 120u * 4u * r.plan.pieces.size());
  }
}

TEST(PsSsp, StalenessStaysWithinTheBound) {
  // A worker reads step t after all live workers completed t - s, and its push waits until all read t - s, so between
  // its read and its push each other worker pushed at most steps t - s .. t + s: tau <= (W - 1)(2s + 1).
  for (uint64_t s : {0u, 1u, 3u}) {
    RunConfig cfg;
    cfg.shards = 2;
    cfg.workers = 3;
    cfg.steps = 30;
    cfg.server.staleness_bound = s;
    cfg.server.lr = 0.3;
    cfg.delay = [](int w, int t) {
      // Worker 0 is a straggler, the others race ahead as far as the bound lets them.
      if (w == 0 || (t * 5 + w) % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(w == 0 ? 800 : 200));
    };
    const RunResult r = runPs(cfg);
    uint64_t max_tau = 0;
    for (const auto& st : r.stats)
      for (auto [tau, n] : st.staleness) max_tau = std::max(max_tau, tau);
    EXPECT_LE(max_tau, (cfg.workers - 1) * (2 * s + 1)) << "s = " << s;
    checkAccounting(cfg, r);
  }
}

TEST(PsPull, CastsToHalfAndBfloatOnTheWayDown) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const PsPlan plan = planShards(std::vector<uint64_t>{9, 4}, 2);
    auto fabric = InprocFabric::create(3);
    auto s0 = fabric->endpoint(0), s1 = fabric->endpoint(1), w0 = fabric->endpoint(2);
    std::vector<float> init(plan.total_numel);
    for (std::size_t i = 0; i < init.size(); ++i) init[i] = 0.1234567f * static_cast<float>(i) - 0.377f;
    auto slice = [&](int k) {
      const auto [b, e] = plan.ranges[static_cast<std::size_t>(k)];
      return std::vector<float>(init.begin() + static_cast<std::ptrdiff_t>(b),
                                init.begin() + static_cast<std::ptrdiff_t>(e));
    };
    ParamServerShard a(*s0, plan, 0, 1, slice(0), {}), b(*s1, plan, 1, 1, slice(1), {});
    std::vector<float> got(plan.total_numel);
    uint64_t down_bytes = 0;
    auto spawn = spawnRanks(
        3,
        [&](int rank) {
          if (rank == 0) return a.run();
          if (rank == 1) return b.run();
          ClientOptions o;
          o.pull_dtype = dt;
          ParamServerClient c(*w0, plan, 0, 1, o);
          c.pull(0, got);
          down_bytes = w0->traffic().received.total().bytes;
          c.bye();
        },
        fabric.get(), std::chrono::seconds(30));
    comm::testing::expectNoErrors(spawn);
    for (std::size_t i = 0; i < init.size(); ++i) {
      const float want =
          dt == DType::kF16 ? sdk::halfToFloat(sdk::floatToHalf(init[i])) : sdk::bf16ToFloat(sdk::floatToBf16(init[i]));
      EXPECT_EQ(got[i], want) << i;
    }
    // Two bytes a value on the way down, plus headers and the versions.
    EXPECT_EQ(down_bytes, 2 * comm::frameWireBytes(kPsReplyHeaderBytes) + plan.pieces.size() * 8 + 2 * init.size());
  }
}

// ---- malformed requests ----

TEST(PsMalformed, EachKindIsRefusedAndTheShardKeepsServing) {
  const PsPlan plan = planShards(std::vector<uint64_t>{6, 10}, 1);
  auto fabric = InprocFabric::create(2);
  auto server_t = fabric->endpoint(0), worker_t = fabric->endpoint(1);
  auto comp = std::make_shared<QuantCompressor>();
  ServerOptions so;
  so.compressor = comp;
  ParamServerShard shard(*server_t, plan, 0, 1, std::vector<float>(16, 1.0f), so);
  std::vector<std::string> replies;
  int cases = 0;
  auto spawn = spawnRanks(
      2,
      [&](int rank) {
        if (rank == 0) return shard.run();
        ClientOptions co;
        co.compressor = comp;
        ParamServerClient client(*worker_t, plan, 0, 1, co);
        // A push before any pull is itself refused; then a good pull so later pushes reach the deeper checks.
        auto send = [&](const PsRequestHeader& h, std::vector<std::byte> payload, bool fix_length = true) {
          PsRequestHeader hh = h;
          if (fix_length) hh.payload_bytes = payload.size();
          std::vector<std::byte> f(kPsRequestHeaderBytes);
          encodePsRequest(hh, std::span<std::byte, kPsRequestHeaderBytes>(f.data(), kPsRequestHeaderBytes));
          f.insert(f.end(), payload.begin(), payload.end());
          worker_t->send(serverRank(0), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag}, f);
          std::vector<std::byte> r(4096);
          const uint64_t n = worker_t->recv(serverRank(0), comm::FrameMeta{comm::OpKind::kP2P, kPsReplyTag}, r);
          const PsReplyHeader rh = decodePsReply(std::span<const std::byte>(r.data(), n));
          EXPECT_EQ(rh.status, PsStatus::kError);
          replies.emplace_back(reinterpret_cast<const char*>(r.data() + kPsReplyHeaderBytes), rh.payload_bytes);
          ++cases;
        };
        auto goodPayload = [&](uint64_t numel) {
          std::vector<float> g(numel, 0.5f);
          TensorInfo t;
          t.numel = numel;
          std::vector<std::byte> p(16 + numel * 4);
          comp->compress(t, g.data(), {}, {}, p, nullptr);
          return p;
        };
        PsRequestHeader push;
        push.op = PsOp::kPush;
        push.piece = 0;
        push.numel = 6;
        send(push, goodPayload(6));  // before its pull
        std::vector<float> x(16);
        client.pull(0, x);
        PsRequestHeader bad_len = push;
        bad_len.payload_bytes = 5;
        send(bad_len, goodPayload(6), false);
        PsRequestHeader unknown = push;
        unknown.piece = 7;
        send(unknown, goodPayload(6));
        PsRequestHeader range = push;
        range.offset = 2;
        send(range, goodPayload(6));
        PsRequestHeader future = push;
        future.worker_version = 3;
        send(future, goodPayload(6));
        auto corrupt = goodPayload(6);
        corrupt[0] = std::byte{0};
        send(push, corrupt);
        send(push, goodPayload(5));  // decodes to the wrong element count
        auto nan = goodPayload(6);
        const float qnan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(nan.data() + 16, &qnan, 4);
        send(push, nan);
        {  // bad magic in the request header itself
          std::vector<std::byte> f(kPsRequestHeaderBytes, std::byte{0x11});
          worker_t->send(serverRank(0), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag}, f);
          std::vector<std::byte> r(4096);
          const uint64_t n = worker_t->recv(serverRank(0), comm::FrameMeta{comm::OpKind::kP2P, kPsReplyTag}, r);
          const PsReplyHeader rh = decodePsReply(std::span<const std::byte>(r.data(), n));
          EXPECT_EQ(rh.status, PsStatus::kError);
          replies.emplace_back(reinterpret_cast<const char*>(r.data() + kPsReplyHeaderBytes), rh.payload_bytes);
          ++cases;
        }
        // Far above the largest payload, so the shard's receive itself fails. Kept below the inproc eager limit: a
        // rendezvous-sized frame that a receive refuses never wakes its blocked sender (inproc_transport.cc match()
        // marks it done without notifying the link), a transport issue outside this test's subject.
        send(push, std::vector<std::byte>(1000));
        // The shard still serves: a good push through the client applies.
        std::vector<float> g(16, 0.25f);
        client.push(0, g);
        client.pull(1, x);
        for (float v : x) EXPECT_FLOAT_EQ(v, 1.0f - 0.1f * 0.25f);
        client.bye();
      },
      fabric.get(), std::chrono::seconds(30));
  comm::testing::expectNoErrors(spawn);
  const std::vector<std::string> needles = {"before its pull", "payload bytes",    "does not own",     "of tensor 0",
                                            "from the future", "failed to decode", "failed to decode", "non-finite",
                                            "bad magic",       "receive buffer"};
  ASSERT_EQ(replies.size(), needles.size());
  for (std::size_t i = 0; i < needles.size(); ++i)
    EXPECT_NE(replies[i].find(needles[i]), std::string::npos) << "case " << i << ": " << replies[i];
  const ServerStats s = shard.stats();
  EXPECT_EQ(s.refused, static_cast<uint64_t>(cases));
  EXPECT_EQ(s.pushes_applied, 2u);
  // Refused frames are counted like any other, on both sides, except the one the receive itself failed on: the
  // transport counts it but does not tell the shard its length.
  const auto traffic = fabric->traffic();
  EXPECT_EQ(s.bytes_in[0] + comm::frameWireBytes(kPsRequestHeaderBytes + 1000), traffic[0].received.total().bytes);
  EXPECT_EQ(s.bytes_out[0], traffic[0].sent.total().bytes);
}

TEST(PsMalformed, ConstructionRejectsBadSetups) {
  const PsPlan plan = planShards(std::vector<uint64_t>{4}, 1);
  auto ts = comm::makeInprocTransports(2);
  EXPECT_THROW(ParamServerShard(*ts[0], plan, 0, 2, std::vector<float>(4), {}), InvalidArgument);  // 1 + 2 != 2
  EXPECT_THROW(ParamServerShard(*ts[0], plan, 0, 1, std::vector<float>(3), {}), InvalidArgument);
  EXPECT_THROW(ParamServerShard(*ts[1], plan, 0, 1, std::vector<float>(4), {}), InvalidArgument);  // wrong rank
  ClientOptions o;
  o.pull_dtype = DType::kI32;
  EXPECT_THROW(ParamServerClient(*ts[1], plan, 0, 1, o), InvalidArgument);
  // A CUSTOM compressor's payloads only make sense folded with the other ranks' (reduce); a push must decode alone.
  class CustomQuant : public QuantCompressor {
   public:
    CustomQuant() { caps_.aggregation = Aggregation::kCustom; }
  };
  ServerOptions so;
  so.compressor = std::make_shared<CustomQuant>();
  try {
    ParamServerShard shard(*ts[0], plan, 0, 1, std::vector<float>(4), so);
    ADD_FAILURE() << "a CUSTOM compressor was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("CUSTOM"), std::string::npos) << e.what();
  }
  ClientOptions co;
  co.compressor = so.compressor;
  EXPECT_THROW(ParamServerClient(*ts[1], plan, 0, 1, co), InvalidArgument);
}

// ---- elastic ----

TEST(PsElastic, ADeadWorkerStopsBlockingTheOthersAfterTheTimeout) {
  const PsPlan plan = planShards(std::vector<uint64_t>{11, 5, 9}, 2);
  constexpr int kShards = 2, kWorkers = 3;
  auto fabric = InprocFabric::create(kShards + kWorkers);
  std::vector<std::unique_ptr<comm::Transport>> ts;
  for (int r = 0; r < kShards + kWorkers; ++r) ts.push_back(fabric->endpoint(r));
  ServerOptions so;
  so.staleness_bound = 0;  // lockstep: the strongest case, every other worker waits on the dead one
  so.worker_timeout = std::chrono::milliseconds(400);
  std::vector<std::unique_ptr<ParamServerShard>> shards;
  for (int k = 0; k < kShards; ++k) {
    const auto [b, e] = plan.ranges[static_cast<std::size_t>(k)];
    shards.push_back(std::make_unique<ParamServerShard>(*ts[static_cast<std::size_t>(k)], plan, k, kWorkers,
                                                        std::vector<float>(e - b, 0.0f), so));
  }
  std::atomic<bool> ghost_done{false};
  std::string ghost_error;
  std::atomic<int> survivor_steps[2] = {0, 0};
  auto spawn = spawnRanks(
      kShards + kWorkers,
      [&](int rank) {
        if (rank < kShards) return shards[static_cast<std::size_t>(rank)]->run();
        const int w = rank - kShards;
        ClientOptions co;
        co.heartbeat = std::chrono::milliseconds(50);  // well inside the timeout while held by the other shard
        ParamServerClient client(*ts[static_cast<std::size_t>(rank)], plan, w, kWorkers, co);
        std::vector<float> x(plan.total_numel), g(plan.total_numel);
        if (w == 2) {
          // Two steps, then silence (a crashed process), then it speaks again and must be refused, not ignored.
          for (uint64_t t = 0; t < 2; ++t) {
            client.pull(t, x);
            gradient(w, x, g);
            client.push(t, g);
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1200));
          try {
            client.pull(2, x);
          } catch (const PsRefused& e) {
            ghost_error = e.what();
          }
          ghost_done = true;
          return;
        }
        for (uint64_t t = 0; t < 10 || !ghost_done.load(); ++t) {
          client.pull(t, x);
          gradient(w, x, g);
          client.push(t, g);
          ++survivor_steps[w];
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        client.bye();
      },
      fabric.get(), std::chrono::seconds(30));
  comm::testing::expectNoErrors(spawn);
  EXPECT_NE(ghost_error.find("declared dead"), std::string::npos) << ghost_error;
  for (int w = 0; w < 2; ++w) EXPECT_GE(survivor_steps[w].load(), 10);
  for (const auto& s : shards) {
    const ServerStats st = s->stats();
    EXPECT_TRUE(st.dead[2]);
    EXPECT_FALSE(st.dead[0]);
    EXPECT_FALSE(st.dead[1]);
  }
}

// ---- the shard's optimizer, snapshots, a dead server ----

TEST(PsOptimizer, OneWorkerMatchesTheSgdOptimizerWithMomentumWeightDecayAndSchedule) {
  // With one worker every push is one whole step, so the shard's per-push update must be optimizer.h's, bit for bit.
  for (const bool nesterov : {false, true}) {
    RunConfig cfg;
    cfg.shards = 2;
    cfg.workers = 1;
    cfg.steps = 15;
    cfg.server.staleness_bound = 0;
    cfg.server.sgd = SgdOptions{0.9, nesterov, 0.01};
    LrScheduleOptions lr;
    lr.lr = 0.2;
    lr.schedule = LrSchedule::kCosine;
    lr.warmup_steps = 3;
    lr.total_steps = cfg.steps;
    cfg.server.lr = lr.lr;
    cfg.server.lr_schedule = [lr](uint64_t t) { return learningRate(lr, static_cast<int64_t>(t)); };
    const RunResult r = runPs(cfg);

    std::vector<ParamTensor> ref(1);
    ref[0].value.resize(r.plan.total_numel);
    ref[0].grad.resize(r.plan.total_numel);
    for (std::size_t i = 0; i < ref[0].value.size(); ++i) ref[0].value[i] = initial(i);
    SgdOptimizer opt(ref, cfg.server.sgd);
    for (int t = 0; t < cfg.steps; ++t) {
      gradient(0, ref[0].value, ref[0].grad);
      opt.update(0, ref[0], learningRate(lr, t));
    }
    ASSERT_EQ(r.params.size(), ref[0].value.size());
    for (std::size_t i = 0; i < r.params.size(); ++i)
      EXPECT_EQ(r.params[i], ref[0].value[i]) << "element " << i << (nesterov ? " (nesterov)" : "");
  }
}

TEST(PsSnapshot, LockstepSnapshotsHoldExactlyTheStepsBeforeThem) {
  RunConfig cfg;
  cfg.shards = 2;
  cfg.workers = 3;
  cfg.steps = 12;
  cfg.server.staleness_bound = 0;
  cfg.server.lr = 0.5;
  cfg.server.snapshot_steps = {1, 4, 5, 11};
  cfg.delay = [](int w, int t) {
    if ((w + t) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(400));
  };
  // runPs gathers only the final parameters: run it here with the shards kept to take their snapshots.
  const PsPlan plan = planShards(cfg.tensors, cfg.shards);
  auto fabric = InprocFabric::create(cfg.shards + cfg.workers);
  std::vector<std::unique_ptr<comm::Transport>> ts;
  for (int r = 0; r < cfg.shards + cfg.workers; ++r) ts.push_back(fabric->endpoint(r));
  std::vector<std::unique_ptr<ParamServerShard>> shards;
  for (int k = 0; k < cfg.shards; ++k) {
    const auto [b, e] = plan.ranges[static_cast<std::size_t>(k)];
    std::vector<float> init;
    for (uint64_t i = b; i < e; ++i) init.push_back(initial(i));
    shards.push_back(std::make_unique<ParamServerShard>(*ts[static_cast<std::size_t>(k)], plan, k, cfg.workers,
                                                        std::move(init), cfg.server));
  }
  auto spawn = spawnRanks(
      cfg.shards + cfg.workers,
      [&](int rank) {
        if (rank < cfg.shards) return shards[static_cast<std::size_t>(rank)]->run();
        const int w = rank - cfg.shards;
        ParamServerClient client(*ts[static_cast<std::size_t>(rank)], plan, w, cfg.workers, cfg.client);
        std::vector<float> x(plan.total_numel), g(plan.total_numel);
        for (int t = 0; t < cfg.steps; ++t) {
          client.pull(static_cast<uint64_t>(t), x);
          cfg.delay(w, t);
          gradient(w, x, g);
          client.push(static_cast<uint64_t>(t), g);
        }
        client.bye();
      },
      fabric.get(), std::chrono::seconds(60));
  comm::testing::expectNoErrors(spawn);
  for (uint64_t point : cfg.server.snapshot_steps) {
    std::vector<float> got;
    for (auto& shard : shards) {
      auto snap = shard->takeSnapshot(point, std::chrono::milliseconds(0));
      ASSERT_TRUE(snap.has_value()) << "step " << point;
      EXPECT_EQ(snap->step, point);
      got.insert(got.end(), snap->params.begin(), snap->params.end());
    }
    RunConfig upto = cfg;
    upto.steps = static_cast<int>(point);
    expectClose(got, syncReference(upto, plan), 2e-5f);
    // Handed over once.
    EXPECT_FALSE(shards[0]->takeSnapshot(point, std::chrono::milliseconds(0)).has_value());
  }
  EXPECT_FALSE(shards[0]->takeSnapshot(12, std::chrono::milliseconds(10)).has_value()) << "not a snapshot step";
}

TEST(PsFaults, AServerThatDiesFailsTheWorkersWithAClearError) {
  const PsPlan plan = planShards(std::vector<uint64_t>{64, 64}, 2);
  auto fabric = InprocFabric::create(2 + 1);
  std::vector<std::unique_ptr<comm::Transport>> ts;
  for (int r = 0; r < 3; ++r) ts.push_back(fabric->endpoint(r));
  ServerOptions so;
  ParamServerShard alive(*ts[0], plan, 0, 1, std::vector<float>(plan.ranges[0].second, 0.0f), so);
  std::thread server([&] {
    try {
      alive.run();
    } catch (const comm::CommError&) {
      // The job was aborted by the dead shard's failure: expected.
    }
  });
  // Shard 1 never serves: it "dies" once the worker waits on it, as a crashed shard process's transport would report.
  std::thread death([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ts[1]->abort("server shard 1 crashed");
  });
  ParamServerClient client(*ts[2], plan, 0, 1, ClientOptions{});
  std::vector<float> x(plan.total_numel);
  try {
    client.pull(0, x);
    ADD_FAILURE() << "the pull completed without shard 1";
  } catch (const comm::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("server shard 1 crashed"), std::string::npos) << e.what();
  }
  death.join();
  alive.stop();
  server.join();
}

}  // namespace
}  // namespace terse::train
