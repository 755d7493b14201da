// The results writer, the runner end to end (a results folder with parseable records and status completed; a run
// that breaks in the middle keeps its records and says failed; one seed gives the same metrics twice, another seed
// different ones), and `terse run` on a broken config, on one variant, and killed part-way (the folder stays valid),
// and the commit its provenance names: the one it was built from, also when run inside another git repository.
#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/common/json.h"
#include "core/plugin/loader.h"
#include "core/train/local_sgd_schedule.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/runner_detail.h"
#include "results/result_writer.h"
#include "runner_test_util.h"

namespace terse::runner {
namespace {
using namespace test_util;

TEST(ResultWriter, StatusLifecycle) {
  const fs::path root = freshDir("writer");
  results::MetricsRecord one;
  one.step = 1;
  {
    results::ResultWriter w(root, "s", "v");
    EXPECT_EQ(getString(readStatus(w.dir()), "state"), "running");
    w.append(one);
    EXPECT_EQ(readMetrics(w.dir()).size(), 1u);  // flushed per record, before the writer closes
    w.markCompleted();
    EXPECT_EQ(getString(readStatus(w.dir()), "state"), "completed");
  }
  {
    results::ResultWriter w(root, "s", "unfinished");
    w.append(one);
  }  // destroyed while running: an exception unwound past it
  const auto status = readStatus(root / "s" / "unfinished");
  EXPECT_EQ(getString(status, "state"), "failed");
  EXPECT_EQ(getNumber(status, "records"), 1);
}

// A run into the folder of an earlier one replaces that run: the files the earlier run wrote and this one may not
// (step traces, timelines, provenance) go, so that `terse whatif` cannot replay an earlier run's traces
// beside this run's metrics; files of other names stay.
TEST(ResultWriter, ARunReplacesAnEarlierRunsFiles) {
  const fs::path root = freshDir("writer_rerun");
  const fs::path dir = root / "s" / "v";
  fs::create_directories(dir);
  const std::vector<std::string> earlier = {"provenance.json", "steps.rank0.jsonl", "steps.rank12.jsonl",
                                            "trace.rank1.json", "metrics.jsonl"};
  // calibration.json too: a config may replay the table an earlier run measured there (simulation.calibration).
  const std::vector<std::string> kept = {"notes.txt", "steps.rankX.jsonl", "steps.rank.jsonl", "trace.rank2.json.bak",
                                         "calibration.json"};
  for (const auto& name : earlier) std::ofstream(dir / name) << "{\"earlier\":1}\n";
  for (const auto& name : kept) std::ofstream(dir / name) << "mine\n";
  results::ResultWriter w(root, "s", "v");
  for (const auto& name : earlier) {
    if (name == "metrics.jsonl") continue;
    EXPECT_FALSE(fs::exists(dir / name)) << name;
  }
  EXPECT_EQ(readFile(dir / "metrics.jsonl"), "");
  for (const auto& name : kept) EXPECT_EQ(readFile(dir / name), "mine\n") << name;
}

TEST(Runner, WritesResultsFolder) {
  auto loader = testLoader();
  const auto study = experiments::loadStudyText(studyText("compressor { name: \"none\" }"), "unit.textproto",
                                                runnerConfigOptions(&loader));
  const fs::path root = freshDir("ok");
  Runner runner(quietOptions(loader, root));
  const RunSummary s = runner.run(study.experiments.at(0));
  EXPECT_EQ(s.dir, root / "unit" / "base");
  EXPECT_EQ(getString(readStatus(s.dir), "state"), "completed");
  EXPECT_TRUE(fs::exists(s.dir / "config.textproto"));
  // The resolved config parses back to the experiment that ran.
  const auto back = experiments::parseConfigText(readFile(s.dir / "config.textproto"), "config.textproto");
  EXPECT_EQ(back.workers(), 2);
  const std::string prov = readFile(s.dir / "provenance.json");
  for (const char* key : {"\"git_commit\"", "\"host\"", "\"transport\":\"inproc\"", "\"world_size\":2",
                          "\"name\":\"none\"", "\"abi_version\"", "\"caps\"", "\"start_time\""}) {
    EXPECT_NE(prov.find(key), std::string::npos) << key << " missing in " << prov;
  }

  // 480 examples / 2 ranks / 16 = 15 steps per epoch, 30 in all: every 5 steps -> 6 records (epoch ends coincide).
  const auto records = readMetrics(s.dir);
  ASSERT_EQ(records.size(), 6u);
  double prev_wire = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(getNumber(records[i], "step"), 5.0 * static_cast<double>(i + 1));
    const double wire = getNumber(records[i], "wire_bytes_per_worker").value_or(0);
    EXPECT_GT(wire, prev_wire);
    EXPECT_GE(wire, getNumber(records[i], "payload_bytes_per_worker").value_or(0));  // headers included
    prev_wire = wire;
    for (const char* key :
         {"epoch", "test_accuracy", "test_loss", "train_loss", "wall_s", "compute_s_per_step", "compress_s_per_step",
          "decompress_s_per_step", "comm_s_per_step", "exposed_comm_s_per_step", "step_s_per_step"}) {
      EXPECT_TRUE(getNumber(records[i], key).has_value()) << key;
    }
    for (const char* key : {"compress_s_per_step", "decompress_s_per_step"}) {
      EXPECT_GE(getNumber(records[i], key).value_or(-1), 0) << key;
    }
  }
  EXPECT_EQ(getNumber(records.back(), "epoch"), 2);
  EXPECT_LT(getNumber(records.back(), "test_loss").value(), getNumber(records.front(), "test_loss").value());
  EXPECT_EQ(s.records, 6);
  EXPECT_EQ(s.steps, 30);
}

// The caps a run records say what was on the wire, as `terse plugins show` does (tests/cli: show_caps_wire_allgather):
// an allgather plugin's payloads are bytes, so no wire dtype ("-", not the f32 default its caps struct holds); a SUM
// plugin's is the dtype its payloads are summed as.
// Local SGD's evaluation points average too (sync_trainer.h): a run counts those off the period's grid, and says
// nothing when there are none, nor without local SGD, nor for evaluations the run never reaches or that fall on the
// last step (which averages anyway) or before start_step.
TEST(Runner, LocalSgdWarnsWhenEvaluationsChangeItsPeriod) {
  // The schedule as the trainer draws it (SyncTrainer::onSchedule), at a constant rate of 0.1.
  auto warning = [](const std::string& fields, int64_t steps_per_epoch, int64_t total) {
    experiments::Experiment e;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(fields, &e)) << fields;
    const auto& l = e.local_sgd();
    const train::LocalSgdSchedule schedule =
        l.period() > 0
            ? train::LocalSgdSchedule(l.period(), l.start_step(), l.qsr_alpha(), total, [](int64_t) { return 0.1; })
            : train::LocalSgdSchedule();
    return detail::localSgdEvaluationWarning(e, steps_per_epoch, total, schedule);
  };
  EXPECT_EQ(warning("eval { every_steps: 7 per_epoch: true }", 469, 2814), "");
  EXPECT_EQ(warning("local_sgd { period: 4 } eval { every_steps: 8 per_epoch: true }", 400, 1200), "");
  EXPECT_EQ(warning("local_sgd { period: 4 start_step: 12 } eval { per_epoch: true }", 40, 400), "");
  // 16 steps, evaluations at 235 (never reached) and at the epoch's end, the last step.
  for (const char* period : {"4", "5", "32"})
    EXPECT_EQ(
        warning(std::string("local_sgd { period: ") + period + " } eval { every_steps: 235 per_epoch: true }", 16, 16),
        "")
        << period;
  // Evaluations at 5 and 10 before start_step 12 are gradient steps.
  EXPECT_EQ(warning("local_sgd { period: 4 start_step: 12 } eval { every_steps: 5 }", 100, 13), "");
  // A run shortened below its start_step is synchronous throughout.
  EXPECT_EQ(warning("local_sgd { period: 4 start_step: 12 } eval { every_steps: 5 }", 100, 12),
            "local_sgd.start_step 12 is at or past the run's last step (12 steps): no local step runs, the run is "
            "synchronous SGD throughout; lower local_sgd.start_step or train longer");
  // 100, 200, ..., 2800 but 1000 and 2000.
  EXPECT_EQ(warning("local_sgd { period: 1000 } eval { every_steps: 100 }", 469, 2814),
            "26 evaluation points fall between the averagings of local_sgd.period 1000 (counted from start_step 0), "
            "the first after step 100: each averages the models too, with a shorter local phase before it (and, with "
            "an outer momentum, an outer step), 26 extra beside 2 scheduled averagings in 2814 steps; make "
            "eval.every_steps and the epoch (469 steps) multiples of the period, counted from start_step, for the "
            "period to hold");
  // The reference study: five epoch ends off the grid of 16 (the sixth is the last step).
  EXPECT_EQ(warning("local_sgd { period: 16 } eval { per_epoch: true }", 469, 2814).substr(0, 40),
            "5 evaluation points fall between the ave");
  // Every 10 and per epoch of 20 steps from start_step 2: 20 and 40 are off the grid of 4 (10, 30 and 50 are on it),
  // the epoch ends counted once, with every_steps.
  EXPECT_EQ(
      warning("local_sgd { period: 4 start_step: 2 } eval { every_steps: 10 per_epoch: true }", 20, 60).substr(0, 23),
      "2 evaluation points fal");
  // The quadratic synchronization rule at a rate of 0.1 and alpha 0.8: rounds of 64 steps (15 in 1000 steps), so
  // evaluations every 32 steps fall between them every other time (32, 96, ..., 992); every 64 steps they do not.
  EXPECT_EQ(warning("local_sgd { period: 4 qsr_alpha: 0.8 } eval { every_steps: 64 }", 1000, 1000), "");
  EXPECT_EQ(warning("local_sgd { period: 4 qsr_alpha: 0.8 } eval { every_steps: 32 }", 1000, 1000),
            "16 evaluation points fall between the averagings of local_sgd's quadratic synchronization rule (rounds of "
            "at least period 4 from start_step 0), the first after step 32: each averages the models too, with a "
            "shorter local phase before it (and, with an outer momentum, an outer step), 16 extra beside 15 scheduled "
            "averagings in 1000 steps; evaluate less often (eval.every_steps, eval.per_epoch) for the rule's rounds to "
            "hold");
}

