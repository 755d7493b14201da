// Row-sparse tensors through the parameter server (param_server_wire.h's row frames) and the async workers' gradient
// accumulation: with one worker and s = 0, pushing and pulling rows gives the parameters the dense frames give; the
// shard's byte counts equal the frames' sizes by hand; repeated, empty and complete row sets; malformed row frames
// refused by name while the shard keeps serving; and on glove through AsyncWorker, sparse equals dense and k
// micro-batches of b equal one batch of k b. About 0.2 s.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/comm/frame.h"
#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "core/train/async_trainer.h"
#include "core/train/param_server_client.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_shard.h"
#include "core/train/param_server_wire.h"
#include "experiments/workloads/glove.h"
#include "tests/comm/comm_test_util.h"
#include "tests/train/glove_test_corpus.h"

namespace terse::train {
namespace {

using comm::InprocFabric;
using comm::testing::spawnRanks;

// A job of `shards` shards and one worker whose body `work` runs on the worker's thread; the shards' parameters
// (gathered) and stats come back.
struct Job {
  std::vector<float> params;
  std::vector<ServerStats> stats;
  std::vector<comm::RankTraffic> traffic;
};

Job runJob(const PsPlan& plan, std::vector<float> init, const ServerOptions& so,
           const std::function<void(comm::Transport&)>& work) {
  const int S = plan.num_shards;
  auto fabric = InprocFabric::create(S + 1);
  std::vector<std::unique_ptr<comm::Transport>> ts;
  for (int r = 0; r <= S; ++r) ts.push_back(fabric->endpoint(r));
  std::vector<std::unique_ptr<ParamServerShard>> shards;
  for (int k = 0; k < S; ++k) {
    const auto [b, e] = plan.ranges[static_cast<std::size_t>(k)];
    shards.push_back(
        std::make_unique<ParamServerShard>(*ts[static_cast<std::size_t>(k)], plan, k, 1,
                                           std::vector<float>(init.begin() + static_cast<std::ptrdiff_t>(b),
                                                              init.begin() + static_cast<std::ptrdiff_t>(e)),
                                           so));
  }
  auto spawn = spawnRanks(
      S + 1,
      [&](int rank) {
        if (rank < S) return shards[static_cast<std::size_t>(rank)]->run();
        work(*ts[static_cast<std::size_t>(rank)]);
      },
      fabric.get(), std::chrono::seconds(60));
  comm::testing::expectNoErrors(spawn);
  Job job;
  for (const auto& s : shards) {
    const auto p = s->params();
    job.params.insert(job.params.end(), p.begin(), p.end());
    job.stats.push_back(s->stats());
  }
  job.traffic = fabric->traffic();
  return job;
}

// ---- A synthetic model: tensors A (10 rows of 3, row-sparse), B (7, dense), C (9 rows of 1, row-sparse), cut over
// two shards at element 23, inside row 7 of A, so a row is split between two pieces.

const std::vector<uint64_t> kTensors{30, 7, 9};
const std::vector<uint64_t> kRowLength{3, 0, 1};  // 0: dense

PsPlan sparsePlan(int shards, bool sparse) {
  PsPlan plan = planShards(kTensors, shards);
  if (sparse)
    for (uint32_t t = 0; t < kTensors.size(); ++t)
      if (kRowLength[t] > 0) markRowSparse(plan, t, kRowLength[t]);
  return plan;
}

// Step t's rows of A and C, with repeats and in no order: step 0 none, step 1 all, later a few.
std::vector<std::vector<int64_t>> stepRows(int t) {
  if (t == 0) return {{}, {}, {}};
  if (t == 1) return {{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}, {}, {0, 1, 2, 3, 4, 5, 6, 7, 8}};
  return {{(3 * t) % 10, 7, (3 * t) % 10, 2}, {}, {t % 9, (t * 5) % 9, t % 9}};
}

// The gradient of 1/2 sum a_i (x_i - c_i)^2 restricted to step t's rows of A and C (all of B): what a workload
// reading only those rows reports.
void maskedGradient(int t, std::span<const float> x, std::span<float> g) {
  std::fill(g.begin(), g.end(), 0.0f);
  const auto rows = stepRows(t);
  uint64_t at = 0;
  for (std::size_t k = 0; k < kTensors.size(); ++k) {
    auto touch = [&](uint64_t i) {
      g[i] = (0.5f + 0.1f * static_cast<float>(i % 4)) * (x[i] - std::sin(0.3f * static_cast<float>(i)));
    };
    if (kRowLength[k] == 0) {
      for (uint64_t i = 0; i < kTensors[k]; ++i) touch(at + i);
    } else {
      for (int64_t r : rows[k])
        for (uint64_t c = 0; c < kRowLength[k]; ++c) touch(at + static_cast<uint64_t>(r) * kRowLength[k] + c);
    }
    at += kTensors[k];
  }
}

std::vector<float> initialValues() {
  std::vector<float> v(46);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * static_cast<float>(i % 9) - 0.2f;
  return v;
}

Job runSynthetic(bool sparse, bool adagrad, int shards, ClientOptions co = {}) {
  const PsPlan plan = sparsePlan(shards, sparse);
  ServerOptions so;
  so.lr = 0.3;
  so.staleness_bound = 0;
  so.sgd.adagrad = adagrad;
  return runJob(plan, initialValues(), so, [&](comm::Transport& t) {
    ParamServerClient client(t, plan, 0, 1, co);
    std::vector<float> x(plan.total_numel), g(plan.total_numel);
    for (int s = 0; s < 8; ++s) {
      const auto rows = stepRows(s);
      client.pull(static_cast<uint64_t>(s), x,
                  sparse ? std::span<const std::vector<int64_t>>(rows) : std::span<const std::vector<int64_t>>());
      maskedGradient(s, x, g);
      client.push(static_cast<uint64_t>(s), g, rows);
    }
    client.bye();
  });
}

TEST(PsSparse, RowPushesAndPullsEqualDenseOnesWithOneWorkerInLockstep) {
  for (bool adagrad : {false, true})
    for (int shards : {1, 2}) {
      const Job dense = runSynthetic(false, adagrad, shards);
      const Job sparse = runSynthetic(true, adagrad, shards);
      ASSERT_EQ(dense.params.size(), sparse.params.size());
      const std::vector<float> init = initialValues();
      bool moved = false;
      for (std::size_t i = 0; i < dense.params.size(); ++i) {
        EXPECT_FLOAT_EQ(sparse.params[i], dense.params[i]) << "element " << i << ", adagrad " << adagrad;
        moved = moved || dense.params[i] != init[i];
      }
      EXPECT_TRUE(moved);
      for (const auto& s : sparse.stats) EXPECT_EQ(s.refused, 0u);
      uint64_t sparse_bytes = 0, dense_bytes = 0;
      for (const auto& s : sparse.stats) sparse_bytes += s.bytes_in[0] + s.bytes_out[0];
      for (const auto& s : dense.stats) dense_bytes += s.bytes_in[0] + s.bytes_out[0];
      EXPECT_LT(sparse_bytes, dense_bytes);
    }
}

// One shard, model A (5 rows of 4, row-sparse), B (3, dense), C (6 rows of 1, row-sparse): every frame by hand.
TEST(PsSparse, ByteCountsEqualTheFramesByHand) {
  PsPlan plan = planShards(std::vector<uint64_t>{20, 3, 6}, 1);
  markRowSparse(plan, 0, 4);
  markRowSparse(plan, 2, 1);
  const std::vector<std::vector<std::vector<int64_t>>> steps = {
      {{}, {}, {}}, {{4, 0, 4, 2}, {}, {5}}, {{0, 1, 2, 3, 4}, {}, {0, 1, 2, 3, 4, 5}}};
  const uint64_t F = comm::kFrameHeaderBytes, H = kPsRequestHeaderBytes, R = kPsReplyHeaderBytes;
  uint64_t in = F + H, out = 0, payload = 0;  // the bye
  for (const auto& rows : steps) {
    const uint64_t a = std::set<int64_t>(rows[0].begin(), rows[0].end()).size();
    const uint64_t c = std::set<int64_t>(rows[2].begin(), rows[2].end()).size();
    in += F + H + (4 + 4 * a) + (4 + 4 * c);                                  // pull: two row lists
    out += F + R + 3 * 8 + 4 * (4 * a + 3 + c);                               // its reply: versions, values
    const uint64_t pa = 8 + 4 * a + 16 * a, pb = 12, pc = 8 + 4 * c + 4 * c;  // push payloads
    in += 3 * (F + H) + pa + pb + pc + F + H;                                 // three pushes and the clock
    out += 4 * (F + R);                                                       // their replies
    payload += pa + pb + pc;
  }
  uint64_t client_payload = 0;
  const Job job = runJob(plan, std::vector<float>(29, 1.0f), ServerOptions{}, [&](comm::Transport& t) {
    ParamServerClient client(t, plan, 0, 1, {});
    std::vector<float> x(29), g(29, 0.0f);
    for (std::size_t s = 0; s < steps.size(); ++s) {
      client.pull(s, x, steps[s]);
      client.push(s, g, steps[s]);
    }
    client_payload = client.payloadBytes();
    client.bye();
  });
  EXPECT_EQ(job.stats[0].bytes_in[0], in);
  EXPECT_EQ(job.stats[0].bytes_out[0], out);
  EXPECT_EQ(job.traffic[0].received.total().bytes, in);
  EXPECT_EQ(job.traffic[0].sent.total().bytes, out);
  EXPECT_EQ(client_payload, payload);
}

TEST(PsSparse, MalformedRowFramesAreRefusedByNameAndTheShardKeepsServing) {
  PsPlan plan = planShards(std::vector<uint64_t>{20, 3}, 1);
  markRowSparse(plan, 0, 4);
  std::vector<std::string> replies;
  const Job job = runJob(plan, std::vector<float>(23, 1.0f), ServerOptions{}, [&](comm::Transport& t) {
    ParamServerClient client(t, plan, 0, 1, {});
    auto send = [&](PsOp op, uint64_t piece, uint64_t numel, const std::vector<uint32_t>& words,
                    std::size_t value_floats) {
      PsRequestHeader h;
      h.op = op;
      h.piece = piece;
      h.numel = numel;
      std::vector<std::byte> f(kPsRequestHeaderBytes + 4 * words.size() + 4 * value_floats);
      std::memcpy(f.data() + kPsRequestHeaderBytes, words.data(), 4 * words.size());
      h.payload_bytes = f.size() - kPsRequestHeaderBytes;
      encodePsRequest(h, std::span<std::byte, kPsRequestHeaderBytes>(f.data(), kPsRequestHeaderBytes));
      t.send(serverRank(0), comm::FrameMeta{comm::OpKind::kP2P, kPsRequestTag}, f);
      std::vector<std::byte> r(4096);
      const uint64_t n = t.recv(serverRank(0), comm::FrameMeta{comm::OpKind::kP2P, kPsReplyTag}, r);
      const PsReplyHeader rh = decodePsReply(std::span<const std::byte>(r.data(), n));
      EXPECT_EQ(rh.status, PsStatus::kError);
      replies.emplace_back(reinterpret_cast<const char*>(r.data() + kPsReplyHeaderBytes), rh.payload_bytes);
    };
    std::vector<float> x(23);
    client.pull(0, x);
    send(PsOp::kPushRows, 0, 20, {1, 4, 9}, 4);     // row id 9 of 5
    send(PsOp::kPushRows, 0, 20, {2, 4, 1, 1}, 8);  // duplicate
    send(PsOp::kPushRows, 0, 20, {2, 4, 3, 1}, 8);  // not ascending
    send(PsOp::kPushRows, 0, 20, {100, 4, 1}, 4);   // a count the frame cannot hold
    send(PsOp::kPushRows, 0, 20, {2, 4, 0, 1}, 4);  // values for one row of two
    send(PsOp::kPushRows, 0, 20, {1, 3, 0}, 3);     // wrong row length
    send(PsOp::kPushRows, 1, 3, {0, 4}, 0);         // rows for the dense tensor
    send(PsOp::kPush, 0, 20, {}, 20);               // dense frame for the row-sparse tensor
    send(PsOp::kPullRows, 0, 0, {1, 2, 7}, 0);      // trailing bytes after the list
    send(PsOp::kPullRows, 0, 0, {2, 0, 5}, 0);      // row id 5 of 5
    // The shard still serves: a good row push applies to its rows only.
    std::vector<float> g(23, 0.0f);
    for (int c = 0; c < 4; ++c) g[4 + c] = 1.0f;
    const std::vector<std::vector<int64_t>> rows = {{1}, {}};
    client.push(0, g, rows);
    client.pull(1, x);
    for (std::size_t i = 0; i < 23; ++i) EXPECT_FLOAT_EQ(x[i], i >= 4 && i < 8 ? 0.9f : 1.0f) << i;
    client.bye();
  });
  const std::vector<std::string> needles = {"row id 9 (entry 0) outside the tensor's 5 rows",
                                            "duplicate row id 1",
                                            "row ids not ascending",
                                            "row count 100",
                                            "payload size",
                                            "row length 3",
                                            "names rows; its tensor is dense",
                                            "its tensor is row-sparse",
                                            "row pull: payload size",
                                            "row id 5 (entry 1)"};
  ASSERT_EQ(replies.size(), needles.size());
  for (std::size_t i = 0; i < needles.size(); ++i)
    EXPECT_NE(replies[i].find(needles[i]), std::string::npos) << "case " << i << ": " << replies[i];
  EXPECT_EQ(job.stats[0].refused, needles.size());
  EXPECT_EQ(job.stats[0].pushes_applied, 2u);  // the good row push and the dense tensor's
}

TEST(PsSparse, PlanAndClientRejectBadRows) {
  PsPlan plan = planShards(std::vector<uint64_t>{20, 3}, 1);
  EXPECT_THROW(markRowSparse(plan, 2, 4), InvalidArgument);
  EXPECT_THROW(markRowSparse(plan, 0, 3), InvalidArgument);
  EXPECT_THROW(markRowSparse(plan, 0, 0), InvalidArgument);
  markRowSparse(plan, 0, 4);
  std::string error;
  runJob(plan, std::vector<float>(23, 1.0f), ServerOptions{}, [&](comm::Transport& t) {
    ParamServerClient client(t, plan, 0, 1, {});
    std::vector<float> x(23);
    const std::vector<std::vector<int64_t>> bad = {{5}, {}};
    try {
      client.pull(0, x, bad);
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
    client.bye();
  });
  EXPECT_NE(error.find("row 5 of tensor 0 outside 0..4"), std::string::npos) << error;
}

// ---- AsyncWorker on glove: the rows come from the workload (grad_rows, forwardRows).

struct GloveRun {
  std::vector<float> params;
  uint64_t bytes = 0;  // every shard's, both directions
};

GloveRun runGlove(bool sparse, int64_t batch, int64_t accumulation) {
  auto data = testing::gloveTestCorpus();
  workloads::GloveOptions g;
  g.dim = 8;
  workloads::GloveWorkload model(data, g, 3);
  std::vector<uint64_t> numel;
  for (const auto& p : model.params()) numel.push_back(p.numel());
  PsPlan plan = planShards(numel, 2);
  if (sparse)
    for (uint32_t t = 0; t < model.params().size(); ++t) markRowSparse(plan, t, model.params()[t].rowLength());
  std::vector<float> init(plan.total_numel);
  copyValuesOut(model.params(), init);
  ServerOptions so;
  so.lr = 0.05;
  so.sgd.adagrad = true;
  so.staleness_bound = 0;
  AsyncTrainerOptions o;
  o.batch_size = batch;
  o.accumulation_steps = accumulation;
  const Job job = runJob(plan, init, so, [&](comm::Transport& t) {
    ParamServerClient client(t, plan, 0, 1, {});
    AsyncWorker worker(model, client, 0, 1, o);
    while (!worker.finished()) worker.step();
    worker.leave();
  });
  GloveRun run{job.params, 0};
  for (const auto& s : job.stats) run.bytes += s.bytes_in[0] + s.bytes_out[0];
  return run;
}

void expectNear(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << "element " << i;
}

TEST(PsSparse, GloveWorkerPushesAndPullsRowsWithTheDenseResultAndFarFewerBytes) {
  const GloveRun dense = runGlove(false, 8, 1);
  const GloveRun sparse = runGlove(true, 8, 1);
  expectNear(sparse.params, dense.params, 1e-6f);
  // 8 examples touch at most 8 of ~400 rows per tensor, in both directions.
  EXPECT_LT(20 * sparse.bytes, dense.bytes) << sparse.bytes << " vs " << dense.bytes;
}

TEST(PsAccumulation, TwoMicroBatchesOfBEqualOneBatchOf2B) {
  const GloveRun big = runGlove(false, 8, 1);
  const GloveRun accumulated = runGlove(false, 4, 2);
  expectNear(accumulated.params, big.params, 1e-5f);
  // The row path accumulates the union of the micro-batches' rows.
  expectNear(runGlove(true, 4, 2).params, big.params, 1e-5f);
}

}  // namespace
}  // namespace terse::train
