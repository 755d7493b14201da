// Modes ASYNC, SSP and HOGWILD end to end through the runner on the Fashion-MNIST MLP (issue 7's tests): staleness
// bound 0 gives the sync run's records; async ends within 1.5 points of sync with 4 workers; a worker that stops dead
// is dropped and the run completes, recording when it left; staleness and per-server / per-worker bytes are
// recorded and add up; a straggler makes fewer pushes; Hogwild trains without a wire.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/common/json.h"
#include "core/plugin/loader.h"
#include "core/train/async_trainer.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner.h"
#include "experiments/workloads/workloads.h"
#include "results/compare/compute.h"
#include "results/compare/format.h"
#include "results/compare/reader.h"
#include "results/result_writer.h"
#include "runner_test_util.h"

namespace terse::runner {
namespace {

namespace fs = std::filesystem;
using test_util::readMetrics;

fs::path freshDir(const std::string& name) {
  // The process id keeps concurrent runs of this binary (ctest -j, --gtest_repeat under stress) apart.
  const fs::path dir =
      fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "async_out" / (name + "." + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string statusOf(const fs::path& dir) {
  std::ifstream in(dir / "status.json");
  std::stringstream s;
  s << in.rdbuf();
  auto obj = parseJsonObject(s.str());
  return obj ? getString(*obj, "state").value_or("") : "";
}

double num(const Json& r, const std::string& key) {
  EXPECT_TRUE(r.contains(key)) << "record has no " << key;
  return getNumber(r, key).value_or(NAN);
}

struct Run {
  std::vector<Json> records;
  std::string state;
  RunSummary summary;
};

// Runs every variant of the study text; the data set is loaded once per runner.
std::map<std::string, Run> runAll(const std::string& text, const std::string& name) {
  auto loader = PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
  const auto study = experiments::loadStudyText(text, name + ".textproto", runnerConfigOptions(&loader));
  RunnerOptions o;
  o.loader = &loader;
  o.output_root = freshDir(name);
  o.progress = ProgressMode::kOff;
  Runner runner(o);
  std::map<std::string, Run> out;
  for (const auto& e : study.experiments) {
    Run r;
    r.summary = runner.run(e);
    r.records = readMetrics(r.summary.dir);
    r.state = statusOf(r.summary.dir);
    out[e.variant()] = std::move(r);
  }
  return out;
}

// The default dataset_dir: the bootstrap installs Fashion-MNIST there.
const std::string kData = "data { batch_size: 32 ";

TEST(AsyncRunner, StalenessBoundZeroGivesTheSyncRecords) {
  // Plain SGD (the shards' per-push momentum differs from sync's by design, param_server_shard.h), one and two shards.
  const std::string text =
      "study: \"lockstep\"\n"
      "workload { name: \"mlp\" hidden_sizes: [64] }\n" +
      kData +
      "train_subset: 8192 test_subset: 2000 }\n"
      "optimizer { lr: 0.05 weight_decay: 0.0001 warmup_steps: 10 schedule: COSINE }\n"
      "workers: 4\nepochs: 2\neval { every_steps: 32 }\nseed: 3\n"
      "variants { name: \"sync\" overrides { mode: SYNC } }\n"
      "variants { name: \"ssp0\" overrides { mode: SSP staleness_bound: 0 } }\n"
      "variants { name: \"ssp0_2shards\" overrides { mode: SSP staleness_bound: 0 parameter_server { servers: 2 } } "
      "}\n";
  const auto runs = runAll(text, "lockstep");
  const auto& sync = runs.at("sync").records;
  ASSERT_EQ(sync.size(), 4u);
  for (const std::string v : {"ssp0", "ssp0_2shards"}) {
    const auto& r = runs.at(v);
    EXPECT_EQ(r.state, "completed");
    ASSERT_EQ(r.records.size(), sync.size()) << v;
    for (std::size_t i = 0; i < sync.size(); ++i) {
      EXPECT_EQ(num(r.records[i], "step"), num(sync[i], "step")) << v;
      // The same batches and updates; only the order in which the shard sums the workers' gradients differs.
      EXPECT_NEAR(num(r.records[i], "test_accuracy"), num(sync[i], "test_accuracy"), 0.002) << v << " record " << i;
      EXPECT_NEAR(num(r.records[i], "test_loss"), num(sync[i], "test_loss"), 1e-3 * num(sync[i], "test_loss"))
          << v << " record " << i;
      EXPECT_NEAR(num(r.records[i], "train_loss"), num(sync[i], "train_loss"), 1e-3 * num(sync[i], "train_loss"))
          << v << " record " << i;
      EXPECT_NEAR(num(r.records[i], "lr"), num(sync[i], "lr"), 1e-12) << v;
    }
    // Lockstep: no push is applied after another worker already read the next step.
    const auto& last = r.records.back();
    EXPECT_LE(num(last, "staleness_max"), 3) << "with s = 0 a push sees at most the other 3 workers' pushes";
  }
}

// A non-IID split (data.partition DIRICHLET) reaches the sync trainer and the parameter server's workers alike: SSP
// with bound 0 still gives sync's records, both differ from the IID run of the same seed, and the provenance holds the
// partition's histograms: a quarter of the 8192 examples per worker, skewed. Hogwild's workers take it too.
TEST(AsyncRunner, ANonIidPartitionReachesSyncAndParameterServerWorkersAlike) {
  const std::string head = "study: \"noniid\"\nworkload { name: \"mlp\" hidden_sizes: [64] }\n" + kData +
                           "train_subset: 8192 test_subset: 2000";
  const std::string rest =
      " }\noptimizer { lr: 0.05 warmup_steps: 10 schedule: COSINE }\n"
      "workers: 4\nepochs: 2\neval { every_steps: 32 }\nseed: 3\n";
  const auto runs = runAll(head + " partition: DIRICHLET dirichlet_alpha: 0.1" + rest +
                               "variants { name: \"sync\" overrides { mode: SYNC } }\n"
                               "variants { name: \"ssp0\" overrides { mode: SSP staleness_bound: 0 } }\n"
                               "variants { name: \"hogwild\" overrides { mode: HOGWILD } }\n"
                               // One worker owns every example, in the partition's order, not the IID reshuffle's:
                               // Hogwild's worker must follow it as the sync trainer does.
                               "variants { name: \"sync1\" overrides { mode: SYNC workers: 1 } }\n"
                               "variants { name: \"hogwild1\" overrides { mode: HOGWILD workers: 1 } }\n",
                           "noniid");
  const auto iid = runAll(head + rest + "variants { name: \"iid\" overrides { mode: SYNC } }\n", "noniid_iid");
  const auto& sync = runs.at("sync").records;
  const auto& ssp = runs.at("ssp0").records;
  ASSERT_EQ(sync.size(), 4u);
  ASSERT_EQ(ssp.size(), sync.size());
  ASSERT_EQ(iid.at("iid").records.size(), sync.size());
  for (std::size_t i = 0; i < sync.size(); ++i)
    EXPECT_NEAR(num(ssp[i], "test_loss"), num(sync[i], "test_loss"), 1e-3 * num(sync[i], "test_loss")) << i;
  EXPECT_NE(num(iid.at("iid").records.back(), "train_loss"), num(sync.back(), "train_loss"))
      << "the partition did not reach the run";
  // Hogwild's records before the last evaluate a model its worker is still changing, and how many its monitor catches
  // depends on timing: only the last one, after every step, is the final model's.
  const auto& sync1 = runs.at("sync1").records;
  const auto& hogwild1 = runs.at("hogwild1").records;
  ASSERT_FALSE(hogwild1.empty());
  ASSERT_FALSE(sync1.empty());
  ASSERT_EQ(num(hogwild1.back(), "step"), num(sync1.back(), "step"));
  EXPECT_NEAR(num(hogwild1.back(), "test_loss"), num(sync1.back(), "test_loss"), 1e-4 * num(sync1.back(), "test_loss"))
      << "Hogwild's worker did not take the partition's order";
  for (const std::string v : {"sync", "ssp0", "hogwild"}) {
    EXPECT_EQ(runs.at(v).state, "completed") << v;
    std::ifstream in(runs.at(v).summary.dir / "provenance.json");
    std::stringstream body;
    body << in.rdbuf();
    const auto prov = parseJsonObject(body.str());
    ASSERT_TRUE(prov.has_value()) << v;
    const Json* partition = findMember(*prov, "data_partition");
    ASSERT_NE(partition, nullptr) << v << ": no data_partition in " << body.str();
    EXPECT_EQ(getString(*partition, "kind").value_or(""), "dirichlet") << v;
    EXPECT_GT(std::stod(getString(*partition, "mean_label_distance").value_or("0")), 0.3) << v;
    int64_t total = 0;
    for (int w = 0; w < 4; ++w) {
      std::istringstream counts(getString(*partition, "worker" + std::to_string(w)).value_or(""));
      int64_t k = 0, sum = 0;
      while (counts >> k) sum += k;
      EXPECT_EQ(sum, 2048) << v << " worker " << w;
      total += sum;
    }
    EXPECT_EQ(total, 8192) << v;
  }
}

TEST(AsyncRunner, AWorkerClipsItsGradientBeforeThePush) {
  // One worker: sync's aggregate is that worker's gradient, so clipping it before the push (SSP, s = 0) is sync's
  // clipping. The bound is below the gradients' norm (the unclipped run differs), so every step clips.
  const std::string text =
      "study: \"clip\"\n"
      "workload { name: \"mlp\" hidden_sizes: [32] }\n" +
      kData +
      "train_subset: 1024 test_subset: 500 }\n"
      "optimizer { lr: 0.1 clip_grad_norm: 0.05 }\n"
      "workers: 1\nepochs: 1\neval { every_steps: 8 }\nseed: 3\n"
      "variants { name: \"sync\" overrides { mode: SYNC } }\n"
      "variants { name: \"ssp0\" overrides { mode: SSP staleness_bound: 0 } }\n"
      "variants { name: \"ssp0-unclipped\" overrides { mode: SSP staleness_bound: 0 optimizer { clip_grad_norm: 0 } } "
      "}\n";
  const auto runs = runAll(text, "clip");
  const auto& sync = runs.at("sync").records;
  const auto& ssp = runs.at("ssp0").records;
  const auto& free = runs.at("ssp0-unclipped").records;
  ASSERT_EQ(sync.size(), 4u);
  ASSERT_EQ(ssp.size(), sync.size());
  ASSERT_EQ(free.size(), sync.size());
  for (std::size_t i = 0; i < sync.size(); ++i) {
    EXPECT_NEAR(num(ssp[i], "test_loss"), num(sync[i], "test_loss"), 1e-4 * num(sync[i], "test_loss")) << i;
    EXPECT_NEAR(num(ssp[i], "train_loss"), num(sync[i], "train_loss"), 1e-4 * num(sync[i], "train_loss")) << i;
  }
  EXPECT_GT(std::abs(num(free.back(), "test_loss") - num(ssp.back(), "test_loss")), 1e-3 * num(ssp.back(), "test_loss"))
      << "the bound never clipped: the test cannot tell";
}

TEST(AsyncRunner, AWorkerAccumulatesItsMicroBatchesAndPushesOnce) {
  // One worker, s = 0: two micro-batches of 16 are one batch of 32 (the same examples; the step plan, the evaluation
  // points and the learning-rate schedule count accumulated steps), and so is sync with the same accumulation.
  const std::string text = R"(study: "accumulate"
workload { name: "mlp" hidden_sizes: [32] }
data { batch_size: 16 train_subset: 1000 test_subset: 500 }
optimizer { lr: 0.1 warmup_steps: 4 }
workers: 1
epochs: 1
eval { every_steps: 8 }
seed: 3
gradient_accumulation_steps: 2
variants { name: "ssp0-k2" overrides { mode: SSP staleness_bound: 0 } }
variants { name: "sync-k2" overrides { mode: SYNC } }
variants {
  name: "ssp0-b32"
  overrides { mode: SSP staleness_bound: 0 gradient_accumulation_steps: 1 data { batch_size: 32 } }
}
)";
  const auto runs = runAll(text, "accumulate");
  const auto& big = runs.at("ssp0-b32").records;
  ASSERT_EQ(big.size(), 4u);  // 32 steps of 32 examples (the last of 8): evaluations at steps 8, 16, 24 and 32
  auto sameAsBig = [&](const std::string& v) {
    const auto& r = runs.at(v).records;
    if (r.size() != big.size()) return testing::AssertionFailure() << v << ": " << r.size() << " records";
    for (std::size_t i = 0; i < big.size(); ++i)
      if (num(r[i], "step") != num(big[i], "step") || num(r[i], "lr") != num(big[i], "lr") ||
          std::abs(num(r[i], "test_loss") - num(big[i], "test_loss")) > 1e-4 * num(big[i], "test_loss"))
        return testing::AssertionFailure() << v << " record " << i << ": test_loss " << num(r[i], "test_loss") << " vs "
                                           << num(big[i], "test_loss");
    return testing::AssertionSuccess();
  };
  EXPECT_TRUE(sameAsBig("ssp0-k2"));
  EXPECT_TRUE(sameAsBig("sync-k2"));
}

TEST(AsyncRunner, AsyncEndsWithinOneAndAHalfPointsOfSync) {
  const std::string text =
      "study: \"gap\"\n"
      "workload { name: \"mlp\" hidden_sizes: [128] }\n" +
      kData +
      "}\n"
      "optimizer { lr: 0.05 momentum: 0.9 warmup_steps: 100 schedule: COSINE }\n"
      "workers: 4\nepochs: 2\neval { per_epoch: true }\n"
      "variants { name: \"sync\" overrides { mode: SYNC } }\n"
      "variants { name: \"async\" overrides { mode: ASYNC } }\n";
  const auto runs = runAll(text, "gap");
  const double sync = runs.at("sync").summary.final_accuracy;
  const double async = runs.at("async").summary.final_accuracy;
  EXPECT_GT(sync, 0.8);
  EXPECT_NEAR(async, sync, 0.015);
  EXPECT_EQ(runs.at("async").state, "completed");
}

TEST(AsyncRunner, AWorkerThatStopsDeadIsDroppedAndTheRunCompletes) {
  const std::string text =
      "study: \"elastic\"\n"
      "workload { name: \"mlp\" hidden_sizes: [64] }\n" +
      kData +
      "train_subset: 8192 test_subset: 2000 }\n"
      "optimizer { lr: 0.05 }\n"
      "workers: 4\nepochs: 2\neval { every_steps: 32 }\n"
      "worker_settings { worker: 2 fail_after_steps: 20 }\n"
      "parameter_server { worker_timeout: \"300ms\" servers: 2 }\n"
      "variants { name: \"async\" overrides { mode: ASYNC } }\n"
      "variants { name: \"ssp1\" overrides { mode: SSP staleness_bound: 1 } }\n";
  const auto runs = runAll(text, "elastic");
  for (const auto& [name, r] : runs) {
    EXPECT_EQ(r.state, "completed") << name;
    ASSERT_FALSE(r.records.empty()) << name;
    const auto& last = r.records.back();
    // 128 steps per worker: three workers ran them all, the failed one 20.
    EXPECT_EQ(num(last, "step"), (3 * 128 + 20) / 4) << name;
    EXPECT_EQ(num(last, "workers_live"), 3) << name;
    EXPECT_EQ(num(last, "worker2_left_step"), 20) << name;
    EXPECT_GE(num(last, "worker2_dropped_s"), num(last, "worker2_left_s") + 0.25) << name;
    EXPECT_GT(num(last, "test_accuracy"), 0.65) << name;
    // It stopped sending when it stopped.
    EXPECT_LT(num(last, "worker2_bytes_out"), 0.25 * num(last, "worker0_bytes_out")) << name;
  }
}

TEST(AsyncRunner, RecordsStalenessAndBytesThatAddUp) {
  const std::string text =
      "study: \"bytes\"\n"
      "workload { name: \"mlp\" hidden_sizes: [64] }\n" +
      kData +
      "train_subset: 4096 test_subset: 1000 }\n"
      "optimizer { lr: 0.05 }\n"
      "workers: 3\nepochs: 1\neval { per_epoch: true }\n"
      "mode: ASYNC\nparameter_server { servers: 2 }\n"
      "variants { name: \"f32\" overrides { } }\n"
      "variants { name: \"f16_pull\" overrides { parameter_server { pull_dtype: F16 } } }\n"
      "variants { name: \"topk\" overrides { compressor { name: \"topk\" params { key: \"ratio\" "
      "value: \"0.01\" } } error_feedback: true } }\n"
      "variants { name: \"topk_both\" overrides { compressor { name: \"topk\" params { key: \"ratio\" "
      "value: \"0.01\" } } error_feedback: true parameter_server { pull_compressor { name: \"topk\" params { "
      "key: \"ratio\" value: \"0.01\" } } } } }\n";
  const auto runs = runAll(text, "bytes");
  for (const auto& [name, r] : runs) {
    ASSERT_EQ(r.records.size(), 1u) << name;
    const auto& m = r.records[0];
    double hist = 0;
    for (const auto& [k, v] : m.items())
      if (k.starts_with(results::kStalenessHistPrefix)) hist += getNumber(m, k).value_or(0);
    // Every piece of every step of every worker: 42 steps x 3 workers x pieces (>= 4 tensors over 2 shards).
    EXPECT_GE(hist, 42 * 3 * 4) << name;
    EXPECT_GE(num(m, "staleness_max"), num(m, "staleness_mean")) << name;
    double to_servers = 0, from_servers = 0, worker_out = 0, worker_in = 0;
    for (int k = 0; k < 2; ++k) {
      to_servers += num(m, "server" + std::to_string(k) + "_bytes_in");
      from_servers += num(m, "server" + std::to_string(k) + "_bytes_out");
    }
    for (int w = 0; w < 3; ++w) {
      worker_out += num(m, "worker" + std::to_string(w) + "_bytes_out");
      worker_in += num(m, "worker" + std::to_string(w) + "_bytes_in");
    }
    // Both ends count the same frames (pings included).
    EXPECT_EQ(to_servers, worker_out) << name;
    EXPECT_EQ(from_servers, worker_in) << name;
    // The wire bytes are both directions: all the job put on the network, over the workers.
    EXPECT_EQ(num(m, "push_bytes_per_worker"), worker_out / 3) << name;
    EXPECT_EQ(num(m, "pull_bytes_per_worker"), worker_in / 3) << name;
    EXPECT_EQ(num(m, "wire_bytes_per_worker"), std::floor((worker_out + worker_in) / 3)) << name;
    EXPECT_NEAR(num(m, "payload_bytes_per_worker"),
                num(m, "push_payload_bytes_per_worker") + num(m, "pull_payload_bytes_per_worker"), 1)
        << name;
  }
  const auto& f32 = runs.at("f32").records[0];
  const auto& f16 = runs.at("f16_pull").records[0];
  const auto& topk = runs.at("topk").records[0];
  // Half-precision pulls halve the values on the way down (versions and headers stay).
  EXPECT_NEAR(num(f16, "worker0_bytes_in") / num(f32, "worker0_bytes_in"), 0.5, 0.02);
  EXPECT_NEAR(num(f16, "worker0_bytes_out"), num(f32, "worker0_bytes_out"), 0.01 * num(f32, "worker0_bytes_out"));
  // Top-1% pushes (value + index per kept element) are a small fraction of the raw ones; the pulls are the same
  // parameters in f32 whatever the pushes were, so the wire bytes are at best a little over half the dense run's.
  EXPECT_LT(num(topk, "worker0_bytes_out"), 0.05 * num(f32, "worker0_bytes_out"));
  EXPECT_LT(num(topk, "push_bytes_per_worker"), 0.05 * num(f32, "push_bytes_per_worker"));
  EXPECT_EQ(num(topk, "pull_bytes_per_worker"), num(f32, "pull_bytes_per_worker"));
  EXPECT_EQ(num(topk, "pull_payload_bytes_per_worker"), num(f32, "pull_payload_bytes_per_worker"));
  EXPECT_GT(num(topk, "wire_bytes_per_worker"), 0.5 * num(f32, "wire_bytes_per_worker"));
  EXPECT_GT(num(topk, "test_accuracy"), 0.5);
  // Top-1% pulls too: each worker's first pull carries the parameters (1 of its 42 pulls), the later ones a delta of
  // 8 bytes per kept element against 4 per parameter: about 1/42 + 41/42 x 2% = 4.3% of the f32 pulls.
  const auto& both = runs.at("topk_both").records[0];
  const double pulls = num(both, "pull_payload_bytes_per_worker") / num(f32, "pull_payload_bytes_per_worker");
  EXPECT_GT(pulls, 1.0 / 42) << pulls;
  EXPECT_LT(pulls, 0.06) << pulls;
  EXPECT_LT(num(both, "pull_bytes_per_worker"), 0.08 * num(f32, "pull_bytes_per_worker"));
  EXPECT_EQ(num(both, "push_payload_bytes_per_worker"), num(topk, "push_payload_bytes_per_worker"));
  // What the workers' copies lack relative to the parameters: some, and less than all of it.
  EXPECT_GT(num(both, "pull_residual_rel"), 0);
  EXPECT_LT(num(both, "pull_residual_rel"), 1);
  EXPECT_FALSE(topk.contains("pull_residual_rel"));
  // terse compare shows it beside the staleness, for the rows that have it.
  std::vector<std::string> warnings;
  const auto data = results::loadRuns({runs.at("topk_both").summary.dir.parent_path()}, warnings);
  const results::Comparison compared = results::compare(data, {}, warnings);
  ASSERT_EQ(compared.studies.size(), 1u);
  for (const auto& row : compared.studies[0].rows)
    EXPECT_EQ(row.pull_residual.has_value(), row.variant == "topk_both") << row.variant;
  EXPECT_NE(results::toMarkdown(compared).find("| staleness | pull residual |"), std::string::npos);
  // Decoding the pulls is the codec's time, not the network's; pulls of the parameters decode nothing.
  EXPECT_GT(num(both, "decompress_s_per_step"), 0);
  EXPECT_EQ(num(topk, "decompress_s_per_step"), 0);
  EXPECT_GT(num(both, "test_accuracy"), 0.5);
}

// What `terse compare` makes of a parameter server beside sync allreduce: the ratio is of all the traffic. A 4-worker
// ring sends 2(W - 1)/W = 1.5 gradients per worker and step; a parameter server's worker pushes one and pulls one
// (the parameters), 2, so the dense parameter server is ~0.75x of the dense ring, not the 1.5x its pushes alone gave.
// Top-k pushes shrink, the dense pulls do not: ~1.5x, not the 70x of the pushes alone.
TEST(AsyncRunner, CompareRatiosOfAParameterServerCountItsPulls) {
  const std::string text =
      "study: \"ratio\"\n"
      "workload { name: \"mlp\" hidden_sizes: [64] }\n" +
      kData +
      "train_subset: 2048 test_subset: 500 }\n"
      "optimizer { lr: 0.05 }\n"
      "workers: 4\nepochs: 1\neval { per_epoch: true }\n"
      "parameter_server { servers: 2 }\n"
      "variants { name: \"sync-dense\" overrides { mode: SYNC } }\n"
      "variants { name: \"async-dense\" overrides { mode: ASYNC } }\n"
      "variants { name: \"async-topk\" overrides { mode: ASYNC compressor { name: \"topk\" params { key: \"ratio\" "
      "value: \"0.01\" } } error_feedback: true } }\n";
  const auto runs = runAll(text, "ratio");
  std::vector<std::string> warnings;
  const auto data = results::loadRuns({runs.at("sync-dense").summary.dir.parent_path()}, warnings);
  results::CompareOptions options;
  options.baseline = "sync-dense";
  const results::Comparison c = results::compare(data, options, warnings);
  ASSERT_EQ(c.studies.size(), 1u);
  std::map<std::string, results::CompareRow> rows;
  for (const auto& r : c.studies[0].rows) rows[r.variant] = r;
  ASSERT_TRUE(rows.at("async-dense").ratio && rows.at("async-topk").ratio);
  EXPECT_NEAR(*rows.at("async-dense").ratio, 0.75, 0.03);
  EXPECT_NEAR(*rows.at("async-topk").ratio, 1.5, 0.1);
  EXPECT_FALSE(rows.at("sync-dense").push_bytes);
  ASSERT_TRUE(rows.at("async-dense").push_bytes && rows.at("async-dense").pull_bytes);
  EXPECT_NEAR(*rows.at("async-dense").push_bytes + *rows.at("async-dense").pull_bytes,
              *rows.at("async-dense").wire_bytes, 1);
  EXPECT_EQ(*rows.at("async-topk").pull_bytes, *rows.at("async-dense").pull_bytes);
  const std::string md = results::toMarkdown(c);
  EXPECT_NE(md.find("push / pull MB/worker"), std::string::npos) << md;
}

TEST(AsyncRunner, AStragglerIsRecordedAndCatchesUpInAsyncMode) {
  // How much a straggler falls behind depends on the machine (on an oversubscribed one the sleeping straggler gets
  // its core back sooner than the busy workers do); the slowdown factor itself is tested on one thread below.
  const std::string text =
      "study: \"straggler\"\n"
      "workload { name: \"mlp\" hidden_sizes: [64] }\n" +
      kData +
      "train_subset: 6144 test_subset: 500 }\n"
      "optimizer { lr: 0.05 }\n"
      "workers: 3\nepochs: 1\neval { every_steps: 16 }\n"
      "mode: ASYNC\n"
      "worker_settings { worker: 0 slowdown: 4 }\n";
  const auto runs = runAll(text, "straggler");
  const auto& r = runs.at("base");
  EXPECT_EQ(r.state, "completed");
  ASSERT_GE(r.records.size(), 2u);
  // By the end every worker pushed all of its steps (same frames, one shard, no pings).
  const auto& last = r.records.back();
  EXPECT_EQ(num(last, "worker0_bytes_out"), num(last, "worker1_bytes_out"));
  EXPECT_EQ(num(last, "workers_live"), 3);
}

// Two Hogwild workers on one thread, stepping alternately 12 times on the same load, so that the ratio of their
// compute times is the options' doing (a straggler's sleep is (factor - 1) x the previous step's measured compute).
// Returns the two workers' compute seconds; `check` gets the shared parameters and a spare workload, for refusals.
std::pair<double, double> computeOfTwoWorkers(
    const train::AsyncTrainerOptions& first, const train::AsyncTrainerOptions& second,
    const std::function<void(train::HogwildParams&, train::Workload&)>& check = nullptr) {
  workloads::WorkloadOptions wo;
  wo.dims = 4000;
  wo.num_train = 2000;
  wo.num_test = 100;
  auto a = workloads::makeWorkload("linear_regression", wo, nullptr);
  auto b = workloads::makeWorkload("linear_regression", wo, nullptr);
  std::vector<float> flat(a->numParameters());
  train::copyValuesOut(a->params(), flat);
  train::LrScheduleOptions lr;
  lr.lr = 0.01;
  train::HogwildParams shared(flat, 2, lr, 0);
  train::HogwildWorker w0(*a, shared, 0, 2, first), w1(*b, shared, 1, 2, second);
  for (int t = 0; t < 12; ++t) {
    w0.step();
    w1.step();
  }
  if (check) check(shared, *b);
  return {w0.totals().compute_s, w1.totals().compute_s};
}

TEST(Straggler, SlowdownStretchesComputeByItsFactor) {
  train::AsyncTrainerOptions slow;
  slow.batch_size = 50;
  slow.slowdown = 8;
  train::AsyncTrainerOptions normal = slow;
  normal.slowdown = 1;
  const auto [slow_s, normal_s] =
      computeOfTwoWorkers(slow, normal, [](train::HogwildParams& shared, train::Workload& w) {
        train::AsyncTrainerOptions o;
        o.slowdown = 0.5;
        EXPECT_THROW(train::HogwildWorker(w, shared, 1, 2, o), InvalidArgument);
      });
  EXPECT_GT(slow_s, 3.0 * normal_s) << slow_s << " s vs " << normal_s << " s";
}

TEST(Straggler, ComputeJitterStretchesComputeInRealTime) {
  // As above, with compute jitter instead of a slowdown: factor = exp(1.5 |Z|), whose mean is 5.75.
  train::AsyncTrainerOptions jittered;
  jittered.batch_size = 50;
  jittered.jitter = {.sigma = 1.5, .seed = 1, .worker = 0};
  train::AsyncTrainerOptions normal = jittered;
  normal.jitter = {};
  const auto [jittered_s, normal_s] =
      computeOfTwoWorkers(jittered, normal, [](train::HogwildParams& shared, train::Workload& w) {
        train::AsyncTrainerOptions bad;
        bad.jitter.sigma = -1;
        EXPECT_THROW(train::HogwildWorker(w, shared, 1, 2, bad), InvalidArgument);
      });
  EXPECT_GT(jittered_s, 2.0 * normal_s) << jittered_s << " s vs " << normal_s << " s";
}

TEST(AsyncRunner, HogwildTrainsWithoutAWire) {
  const std::string text =
      "study: \"hogwild\"\n"
      "workload { name: \"mlp\" hidden_sizes: [64] }\n" +
      kData +
      "train_subset: 8192 test_subset: 2000 }\n"
      "optimizer { lr: 0.05 }\n"
      "workers: 4\nepochs: 2\neval { every_steps: 64 }\nmode: HOGWILD\n";
  const auto runs = runAll(text, "hogwild");
  const auto& r = runs.at("base");
  EXPECT_EQ(r.state, "completed");
  ASSERT_EQ(r.records.size(), 2u);
  EXPECT_GT(r.summary.final_accuracy, 0.7);
  EXPECT_EQ(r.summary.wire_bytes_per_worker, 0u);
  // 4 x 128 updates, each counted once with its staleness.
  double hist = 0;
  for (const auto& [k, v] : r.records.back().items())
    if (k.starts_with(results::kStalenessHistPrefix)) hist += getNumber(r.records.back(), k).value_or(0);
  EXPECT_EQ(hist, 4 * 128);
}

TEST(AsyncRunner, TcpWithoutAJobOfServersPlusWorkersRanksIsAClearError) {
  // Over TCP every shard and every worker is a process: a lone `terse run` (no launcher) is one rank, not 1 + 2.
  auto loader = PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
  const auto study = experiments::loadStudyText(
      "study: \"t\"\nworkload { name: \"linear_regression\" }\n"
      "mode: ASYNC\ntransport: TCP\nworkers: 2\n",
      "t.textproto", runnerConfigOptions(&loader));
  RunnerOptions o;
  o.loader = &loader;
  o.output_root = freshDir("tcp");
  o.progress = ProgressMode::kOff;
  Runner runner(o);
  try {
    runner.run(study.experiments.at(0));
    FAIL() << "ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs servers + workers = 1 + 2 = 3 ranks but this job has 1"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("terse launch -n 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(from no launcher: a single process)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace terse::runner