// A dense warm-up end to end: the records up to compression_start_step are the dense run's (its payload and its
// losses, bit for bit), the bytes of each later step top-k's, the provenance names `none` in its role, and a
// warm-up as long as the run is a warning.
TEST(Runner, ADenseWarmupIsTheDenseRunUntilItsStartStep) {
  auto loader = testLoader();
  const auto run = [&](const std::string& block, const std::string& folder) {
    const auto study = experiments::loadStudyText(studyText(block), "unit.textproto", runnerConfigOptions(&loader));
    Runner runner(quietOptions(loader, freshDir(folder)));
    return runner.run(study.experiments.at(0)).dir;
  };
  const std::string topk =
      "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.25\" } }\n"
      "error_feedback: true\n";
  const fs::path dense = run("compressor { name: \"none\" }", "warm_dense");
  const fs::path warm = run(topk + "compression_start_step: 10", "warm_topk");
  const auto d = readMetrics(dense), w = readMetrics(warm);
  ASSERT_EQ(d.size(), 6u);
  ASSERT_EQ(w.size(), 6u);
  const auto payload = [](const Json& r) { return getNumber(r, "payload_bytes_per_worker").value_or(-1); };
  for (const std::size_t i : {std::size_t{0}, std::size_t{1}}) {  // steps 5 and 10
    EXPECT_EQ(payload(w[i]), payload(d[i])) << "step " << 5 * (i + 1);
    EXPECT_EQ(getNumber(w[i], "test_loss"), getNumber(d[i], "test_loss")) << "step " << 5 * (i + 1);
  }
  // From there on, top-k's bytes a step: the top-k run's, not the dense run's (9 floats against top-k's pairs).
  const auto t = readMetrics(run(topk, "warm_topk_only"));
  ASSERT_EQ(t.size(), 6u);
  for (std::size_t i = 2; i < 6; ++i) {
    EXPECT_EQ(payload(w[i]) - payload(w[i - 1]), payload(t[i]) - payload(t[i - 1])) << "step " << 5 * (i + 1);
    EXPECT_NE(payload(w[i]) - payload(w[i - 1]), payload(d[i]) - payload(d[i - 1])) << "step " << 5 * (i + 1);
  }
  EXPECT_NE(getNumber(w[2], "test_loss"), getNumber(d[2], "test_loss"));
  const auto prov = parseJsonObject(readFile(warm / "provenance.json"));
  ASSERT_TRUE(prov.has_value());
  std::vector<std::string> roles;
  for (const Json& p : prov->at("plugins"))
    roles.push_back(p.at("name").get<std::string>() + ":" +
                    (p.contains("role") ? p.at("role").get<std::string>() : ""));
  EXPECT_EQ(roles, (std::vector<std::string>{"topk:", "fifo:", "none:dense_warmup"}));
  EXPECT_EQ(experiments::parseConfigText(readFile(warm / "config.textproto"), "c").compression_start_step(), 10);

  experiments::Experiment e;
  e.mutable_compressor()->set_name("powersgd");
  e.set_compression_start_step(30);
  EXPECT_EQ(detail::compressionStartWarning(e, 31), "");
  EXPECT_EQ(detail::compressionStartWarning(e, 30),
            "compression_start_step 30 is at or past the run's last step (30 steps): compressor 'powersgd' never "
            "runs, every step is allreduced uncompressed; lower compression_start_step or train longer");
  e.mutable_compressor()->set_name("none");
  EXPECT_EQ(detail::compressionStartWarning(e, 100),
            "compression_start_step 30 with compressor 'none': every step is allreduced uncompressed anyway; the "
            "warm-up changes nothing");
  e.set_error_feedback(true);
  EXPECT_EQ(detail::compressionStartWarning(e, 100), "");
  e.clear_compression_start_step();
  EXPECT_EQ(detail::compressionStartWarning(e, 1), "");

  // A compressor's phases (dgc's warm-up stages begin at 3, 5, 8 and it ends at 10) that never all run.
  e.mutable_compressor()->set_name("dgc");
  const std::vector<uint64_t> phases{3, 5, 8, 10};
  EXPECT_EQ(detail::compressorPhasesWarning(e, {}, 5), "");
  EXPECT_EQ(detail::compressorPhasesWarning(e, phases, 11), "");
  EXPECT_EQ(detail::compressorPhasesWarning(e, phases, 10),
            "compressor 'dgc' changes its work per step until step 10 (its phases, e.g. dgc's warm-up), at or past "
            "the run's last step (10 steps): the run ends before its last phase; shorten the compressor's warm-up or "
            "train longer");
  e.set_compression_start_step(9);
  EXPECT_EQ(detail::compressorPhasesWarning(e, phases, 100), "");
  e.set_compression_start_step(10);
  EXPECT_EQ(detail::compressorPhasesWarning(e, phases, 100),
            "compressor 'dgc' changes its work per step until step 10 (its phases, e.g. dgc's warm-up), and "
            "compression_start_step 10 allreduces every step before that uncompressed: a compressor counts steps from "
            "0, the dense ones included, so none of those phases runs; shorten one of the two warm-ups");
}

