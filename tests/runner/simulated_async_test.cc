// Modes ASYNC and SSP in simulated time (DESIGN.md section 9; issues 16 and 17): the parameter server's shards and
// workers as actors. SSP with bound 0 against SYNC, runs that repeat bit for bit under the FLOP model, a 2x straggler
// that doubles SYNC's time while ASYNC's other workers keep their pace, a worker that stops dead dropped after the
// simulated timeout, a failing plugin that ends the simulation with the real-time run's message, and compute jitter
// parting SSP from ASYNC and slowing SYNC, repeatably per seed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/common/json.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner.h"
#include "runner_test_util.h"

namespace terse::runner {
namespace {
using namespace test_util;

double num(const Json& record, const std::string& key) {
  const auto v = getNumber(record, key);
  EXPECT_TRUE(v.has_value()) << "no " << key;
  return v.value_or(-1);
}

// The Fashion-MNIST MLP, four workers of 32 examples, 16 steps each; plain SGD (per-push momentum differs from
// sync's by design, param_server_shard.h); the FLOP model, so every time is reproducible. `extra` picks the mode;
// `links`: 1 Gbps links of 50 us, else unlimited ones.
std::string mlpStudy(const std::string& extra, bool links = true) {
  const std::string base =
      "study: \"unit\"\n"
      "workload { name: \"mlp\" hidden_sizes: [64] }\n"
      "data { batch_size: 32 train_subset: 2048 test_subset: 300 }\n"
      "optimizer { lr: 0.05 }\n"
      "workers: 4\n"
      "epochs: 1\n"
      "eval { every_steps: 4 }\n"
      "seed: 3\n"
      "clock: SIMULATED\n"
      "simulation { compute: FLOP_MODEL flops_per_second: 1e9 }\n";
  return base + (links ? "link { bandwidth: \"1Gbps\" latency: \"50us\" }\n" : "") + extra;
}

TEST(SimulatedAsync, SspBoundZeroGivesTheSyncRecords) {
  auto loader = testLoader();
  const auto sync = runStudy(loader, mlpStudy("mode: SYNC\n"), freshDir("simps_sync"));
  const auto ssp = runStudy(loader, mlpStudy("mode: SSP\nstaleness_bound: 0\n"), freshDir("simps_ssp0"));
  ASSERT_EQ(sync.size(), 4u);
  ASSERT_EQ(ssp.size(), sync.size());
  for (std::size_t i = 0; i < sync.size(); ++i) {
    // Bit for bit: the schedule (steps, epochs, learning rate). The parameters follow the same batches and updates,
    // but a shard applies w -= (lr / W) g per push where sync applies w -= lr * (sum g) / W once: the float roundings
    // differ, so the rest agrees within them (as in real time, async_runner_test.cc).
    EXPECT_EQ(ssp[i].at("step"), sync[i].at("step")) << "record " << i;
    EXPECT_EQ(ssp[i].at("epoch"), sync[i].at("epoch")) << "record " << i;
    EXPECT_EQ(ssp[i].at("lr"), sync[i].at("lr")) << "record " << i;
    EXPECT_EQ(ssp[i].at("test_examples"), sync[i].at("test_examples")) << "record " << i;
    EXPECT_NEAR(num(ssp[i], "test_accuracy"), num(sync[i], "test_accuracy"), 0.004) << "record " << i;
    EXPECT_NEAR(num(ssp[i], "test_loss"), num(sync[i], "test_loss"), 1e-3 * num(sync[i], "test_loss")) << i;
    EXPECT_NEAR(num(ssp[i], "train_loss"), num(sync[i], "train_loss"), 1e-3 * num(sync[i], "train_loss")) << i;
    EXPECT_GT(num(ssp[i], "wall_s"), 0) << "record " << i;
  }
  // Lockstep: a push sees at most the other three workers' pushes of its step.
  EXPECT_LE(num(ssp.back(), "staleness_max"), 3);
  const std::string prov =
      readFile(freshDir("unused").parent_path() / "simps_ssp0" / "unit" / "base" / "provenance.json");
  EXPECT_NE(prov.find("\"clock\":\"simulated\""), std::string::npos) << prov;
  EXPECT_NE(prov.find("FLOP model at 1e+09 flop/s"), std::string::npos) << prov;
  EXPECT_NE(prov.find("\"mode\":\"ssp\""), std::string::npos) << prov;
}

TEST(SimulatedAsync, FlopModelRunsRepeatBitForBit) {
  auto loader = testLoader();
  // Two shards (a worker waits on both, pinging the one it is not waiting on) and a straggler: every path of the
  // client's and the shards' waits.
  const std::string text = mlpStudy(
      "mode: ASYNC\nparameter_server { servers: 2 }\n"
      "worker_settings { worker: 2 slowdown: 3 }\n");
  const auto a = runStudy(loader, text, freshDir("simps_rep_a"));
  const auto b = runStudy(loader, text, freshDir("simps_rep_b"));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    for (const auto& [key, value] : a[i].items()) EXPECT_EQ(b[i].at(key), value) << "record " << i << ", " << key;
  EXPECT_GT(num(a.back(), "wall_s"), 0);
}

TEST(SimulatedAsync, AStragglerSlowsSyncTwofoldWhileAsyncKeepsThePace) {
  auto loader = testLoader();
  const std::string slow = "worker_settings { worker: 1 slowdown: 2 }\n";
  // No link limits: a step is computation, so SYNC's pace is its slowest worker's.
  const auto sync1 = runStudy(loader, mlpStudy("mode: SYNC\n", false), freshDir("simps_sync1"));
  const auto sync2 = runStudy(loader, mlpStudy("mode: SYNC\n" + slow, false), freshDir("simps_sync2"));
  ASSERT_EQ(sync2.size(), sync1.size());
  const double ratio = num(sync2.back(), "wall_s") / num(sync1.back(), "wall_s");
  EXPECT_NEAR(ratio, 2.0, 0.1) << "SYNC with a 2x straggler";

  // ASYNC, one shard (no pings: a worker's bytes sent are its steps times a fixed frame set). At the record halfway
  // through, each worker's rate is its bytes sent per simulated second.
  const auto async1 = runStudy(loader, mlpStudy("mode: ASYNC\n"), freshDir("simps_async1"));
  const auto async2 = runStudy(loader, mlpStudy("mode: ASYNC\n" + slow), freshDir("simps_async2"));
  ASSERT_EQ(async1.size(), 4u);
  ASSERT_EQ(async2.size(), 4u);
  const auto rate = [&](const Json& r, int w) {
    return num(r, "worker" + std::to_string(w) + "_bytes_out") / num(r, "wall_s");
  };
  for (int w : {0, 2, 3}) {
    const double base = rate(async1[1], w), with = rate(async2[1], w);
    EXPECT_NEAR(with / base, 1.0, 0.1) << "worker " << w << ": " << with << " B/s against " << base << " B/s";
  }
  EXPECT_NEAR(rate(async2[1], 1) / rate(async1[1], 1), 0.5, 0.1) << "the straggler itself";
  // Every worker still pushes all of its steps: the run ends when the straggler does.
  EXPECT_EQ(num(async2.back(), "worker1_bytes_out"), num(async2.back(), "worker0_bytes_out"));
}

// Without compute jitter, four identical workers finish every step at the same simulated instant, so SSP with bound 2
// never holds a pull and is ASYNC record for record (a new user's trial). With compute_jitter their steps take
// different times: the two modes part, the same seed repeats bit for bit and another seed draws other factors.
TEST(SimulatedAsync, ComputeJitterPartsSspFromAsyncAndRepeatsPerSeed) {
  auto loader = testLoader();
  const auto same = [](const std::vector<Json>& a, const std::vector<Json>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      for (const auto& [key, value] : a[i].items())
        if (!b[i].contains(key) || b[i].at(key) != value) return false;
    return true;
  };
  const std::string ssp = "mode: SSP\nstaleness_bound: 2\n", async = "mode: ASYNC\n";
  const auto ssp0 = runStudy(loader, mlpStudy(ssp), freshDir("simps_jit_ssp0"));
  const auto async0 = runStudy(loader, mlpStudy(async), freshDir("simps_jit_async0"));
  ASSERT_EQ(ssp0.size(), 4u);
  EXPECT_TRUE(same(ssp0, async0)) << "without jitter SSP s=2 and ASYNC are the same run";

  const std::string jitter = "compute_jitter: 1\n";
  const auto ssp1 = runStudy(loader, mlpStudy(ssp + jitter), freshDir("simps_jit_ssp1"));
  const auto async1 = runStudy(loader, mlpStudy(async + jitter), freshDir("simps_jit_async1"));
  ASSERT_EQ(ssp1.size(), 4u);
  ASSERT_EQ(async1.size(), 4u);
  EXPECT_FALSE(same(ssp1, async1)) << "with jitter the staleness bound binds";
  EXPECT_FALSE(same(async1, async0)) << "jitter changes the run";
  // A delay only: every record's simulated time is past the run's without jitter.
  for (std::size_t i = 0; i < async1.size(); ++i) EXPECT_GT(num(async1[i], "wall_s"), num(async0[i], "wall_s")) << i;

  const auto async1_again = runStudy(loader, mlpStudy(async + jitter), freshDir("simps_jit_async1b"));
  EXPECT_TRUE(same(async1, async1_again)) << "the same seed draws the same factors";
  // Another seed (which also orders the data: the jitter's part is the time, so compare each seed's slowdown).
  const auto seed4 = [](std::string text) { return text.replace(text.find("seed: 3"), 7, "seed: 4"); };
  const auto other = runStudy(loader, seed4(mlpStudy(async + jitter)), freshDir("simps_jit_async_seed4"));
  const auto other0 = runStudy(loader, seed4(mlpStudy(async)), freshDir("simps_jit_async0_seed4"));
  ASSERT_EQ(other.size(), 4u);
  EXPECT_NE(num(other.back(), "wall_s") / num(other0.back(), "wall_s"),
            num(async1.back(), "wall_s") / num(async0.back(), "wall_s"))
      << "another seed draws other factors";
}

// SYNC takes the jitter too: each step waits for its slowest worker's draw.
TEST(SimulatedAsync, ComputeJitterSlowsSync) {
  auto loader = testLoader();
  const auto plain = runStudy(loader, mlpStudy("mode: SYNC\n", false), freshDir("simps_jit_sync0"));
  const auto jit = runStudy(loader, mlpStudy("mode: SYNC\ncompute_jitter: 0.5\n", false), freshDir("simps_jit_sync1"));
  const auto again =
      runStudy(loader, mlpStudy("mode: SYNC\ncompute_jitter: 0.5\n", false), freshDir("simps_jit_sync2"));
  ASSERT_EQ(jit.size(), plain.size());
  ASSERT_EQ(again.size(), jit.size());
  // No link limits: a step is computation, and the slowest of four draws has a mean above one draw's 1.57.
  const double ratio = num(jit.back(), "wall_s") / num(plain.back(), "wall_s");
  EXPECT_GT(ratio, 1.6);
  EXPECT_LT(ratio, 4.0);
  for (std::size_t i = 0; i < jit.size(); ++i) {
    EXPECT_EQ(jit[i].at("wall_s"), again[i].at("wall_s")) << i;
    EXPECT_EQ(jit[i].at("test_loss"), plain[i].at("test_loss")) << "jitter is time, not math: " << i;
  }
}

TEST(SimulatedAsync, AWorkerThatStopsDeadIsDroppedAfterTheSimulatedTimeout) {
  auto loader = testLoader();
  const auto records = runStudy(loader,
                                mlpStudy("mode: SSP\nstaleness_bound: 1\n"
                                         "parameter_server { worker_timeout: \"2s\" }\n"
                                         "worker_settings { worker: 3 fail_after_steps: 5 }\n"),
                                freshDir("simps_dead"));
  ASSERT_FALSE(records.empty());
  const Json& last = records.back();
  EXPECT_EQ(num(last, "workers_live"), 3);
  EXPECT_EQ(num(last, "worker3_left_step"), 5);
  // The shard last heard from it at its fifth clock and drops it once it was silent for 2 simulated seconds.
  const double left = num(last, "worker3_left_s"), dropped = num(last, "worker3_dropped_s");
  EXPECT_GT(dropped, left + 2.0 - 0.05) << left << " s, dropped at " << dropped << " s";
  EXPECT_LT(dropped, left + 2.0 + 0.05) << left << " s, dropped at " << dropped << " s";
}

TEST(SimulatedAsync, AFailingPluginEndsTheSimulationWithTheRealTimeMessage) {
  auto loader = testLoader();
  // Worker 1's compressor fails from its step 12 on; the run fails naming it, in real and in simulated time.
  const std::string text = failAtStep12Study("mode: ASYNC\n");
  const auto message = [&](const std::string& t, const std::string& name) {
    const auto study = experiments::loadStudyText(t, "unit.textproto", runnerConfigOptions(&loader));
    Runner runner(quietOptions(loader, freshDir(name)));
    try {
      runner.run(study.experiments.at(0));
    } catch (const RunFailed& e) {
      const std::string m = e.what();
      return m.substr(m.find("): ") + 3);  // after the results folder, which differs
    }
    ADD_FAILURE() << "the run should have failed";
    return std::string();
  };
  const std::string real = message(text, "simps_fail_real");
  const std::string sim = message(text + "clock: SIMULATED\n", "simps_fail_sim");
  EXPECT_NE(real.find("worker 1 (rank 2)"), std::string::npos) << real;
  EXPECT_NE(real.find("failing on purpose at step 12"), std::string::npos) << real;
  EXPECT_EQ(sim, real);
}

}  // namespace
}  // namespace terse::runner
