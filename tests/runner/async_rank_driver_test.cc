// The rank-side pieces of the asynchronous modes (experiments/runner/async_rank_driver.h, async_rank.h) that the
// in-process and the tcp paths share: train_loss's rule, a shard's tally, and whole in-process runs at three and five
// ranks (odd counts, a straggler, a worker that stops dead) whose records are pinned (fixtures/async_*_metrics.jsonl),
// wall_s aside; a failing worker at three and five ranks stops every rank at once and is named.
//
// The fixtures were taken when the in-process runs moved onto the tcp job's rank code (async_rank.h), whose records
// hold every number as of the shards' snapshot. Against the in-place path before it, the same steps, accuracies and
// losses to the last digit; the byte counters and per-step times are those of the snapshot's steps (before, some were
// read when the record was written, a step or more later, and the payload bytes a step earlier than the wire bytes:
// 198 payload bytes per worker beside 1,980 wire bytes at the first record, now 220, ten pushes of each).
// Retaken when a shard's replies stopped taking turns (param_server_shard.h, "Replies"): each step's communication
// time halved, and with the changed arrival order the ASYNC accuracies and losses moved in their third or fourth digit.
// Retaken again when the wire and payload bytes began counting the pulls (experiments/runner/async_detail.h): those two
// fields changed and four were added (push_/pull_bytes_per_worker, push_/pull_payload_bytes_per_worker).
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "core/comm/frame.h"
#include "core/train/param_server_plan.h"
#include "core/train/param_server_wire.h"
#include "experiments/config/config.h"
#include "experiments/runner/async_rank_driver.h"
#include "experiments/runner/runner.h"
#include "tests/runner/runner_test_util.h"