TEST(Runner, ProvenanceRecordsTheWireDtypeOnlyForSum) {
  auto loader = testLoader();
  for (const auto& [name, aggregation, wire] :
       {std::tuple{"topk", "allgather", "-"}, std::tuple{"fp16", "sum", "f16"}}) {
    SCOPED_TRACE(name);
    const auto study = experiments::loadStudyText(studyText("compressor { name: \"" + std::string(name) + "\" }"),
                                                  "unit.textproto", runnerConfigOptions(&loader));
    const fs::path root = freshDir(std::string("wire_") + name);
    Runner runner(quietOptions(loader, root));
    const RunSummary s = runner.run(study.experiments.at(0));
    const auto prov = parseJsonObject(readFile(s.dir / "provenance.json"));
    ASSERT_TRUE(prov.has_value());
    const Json* compressor = nullptr;
    for (const Json& p : prov->at("plugins")) {
      if (p.at("name") == name) compressor = &p;
    }
    ASSERT_NE(compressor, nullptr) << prov->dump();
    EXPECT_EQ(compressor->at("caps").at("aggregation"), aggregation);
    EXPECT_EQ(compressor->at("caps").at("wire_dtype"), wire);
  }
}

// workload glove end to end from a config: a corpus file the test writes, the counts cached in the results folder,
// and the same held-out losses with fewer wire bytes when sparse_gradients sends the rows instead of the tensors.
TEST(Runner, GloveSparseGradientsSameLossFewerBytes) {
  auto loader = testLoader();
  const fs::path root = freshDir("glove");
  {
    std::ofstream corpus(root / "corpus.txt");
    uint64_t x = 11;
    for (int k = 0; k < 6000; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      corpus << (k % 89 == 0 ? std::string("time") : "w" + std::to_string((x >> 33) % 500)) << ' ';
    }
  }
  auto text = [&](bool sparse) {
    return "study: \"glove\"\nworkload { name: \"glove\" glove { corpus: \"" + (root / "corpus.txt").string() +
           "\" min_count: 1 window: 3 dim: 8 cache_dir: \"" + (root / "cache").string() +
           "\" } }\ndata { batch_size: 16 }\noptimizer { lr: 0.05 }\nworkers: 2\nepochs: 1\neval { every_steps: 100 }\n"
           "sparse_gradients: " +
           (sparse ? "true" : "false") + "\n";
  };
  const auto dense = runStudy(loader, text(false), root / "dense");
  const auto sparse = runStudy(loader, text(true), root / "sparse");
  EXPECT_EQ(std::distance(fs::directory_iterator(root / "cache"), fs::directory_iterator{}), 1);
  ASSERT_EQ(dense.size(), sparse.size());
  ASSERT_GE(dense.size(), 2u);
  for (std::size_t i = 0; i < dense.size(); ++i) {
    EXPECT_NEAR(getNumber(dense[i], "test_loss").value(), getNumber(sparse[i], "test_loss").value(), 1e-6);
    EXPECT_LT(5 * getNumber(sparse[i], "wire_bytes_per_worker").value(),
              getNumber(dense[i], "wire_bytes_per_worker").value());
  }
  EXPECT_LT(getNumber(dense.back(), "test_loss").value(), getNumber(dense.front(), "test_loss").value());
}

