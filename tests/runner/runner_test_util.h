// Helpers of the runner's end-to-end tests (runner_test.cc, simulated_runner_test.cc): fresh result folders, the
// records and status read back, a small linear-regression study, a loader over the build tree's plugins.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/plugin/loader.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner.h"
#include "results/json.h"

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

inline std::vector<results::FlatJson> readMetrics(const fs::path& dir) {
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

inline results::FlatJson readStatus(const fs::path& dir) {
  auto obj = results::parseFlatJson(readFile(dir / "status.json"));
  EXPECT_TRUE(obj.has_value());
  return obj.value_or(results::FlatJson{});
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

// Fields that measure time rather than training: two runs of one config never agree on them.
inline bool isTimeField(const std::string& key) {
  return key == "wall_s" || key.ends_with("_s_per_step");
}

inline std::vector<results::FlatJson> runStudy(PluginLoader& loader, const std::string& text, const fs::path& root) {
  const auto study = experiments::loadStudyText(text, "unit.textproto", runnerConfigOptions(&loader));
  Runner runner(quietOptions(loader, root));
  return readMetrics(runner.run(study.experiments.at(0)).dir);
}

}  // namespace terse::runner::test_util