namespace terse::runner {
namespace {

using namespace test_util;

TEST(AsyncTrainLoss, WorkerZerosLossesElseEveryOtherWorkers) {
  // Worker w logged losses w+1 at its steps [0, steps[w]).
  const std::vector<int64_t> steps = {3, 6, 8};
  const detail::WorkerLosses losses = [&](int w, int64_t from, int64_t to) {
    const int64_t n = std::max<int64_t>(0, std::min(to, steps[static_cast<std::size_t>(w)]) - from);
    return std::pair<double, int64_t>{static_cast<double>(n) * (w + 1), n};
  };
  EXPECT_EQ(detail::asyncTrainLoss(3, 0, 5, losses), (std::pair<double, int64_t>{3.0, 3}));  // worker 0's only
  // Worker 0 ran none of steps [5, 8): workers 1 (steps 5) and 2 (steps 5, 6, 7) together.
  EXPECT_EQ(detail::asyncTrainLoss(3, 5, 8, losses), (std::pair<double, int64_t>{2.0 + 9.0, 4}));
  EXPECT_EQ(detail::asyncTrainLoss(3, 8, 9, losses), (std::pair<double, int64_t>{0.0, 0}));
}

TEST(ShardTally, SumsBytesOverWorkersAndTimesOnlyTheDropped) {
  train::ServerStats st;
  const auto start = std::chrono::steady_clock::now();
  st.bytes_in = {10, 20, 30};
  st.bytes_out = {1, 2, 3};
  st.dead = {false, true, false};
  st.dead_at = {start + std::chrono::seconds(9), start + std::chrono::milliseconds(1500), start};
  st.staleness = {{0, 4}, {2, 1}};
  const detail::ShardTally t = detail::shardTally(st, start);
  EXPECT_EQ(t.bytes_in, 60u);
  EXPECT_EQ(t.bytes_out, 6u);
  EXPECT_EQ(t.dropped_s, (std::vector<double>{-1.0, 1.5, -1.0}));
  EXPECT_EQ(t.staleness, st.staleness);
}

// S shards and W workers of a linear regression in simulated time (the records repeat bit for bit), worker 0 a 2x
// straggler; `extra` adds to the config.
std::string asyncStudy(int servers, int workers, const std::string& extra) {
  return "study: \"unit\"\n"
         "workload { name: \"linear_regression\" }\n"
         "data { batch_size: 16 train_subset: 480 test_subset: 100 }\n"
         "optimizer { lr: 0.02 momentum: 0.5 }\n"
         "workers: " +
         std::to_string(workers) +
         "\n"
         "epochs: 2\n"
         "eval { every_steps: 5 per_epoch: true }\n"
         "seed: 5\n"
         "mode: ASYNC\n"
         "parameter_server { servers: " +
         std::to_string(servers) + extra +
         " }\n"
         "worker_settings { worker: 0 slowdown: 2 }\n"
         "link { bandwidth: \"1Gbps\" latency: \"50us\" }\n"
         "clock: SIMULATED\n"
         "simulation { compute: FLOP_MODEL flops_per_second: 1e9 }\n";
}

std::vector<std::string> recordsButWallS(const fs::path& file) {
  std::vector<std::string> out;
  std::istringstream in(readFile(file));
  static const std::regex wall("\"wall_s\":[^,}]*,?");
  for (std::string line; std::getline(in, line);) out.push_back(std::regex_replace(line, wall, ""));
  return out;
}

void expectPinnedRecords(const std::string& text, const std::string& name) {
  auto loader = testLoader();
  const fs::path root = freshDir(name);
  runStudy(loader, text, root);
  const auto got = recordsButWallS(root / "unit" / "base" / "metrics.jsonl");
  const auto want = recordsButWallS(fs::path(TERSE_TEST_RUNNER_SOURCE_DIR) / "fixtures" / (name + "_metrics.jsonl"));
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "record " << i;
}

TEST(AsyncRanks, ThreeRanksWriteThePinnedRecords) {
  expectPinnedRecords(asyncStudy(1, 2, ""), "async_s1w2");
}

// Five ranks, and worker 2 stops dead after 6 steps: the shards drop it after the (simulated) timeout.
TEST(AsyncRanks, FiveRanksWithAWorkerThatStopsDeadWriteThePinnedRecords) {
  std::string text = asyncStudy(2, 3, " worker_timeout: \"0.05s\"");
  text += "worker_settings { worker: 2 fail_after_steps: 6 }\n";
  expectPinnedRecords(text, "async_s2w3");
}

// A dense parameter-server run's bytes, frame by frame: per worker and step one pull (a request header up to each
// shard, a reply down with a u64 version per piece and the shard's range in f32) and one push (a header and the raw
// values per piece, then a clock, each acknowledged by a reply header), and a goodbye to each shard at the end (no
// pings: the simulated run is over long before a heartbeat is due). The wire bytes per worker are both directions, as a
// sync run's are its ranks' sends: what the records counted before this was the pushes alone.
TEST(AsyncRanks, WireBytesAreEveryPushAndPullFrame) {
  constexpr int kServers = 2, kWorkers = 2;
  auto loader = testLoader();
  const auto records = runStudy(loader, asyncStudy(kServers, kWorkers, ""), freshDir("async_frames"));
  ASSERT_FALSE(records.empty());
  const Json& last = records.back();
  const auto n = static_cast<uint64_t>(getNumber(last, "step").value_or(0));  // each worker's steps
  ASSERT_GT(n, 0u);
  const std::vector<uint64_t> numel = {10, 1};  // linear_regression: weight [1, 10], bias [1]
  const train::PsPlan plan = train::planShards(numel, kServers);
  uint64_t up = 0, down = 0, pull_body = 0;
  for (int k = 0; k < kServers; ++k) {
    const auto& pieces = plan.shard_pieces[static_cast<std::size_t>(k)];
    if (pieces.empty()) continue;
    const uint64_t body = train::psPullBodyBytes(plan, k, DType::kF32);
    up += comm::frameWireBytes(train::kPsRequestHeaderBytes);  // pull request
    down += comm::frameWireBytes(train::kPsReplyHeaderBytes + body);
    pull_body += body;
    for (uint64_t id : pieces) up += comm::frameWireBytes(train::kPsRequestHeaderBytes + plan.pieces[id].numel * 4);
    up += comm::frameWireBytes(train::kPsRequestHeaderBytes);                        // clock
    down += (pieces.size() + 1) * comm::frameWireBytes(train::kPsReplyHeaderBytes);  // acknowledgements
  }
  const uint64_t push = n * up + kServers * comm::frameWireBytes(train::kPsRequestHeaderBytes);  // + goodbyes
  const uint64_t pull = n * down;
  EXPECT_EQ(getNumber(last, "push_bytes_per_worker"), static_cast<double>(push));
  EXPECT_EQ(getNumber(last, "pull_bytes_per_worker"), static_cast<double>(pull));
  EXPECT_EQ(getNumber(last, "wire_bytes_per_worker"), static_cast<double>(push + pull));
  EXPECT_EQ(getNumber(last, "worker0_bytes_in"), static_cast<double>(pull));
  EXPECT_EQ(getNumber(last, "push_payload_bytes_per_worker"), static_cast<double>(n * 11 * 4));
  EXPECT_EQ(getNumber(last, "pull_payload_bytes_per_worker"), static_cast<double>(n * pull_body));
  EXPECT_EQ(getNumber(last, "payload_bytes_per_worker"), static_cast<double>(n * (11 * 4 + pull_body)));
  // The shards sent what the workers received, and received what they sent.
  EXPECT_EQ(*getNumber(last, "server0_bytes_out") + *getNumber(last, "server1_bytes_out"),
            static_cast<double>(kWorkers * pull));
  EXPECT_EQ(*getNumber(last, "server0_bytes_in") + *getNumber(last, "server1_bytes_in"),
            static_cast<double>(kWorkers * push));
}

// Worker 1's compressor fails at its step 12: every other rank stops at once (no hang: the shards would otherwise
// wait out worker_timeout), and the error names the worker and its rank.
void expectFailingWorkerStopsTheRun(int servers, int workers, const std::string& name) {
  auto loader = testLoader();
  std::string text = failAtStep12Study("mode: ASYNC\nparameter_server { servers: " + std::to_string(servers) +
                                       " worker_timeout: \"120s\" }\n");
  text.replace(text.find("workers: 2"), 10, "workers: " + std::to_string(workers));
  const auto study = experiments::loadStudyText(text, "unit.textproto", runnerConfigOptions(&loader));
  const fs::path root = freshDir(name);
  Runner runner(quietOptions(loader, root));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    runner.run(study.experiments.at(0));
    ADD_FAILURE() << "the run should have failed";
  } catch (const RunFailed& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("worker 1 (rank " + std::to_string(servers + 1) + ")"), std::string::npos) << m;
    EXPECT_NE(m.find("failing on purpose at step 12"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  EXPECT_EQ(getString(readStatus(root / "unit" / "base"), "state"), "failed");
}

TEST(AsyncRanks, AFailingWorkerOfThreeRanksStopsTheRun) {
  expectFailingWorkerStopsTheRun(1, 2, "async_fail3");
}

TEST(AsyncRanks, AFailingWorkerOfFiveRanksStopsTheRun) {
  expectFailingWorkerStopsTheRun(2, 3, "async_fail5");
}

}  // namespace
}  // namespace terse::runner