// The scheduler's negotiation is reported apart from the wire bytes, exactly: each round is one Bruck allgather of an
// 8-byte word per rank (core/comm/allgather_bruck.h), which sends 8 (n - 1) bytes in ceil(log2 n) frames of 32-byte
// headers per rank, so at 4 workers a round costs every rank 8 * 3 + 32 * 2 = 88 bytes.
// Provenance records each plugin's resolved parameters: the config gives qsgd only `levels`; its default
// bucket_size (qsgd.cc: 512), threads and rounding_bits and fusion's defaults (fusion.cc) are recorded too, as the
// plugins report them.
TEST(Runner, ProvenanceRecordsResolvedDefaults) {
  auto loader = testLoader();
  const std::string text = studyText(
      "compressor { name: \"qsgd\" params { key: \"levels\" value: \"15\" } }\nscheduler { name: \"fusion\" }");
  const auto study = experiments::loadStudyText(text, "unit.textproto", runnerConfigOptions(&loader));
  Runner runner(quietOptions(loader, freshDir("resolved")));
  const RunSummary s = runner.run(study.experiments.at(0));
  const auto prov = parseJsonObject(readFile(s.dir / "provenance.json"));
  ASSERT_TRUE(prov);
  const Json& qsgd = prov->at("plugins").at(0);
  EXPECT_EQ(qsgd.at("params"), Json({{"levels", "15"}}));
  EXPECT_EQ(qsgd.at("resolved_params"),
            Json({{"levels", "15"}, {"bucket_size", "512"}, {"threads", "1"}, {"rounding_bits", "24"}}))
      << dumpJson(qsgd);
  const Json& scheduler = prov->at("plugins").at(1);
  EXPECT_EQ(getString(scheduler, "kind"), "scheduler");
  EXPECT_EQ(scheduler.at("resolved_params"), Json({{"bucket_bytes", "4194304"}, {"credit_bytes", "0"}}))
      << dumpJson(scheduler);
}

