// Helpers of the runner's end-to-end tests (runner_test.cc, simulated_runner_test.cc): fresh result folders, the
// records and status read back, a small linear-regression study, a loader over the build tree's plugins.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/common/json.h"
#include "core/plugin/loader.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner.h"

namespace terse::runner::test_util {

namespace fs = std::filesystem;

inline fs::path freshDir(const std::string& name) {
  const fs::path dir = fs::path(TERSE_TEST_BINARY_DIR) / "tests" / "runner_out" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

inline std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<Json> readMetrics(const fs::path& dir) {
  std::vector<Json> out;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto obj = parseJsonObject(line);
    EXPECT_TRUE(obj.has_value()) << "unparseable record: " << line;
    if (obj) out.push_back(*obj);
  }
  return out;
}

inline Json readStatus(const fs::path& dir) {
  auto obj = parseJsonObject(readFile(dir / "status.json"));
  EXPECT_TRUE(obj.has_value());
  return obj.value_or(Json{});
}

inline std::string studyText(const std::string& compressor_block, int workers = 2) {
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

inline PluginLoader testLoader() {
  return PluginLoader::withSearchDirs(
      {{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}, {TERSE_TEST_RUNNER_FIXTURE_DIR, "fixtures", true}});
}

inline RunnerOptions quietOptions(PluginLoader& loader, const fs::path& root) {
  RunnerOptions o;
  o.loader = &loader;
  o.output_root = root;
  o.progress = ProgressMode::kOff;
  return o;
}

// Fields that measure time rather than training: two runs of one config never agree on them. The scheduler
// negotiation's rounds and bytes are among them: how many rounds the ranks need depends on how their paces interleave.
inline bool isTimeField(const std::string& key) {
  return key == "wall_s" || key.ends_with("_s_per_step") || key == "control_bytes_per_worker" ||
         key == "negotiation_rounds_per_worker";
}

inline std::vector<Json> runStudy(PluginLoader& loader, const std::string& text, const fs::path& root) {
  const auto study = experiments::loadStudyText(text, "unit.textproto", runnerConfigOptions(&loader));
  Runner runner(quietOptions(loader, root));
  return readMetrics(runner.run(study.experiments.at(0)).dir);
}

// A study whose rank 1 compressor fails at step 12 (the fail_at_step fixture), with `extra` appended to the config.
// A config the loader must refuse, with `needle` in its message (the field, the value, the rule).
inline void expectConfigError(const std::string& text, const std::string& needle) {
  auto loader = testLoader();
  try {
    experiments::loadStudyText(text, "unit.textproto", runnerConfigOptions(&loader));
    FAIL() << "accepted: " << text;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

inline std::string failAtStep12Study(const std::string& extra = "") {
  const std::string plugin = (fs::path(TERSE_TEST_RUNNER_FIXTURE_DIR) / "terse_compressor_fail_at_step.so").string();
  return studyText("compressor { name: \"" + plugin +
                   "\" params { key: \"fail_step\" value: \"12\" } params { key: \"fail_rank\" value: \"1\" } }\n" +
                   extra);
}

// Runs it under `root`: RunFailed with the plugin's message naming rank 1, the records at steps 5 and 10 kept, status
// failed with the error. Returns the run's message.
inline std::string expectFailsAtStep12(PluginLoader& loader, const std::string& text, const fs::path& root) {
  const auto study = experiments::loadStudyText(text, "unit.textproto", runnerConfigOptions(&loader));
  Runner runner(quietOptions(loader, root));
  std::string message;
  try {
    runner.run(study.experiments.at(0));
    ADD_FAILURE() << "the run should have failed";
  } catch (const RunFailed& e) {
    message = e.what();
    EXPECT_NE(message.find("failing on purpose at step 12"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1: "), std::string::npos) << message;
    EXPECT_EQ(e.dir(), root / "unit" / "base");
  }
  const fs::path dir = root / "unit" / "base";
  const auto status = readStatus(dir);
  EXPECT_EQ(getString(status, "state"), "failed");
  EXPECT_EQ(getNumber(status, "records"), 2);
  EXPECT_NE(getString(status, "error").value_or("").find("fail_at_step"), std::string::npos);
  const auto records = readMetrics(dir);
  EXPECT_EQ(records.size(), 2u);
  if (records.size() == 2) {
    EXPECT_EQ(getNumber(records[1], "step"), 10);
  }
  return message;
}

}  // namespace terse::runner::test_util
