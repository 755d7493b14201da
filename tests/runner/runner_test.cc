// The results writer, the runner end to end (a results folder with parseable records and status completed; a run
// that breaks in the middle keeps its records and says failed), and `terse run` on a broken config.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/plugin/loader.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner.h"
#include "results/json.h"
#include "results/result_writer.h"

namespace terse::runner {
namespace {

namespace fs = std::filesystem;

fs::path freshDir(const std::string& name) {
  const fs::path dir = fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "runner_out" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<results::FlatJson> readMetrics(const fs::path& dir) {
  std::vector<results::FlatJson> out;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto obj = results::parseFlatJson(line);
    EXPECT_TRUE(obj.has_value()) << "unparseable record: " << line;
    if (obj) out.push_back(*obj);
  }
  return out;
}

results::FlatJson readStatus(const fs::path& dir) {
  auto obj = results::parseFlatJson(readFile(dir / "status.json"));
  EXPECT_TRUE(obj.has_value());
  return obj.value_or(results::FlatJson{});
}

std::string studyText(const std::string& compressor_block, int workers = 2) {
  return "study: \"unit\"\n"
         "workload { name: \"linear_regression\" }\n"
         "data { batch_size: 16 train_subset: 480 test_subset: 100 }\n"
         "optimizer { lr: 0.02 momentum: 0.9 warmup_steps: 4 schedule: COSINE }\n"
         "workers: " +
         std::to_string(workers) +
         "\n"
         "epochs: 2\n"
         "eval { every_steps: 5 per_epoch: true }\n"
         "seed: 5\n" +
         compressor_block + "\n";
}

PluginLoader testLoader() {
  return PluginLoader::withSearchDirs(
      {{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}, {TERSE_TEST_RUNNER_FIXTURE_DIR, "fixtures", true}});
}

RunnerOptions quietOptions(PluginLoader& loader, const fs::path& root) {
  RunnerOptions o;
  o.loader = &loader;
  o.output_root = root;
  o.progress = ProgressMode::kOff;
  return o;
}

TEST(JsonWriter, EscapesAndRoundTrips) {
  const std::string text = results::JsonObject()
                               .add("s", "a\"b\\c\nd\x01")
                               .add("x", 0.1)
                               .add("n", int64_t{-3})
                               .add("b", true)
                               .add("inf", 1.0 / 0.0)
                               .str();
  auto obj = results::parseFlatJson(text);
  ASSERT_TRUE(obj.has_value()) << text;
  EXPECT_EQ(results::getString(*obj, "s"), "a\"b\\c\nd\x01");
  EXPECT_EQ(results::getNumber(*obj, "x"), 0.1);  // 17 digits round-trip exactly
  EXPECT_EQ(results::getNumber(*obj, "n"), -3);
  EXPECT_TRUE(std::holds_alternative<std::nullptr_t>(obj->at("inf")));
  EXPECT_FALSE(results::parseFlatJson("{\"a\":1").has_value());  // a torn line
}

TEST(ResultWriter, StatusLifecycle) {
  const fs::path root = freshDir("writer");
  {
    results::ResultWriter w(root, "s", "v");
    EXPECT_EQ(results::getString(readStatus(w.dir()), "state"), "running");
    w.append({.step = 1});
    EXPECT_EQ(readMetrics(w.dir()).size(), 1u);  // flushed per record, before the writer closes
    w.markCompleted();
    EXPECT_EQ(results::getString(readStatus(w.dir()), "state"), "completed");
  }
  {
    results::ResultWriter w(root, "s", "unfinished");
    w.append({.step = 1});
  }  // destroyed while running: an exception unwound past it
  const auto status = readStatus(root / "s" / "unfinished");
  EXPECT_EQ(results::getString(status, "state"), "failed");
  EXPECT_EQ(results::getNumber(status, "records"), 1);
}

TEST(Runner, WritesResultsFolder) {
  auto loader = testLoader();
  const auto study = experiments::loadStudyText(studyText("compressor { name: \"none\" }"), "unit.textproto",
                                                runnerConfigOptions(&loader));
  const fs::path root = freshDir("ok");
  Runner runner(quietOptions(loader, root));
  const RunSummary s = runner.run(study.experiments.at(0));
  EXPECT_EQ(s.dir, root / "unit" / "base");
  EXPECT_EQ(results::getString(readStatus(s.dir), "state"), "completed");
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
    EXPECT_EQ(results::getNumber(records[i], "step"), 5.0 * static_cast<double>(i + 1));
    const double wire = results::getNumber(records[i], "wire_bytes_per_worker").value_or(0);
    EXPECT_GT(wire, prev_wire);
    EXPECT_GE(wire, results::getNumber(records[i], "payload_bytes_per_worker").value_or(0));  // headers included
    prev_wire = wire;
    for (const char* key : {"epoch", "test_accuracy", "test_loss", "train_loss", "wall_s", "compute_s_per_step",
                            "compress_s_per_step", "comm_s_per_step", "exposed_comm_s_per_step"}) {
      EXPECT_TRUE(results::getNumber(records[i], key).has_value()) << key;
    }
  }
  EXPECT_EQ(results::getNumber(records.back(), "epoch"), 2);
  EXPECT_LT(results::getNumber(records.back(), "test_loss").value(),
            results::getNumber(records.front(), "test_loss").value());
  EXPECT_EQ(s.records, 6);
  EXPECT_EQ(s.steps, 30);
}

TEST(Runner, FailingRunKeepsRecordsAndSaysFailed) {
  auto loader = testLoader();
  // Rank 1's compressor fails at step 12: records at steps 5 and 10 are written first.
  const std::string plugin = (fs::path(TERSE_TEST_RUNNER_FIXTURE_DIR) / "terse_compressor_fail_at_step.so").string();
  const auto study = experiments::loadStudyText(
      studyText("compressor { name: \"" + plugin +
                "\" params { key: \"fail_step\" value: \"12\" } params { key: \"fail_rank\" value: \"1\" } }"),
      "unit.textproto", runnerConfigOptions(&loader));
  const fs::path root = freshDir("fail");
  Runner runner(quietOptions(loader, root));
  try {
    runner.run(study.experiments.at(0));
    FAIL() << "the run should have failed";
  } catch (const RunFailed& e) {
    EXPECT_NE(std::string(e.what()).find("failing on purpose at step 12"), std::string::npos) << e.what();
    EXPECT_EQ(e.dir(), root / "unit" / "base");
  }
  const fs::path dir = root / "unit" / "base";
  const auto status = readStatus(dir);
  EXPECT_EQ(results::getString(status, "state"), "failed");
  EXPECT_NE(results::getString(status, "error").value_or("").find("fail_at_step"), std::string::npos);
  const auto records = readMetrics(dir);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(results::getNumber(records[1], "step"), 10);
}

int runTerse(const std::string& args, std::string& output) {
  const std::string cmd = std::string("'") + TERSE_TEST_TERSE_BIN + "' " + args + " 2>&1";
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
  EXPECT_EQ(results::getString(readStatus(dir / "results" / "unit" / "b"), "state"), "completed");
}

}  // namespace
}  // namespace terse::runner