TEST(Runner, ControlBytesAreTheNegotiationRoundsFrames) {
  auto loader = testLoader();
  for (const char* scheduler : {"fifo", "fusion"}) {
    SCOPED_TRACE(scheduler);
    const auto study = experiments::loadStudyText(
        studyText("compressor { name: \"none\" }\nscheduler { name: \"" + std::string(scheduler) + "\" }", 4),
        "unit.textproto", runnerConfigOptions(&loader));
    const fs::path root = freshDir(std::string("control_") + scheduler);
    Runner runner(quietOptions(loader, root));
    const RunSummary s = runner.run(study.experiments.at(0));
    const auto records = readMetrics(s.dir);
    ASSERT_FALSE(records.empty());
    for (const auto& r : records) {
      const double rounds = getNumber(r, "negotiation_rounds_per_worker").value_or(-1);
      const double control = getNumber(r, "control_bytes_per_worker").value_or(-1);
      EXPECT_GT(rounds, 0) << "every step negotiates at least once";
      EXPECT_EQ(control, rounds * (8 * 3 + 32 * 2));
    }
  }
}

TEST(Runner, FailingRunKeepsRecordsAndSaysFailed) {
  auto loader = testLoader();
  // Rank 1's compressor fails at step 12: records at steps 5 and 10 are written first.
  expectFailsAtStep12(loader, failAtStep12Study(), freshDir("fail"));
}

TEST(Runner, SameSeedSameMetricsOtherSeedOtherMetrics) {
  auto loader = testLoader();
  // A lossy compressor with per-rank state, so compressor determinism is covered too, not only the data order.
  const std::string text = studyText("compressor { name: \"topk\" params { key: \"ratio\" value: \"0.25\" } }");
  const auto a = runStudy(loader, text, freshDir("seed_a"));
  const auto b = runStudy(loader, text, freshDir("seed_b"));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << "record " << i;
    for (const auto& [key, value] : a[i].items()) {
      if (isTimeField(key)) continue;
      ASSERT_TRUE(b[i].contains(key)) << key;
      EXPECT_EQ(b[i].at(key), value) << "record " << i << ", field " << key;
    }
  }

  std::string other = text;
  other.replace(other.find("seed: 5"), 7, "seed: 6");
  const auto c = runStudy(loader, other, freshDir("seed_c"));
  ASSERT_EQ(c.size(), a.size());
  // Another seed draws another initialization and data order: the losses must move (the byte counts need not).
  EXPECT_NE(c.back().at("test_loss"), a.back().at("test_loss"));
  EXPECT_NE(c.front().at("train_loss"), a.front().at("train_loss"));
}

// metrics.jsonl as a reader of a possibly killed run must take it: every newline-terminated line is a record; text
// after the last newline is a line the writer had not finished (see result_writer.h) and is handed back, not parsed.
std::vector<std::string> completeLines(const std::string& text, std::string& partial) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    lines.push_back(text.substr(start, nl - start));
  partial = text.substr(start);
  return lines;
}

TEST(ResultReader, SetsATornLastLineAside) {
  std::string partial;
  const auto lines = completeLines("{\"step\":2}\n{\"step\":4}\n{\"step\":", partial);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(parseJsonObject(lines[1]).has_value());
  EXPECT_EQ(partial, "{\"step\":");
  EXPECT_FALSE(parseJsonObject(partial).has_value());
}

// `terse run` as a child process that is killed and reaped however the test ends: a leaked child would keep writing
// into the results folder and outlive the test.
class Child {
 public:
  Child(std::vector<std::string> args, const fs::path& log) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    spawn_error_ = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawn_error_ != 0) pid_ = -1;
  }
  ~Child() { kill(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  int spawnError() const { return spawn_error_; }
  // True once the child has ended on its own (reaped here).
  bool exited() {
    if (pid_ <= 0) return true;
    if (::waitpid(pid_, &status_, WNOHANG) != pid_) return false;
    pid_ = -1;
    return true;
  }
  // SIGKILL and reap; returns the wait status.
  int kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int spawn_error_ = 0;
  int status_ = 0;
};

std::size_t countNewlines(const fs::path& p) {
  const std::string text = readFile(p);
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

TEST(RunCommand, KilledRunLeavesValidResults) {
  const fs::path dir = freshDir("cli_killed");
  const fs::path config = dir / "slow.textproto";
  // 2 workers, 5 ms per message on every link: a few tens of ms per step, 150 steps (seconds), a record every 2
  // steps. The test kills the run after two records, long before the end.
  std::ofstream(config) << "study: \"unit\"\n"
                           "workload { name: \"linear_regression\" }\n"
                           "data { batch_size: 16 train_subset: 480 test_subset: 100 }\n"
                           "optimizer { lr: 0.02 }\n"
                           "workers: 2\n"
                           "epochs: 10\n"
                           "eval { every_steps: 2 per_epoch: false }\n"
                           "link { latency: \"5ms\" }\n"
                           "seed: 5\n"
                           "compressor { name: \"none\" }\n";
  const fs::path out = dir / "results";
  const fs::path run_dir = out / "unit" / "base";
  Child child({TERSE_TEST_TERSE_BIN, "run", config.string(), "--out", out.string(), "--plugin-path",
               TERSE_TEST_BUILD_PLUGIN_DIR},
              dir / "terse.log");
  ASSERT_EQ(child.spawnError(), 0) << std::strerror(child.spawnError());

  // A hard deadline: the child is killed (by ~Child too) however the wait ends.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool ready = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(run_dir / "metrics.jsonl") && countNewlines(run_dir / "metrics.jsonl") >= 2) {
      ready = true;
      break;
    }
    if (child.exited()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int status = child.kill();
  ASSERT_TRUE(ready) << "no two records before the child ended or the deadline passed:\n"
                     << readFile(dir / "terse.log");
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the run ended before the kill";

  // The resolved config and the provenance were written whole (temporary file + rename) before training started.
  const auto back = experiments::parseConfigText(readFile(run_dir / "config.textproto"), "config.textproto");
  EXPECT_EQ(back.workers(), 2);
  EXPECT_EQ(back.eval().every_steps(), 2);
  EXPECT_TRUE(parseJsonObject(readFile(run_dir / "provenance.json"))) << readFile(run_dir / "provenance.json");

  std::string partial;
  const auto lines = completeLines(readFile(run_dir / "metrics.jsonl"), partial);
  ASSERT_GE(lines.size(), 2u);
  double prev_step = 0;
  for (const auto& line : lines) {
    const auto record = parseJsonObject(line);
    ASSERT_TRUE(record.has_value()) << "unparseable record: " << line;
    const double step = getNumber(*record, "step").value_or(-1);
    EXPECT_GT(step, prev_step);
    EXPECT_EQ(static_cast<int64_t>(step) % 2, 0) << "records come every 2 steps";
    prev_step = step;
  }
  // The writer hands each record to the OS in one write (result_writer.h), so a kill cannot tear a line.
  EXPECT_EQ(partial, "") << "torn last line";

  // The process died before it could say anything else.
  EXPECT_EQ(getString(readStatus(run_dir), "state"), "running");
}

// Runs `terse ARGS` through the shell, after `before` (shell commands, e.g. a ulimit) when given.
int runTerse(const std::string& args, std::string& output, const std::string& before = "") {
  const std::string cmd = before + std::string("'") + TERSE_TEST_TERSE_BIN + "' " + args + " 2>&1";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(RunCommand, BrokenConfigFailsBeforeTraining) {
  const fs::path dir = freshDir("cli");
  const fs::path config = dir / "broken.textproto";
  std::ofstream(config) << studyText("compressor { name: \"none\" }") << "variants { name: \"a\" }\n"
                        << "variants {\n  name: \"b\"\n  overrides { optimizer { lr: -0.1 } }\n}\n";
  std::string out;
  const int rc = runTerse("run '" + config.string() + "' --out '" + (dir / "results").string() + "'", out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("broken.textproto:13:"), std::string::npos) << out;  // the line of `lr: -0.1`
  EXPECT_NE(out.find("lr must be > 0"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "results")) << "variant 'a' trained before the config was rejected";
}

// An untrusted config is refused before anything runs, with exit status 1 and a message naming the file and the field,
// never a signal: 5,000 levels of nesting overflowed protobuf's parser (SIGSEGV), `workers: 100000` was a
// std::bad_alloc a minute into the setup, and a latency of 1e10 s was accepted and ignored.
TEST(RunCommand, OutOfBoundsConfigsAreRefusedBeforeAnythingRuns) {
  const fs::path dir = freshDir("cli_bounds");
  std::string deep = "study: \"unit\"\n";
  for (int i = 0; i < 5000; ++i) deep += "variants { overrides { ";
  for (int i = 0; i < 5000; ++i) deep += "} } ";
  const std::string ok = studyText("compressor { name: \"none\" }", 1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {deep, "deep.textproto:2:"},
      {deep, "messages nest deeper than 32 levels"},
      {studyText("compressor { name: \"none\" }", 100000), "workers must be in [1, 1024], got 100000"},
      {ok + "link { latency: \"1e10s\" }\n",
       "link.latency: duration '1e10s' is 1e+10 s, longer than the limit of 3600 s"},
  };
  for (const auto& [text, expected] : cases) {
    const fs::path config = dir / (text == deep ? "deep.textproto" : "bounds.textproto");
    std::ofstream(config) << text;
    std::string out;
    const int rc = runTerse("run '" + config.string() + "' --out '" + (dir / "results").string() + "'", out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find(expected), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(dir / "results")) << out;
  }
  // The command line's --workers is bounded like the file's.
  std::ofstream(dir / "ok.textproto") << ok;
  std::string out;
  EXPECT_EQ(runTerse("run '" + (dir / "ok.textproto").string() + "' --workers 100000 --out '" +
                         (dir / "results").string() + "'",
                     out),
            1)
      << out;
  EXPECT_NE(out.find("--workers 100000: workers must be in [1, 1024], got 100000"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "results")) << out;
}

// Counts within their limits can still multiply past a machine: a setup that runs out of memory says what it was
// allocating, not a bare std::bad_alloc. Under a 4 GB address-space limit an MLP with hidden layers [1, 65536, 65536]
// (4.3e9 parameters in its last hidden layer, 17 GB) cannot be made; the small layers before it take no time.
TEST(RunCommand, OutOfMemoryInTheSetupNamesWhatWasBeingAllocated) {
  const fs::path dir = freshDir("cli_oom");
  std::ofstream(dir / "oom.textproto") << "study: \"oom\"\n"
                                          "workload { name: \"mlp\" hidden_sizes: [1, 65536, 65536] }\n"
                                          "data { batch_size: 16 train_subset: 64 test_subset: 16 }\n"
                                          "workers: 2\n";
  std::string out;
  const int rc = runTerse("run '" + (dir / "oom.textproto").string() + "' --out '" + (dir / "results").string() + "'",
                          out, "ulimit -v 4000000 && ");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("allocating 2 model replicas of workload 'mlp' (hidden sizes [1, 65536, 65536]): out of memory"),
            std::string::npos)
      << out;
  EXPECT_EQ(getString(readStatus(dir / "results" / "oom" / "base"), "state"), "failed");
}

TEST(RunCommand, RunsOneVariant) {
  const fs::path dir = freshDir("cli_ok");
  const fs::path config = dir / "ok.textproto";
  std::ofstream(config) << studyText("compressor { name: \"none\" }", 1) << "variants { name: \"a\" }\n"
                        << "variants { name: \"b\" overrides { compressor { name: \"fp16\" } } }\n";
  std::string out;
  const int rc = runTerse("run '" + config.string() + "' --variant b --workers 2 --out '" + (dir / "results").string() +
                              "' --plugin-path '" + TERSE_TEST_BUILD_PLUGIN_DIR + "'",
                          out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("wire MB/worker"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "results" / "unit" / "a"));
  EXPECT_EQ(getString(readStatus(dir / "results" / "unit" / "b"), "state"), "completed");
}

TEST(RunCommand, SeedsOptionRunsEachVariantPerSeedAndRefusesABadList) {
  const fs::path dir = freshDir("cli_seeds");
  const fs::path config = dir / "ok.textproto";
  std::ofstream(config) << studyText("compressor { name: \"none\" }", 1) << "variants { name: \"a\" }\n";
  std::string out;
  EXPECT_NE(runTerse("run '" + config.string() + "' --seeds 1,x --out '" + (dir / "results").string() + "'", out), 0);
  EXPECT_NE(out.find("--seeds: '1,x' is not a comma-separated list"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "results"));

  const int rc = runTerse("run '" + config.string() + "' --seeds 4,5 --workers 2 --out '" + (dir / "results").string() +
                              "' --plugin-path '" + TERSE_TEST_BUILD_PLUGIN_DIR + "'",
                          out);
  EXPECT_EQ(rc, 0) << out;
  for (const char* seed : {"seed-4", "seed-5"})
    EXPECT_EQ(getString(readStatus(dir / "results" / "unit" / "a" / seed), "state"), "completed") << seed;
  EXPECT_FALSE(fs::exists(dir / "results" / "unit" / "a" / "seed-1"));
}

// The output of a shell command, trailing newlines dropped; nullopt when it fails.
std::optional<std::string> shellOutput(const std::string& cmd) {
  std::FILE* pipe = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  char buf[512];
  std::string out;
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
  if (::pclose(pipe) != 0) return std::nullopt;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// What a build of the source tree records as git_commit (results/build_commit.h), asked of git here and now: HEAD,
// "-dirty" when tracked files have changes, "unknown" when the source is not the top of its own checkout. Equal to
// what the build saw as long as the tree has not moved since: a test run after a checkout or an edit without a
// rebuild fails, as it should (the binary is not the source's).
std::string sourceCommit() {
  const std::string git = "git -C '" + std::string(TERSE_TEST_SOURCE_DIR) + "' ";
  const auto out = shellOutput(git + "rev-parse --show-toplevel HEAD");
  if (!out) return "unknown";
  const auto newline = out->find('\n');
  if (newline == std::string::npos) return "unknown";
  std::error_code ec;
  if (fs::canonical(out->substr(0, newline), ec) != fs::canonical(TERSE_TEST_SOURCE_DIR, ec)) return "unknown";
  const auto status = shellOutput(git + "status --porcelain --untracked-files=no");
  if (!status) return "unknown";
  return out->substr(newline + 1) + (status->empty() ? "" : "-dirty");
}

// Runs `binary run` of a one-variant study from the working directory `cwd` and returns the git_commit its
// provenance.json records (empty when the run failed, with the output in a test failure).
std::string recordedCommit(const fs::path& binary, const fs::path& cwd, const fs::path& dir) {
  const fs::path config = dir / "commit.textproto";
  std::ofstream(config) << studyText("compressor { name: \"none\" }", 1);
  const std::string cmd = "cd '" + cwd.string() + "' && '" + binary.string() + "' run '" + config.string() +
                          "' --out '" + (dir / "results").string() + "' --plugin-path '" + TERSE_TEST_BUILD_PLUGIN_DIR +
                          "' 2>&1";
  std::string out;
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return "";
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
  if (::pclose(pipe) != 0) {
    ADD_FAILURE() << cmd << " failed:\n" << out;
    return "";
  }
  const auto prov = parseJsonObject(readFile(dir / "results" / "unit" / "base" / "provenance.json"));
  if (!prov || !prov->contains("git_commit") || !prov->at("git_commit").is_string()) {
    ADD_FAILURE() << "no git_commit in " << (dir / "results" / "unit" / "base" / "provenance.json");
    return "";
  }
  return prov->at("git_commit").get<std::string>();
}

// git_commit is the commit the binary was built from, as the build found the source tree.
TEST(RunCommandProvenance, RecordsTheCommitTerseWasBuiltFrom) {
  const fs::path dir = freshDir("commit_built");
  const std::string expected = sourceCommit();
  const std::string recorded = recordedCommit(TERSE_TEST_TERSE_BIN, dir, dir);
  EXPECT_EQ(recorded, expected) << "the binary records another commit than the source's: built before the last "
                                   "checkout, commit or edit of a tracked file? Rebuild, then run the test again";
  if (expected != "unknown") {
    EXPECT_EQ(recorded.substr(0, 40).find_first_not_of("0123456789abcdef"), std::string::npos) << recorded;
    EXPECT_TRUE(recorded.size() == 40 || (recorded.size() == 46 && recorded.ends_with("-dirty"))) << recorded;
  }
}

// A terse outside its source tree (as installed), run inside a user's own git repository, still names the commit it
// was built from, not that repository's HEAD: git_commit was `git rev-parse HEAD` of the executable's folder, then of
// the working directory, at run time. The binary is linked into the repository, so /proc/self/exe names a folder there.
TEST(RunCommandProvenance, IgnoresTheRepositoryItRunsIn) {
  const fs::path dir = freshDir("commit_elsewhere");
  const fs::path repo = dir / "user-repo";
  fs::create_directories(repo / "bin");
  const std::string git = "git -C '" + repo.string() + "' -c user.name=t -c user.email=t@t -c commit.gpgsign=false ";
  if (!shellOutput(git + "init -q")) GTEST_SKIP() << "git is missing: no repository to run in";
  std::ofstream(repo / "a.txt") << "the user's file\n";
  ASSERT_TRUE(shellOutput(git + "add a.txt && " + git + "commit -qm one"));
  const auto users_head = shellOutput(git + "rev-parse HEAD");
  ASSERT_TRUE(users_head);
  const fs::path binary = repo / "bin" / "terse";
  std::error_code ec;
  fs::create_hard_link(TERSE_TEST_TERSE_BIN, binary, ec);
  if (ec) fs::copy_file(TERSE_TEST_TERSE_BIN, binary);
  const std::string recorded = recordedCommit(binary, repo, dir);
  EXPECT_NE(recorded.substr(0, 40), *users_head) << "the run recorded the HEAD of the repository it ran in";
  EXPECT_EQ(recorded, sourceCommit());
}

}  // namespace
}  // namespace terse::runner
