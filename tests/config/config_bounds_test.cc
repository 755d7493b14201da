// A config is untrusted text (experiments/config/limits.h): nesting deep enough to overflow the parser's stack,
// durations that overflow a clock, counts that become allocations without end and lists that made the checks take
// minutes are each refused at load time with the field, the value and the limit; the checks stay linear at the limits.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/plugin/loader.h"
#include "experiments/config/config.h"

namespace terse::experiments {
namespace {

class ConfigBounds : public ::testing::Test {
 protected:
  ConfigBounds() : loader_(PluginLoader::withSearchDirs({SearchDir{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}})) {
    options_.workloads = {"linear_regression", "softmax", "mlp", "cnn", "glove", "pytorch"};
    options_.loader = &loader_;
    options_.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP, Experiment::HOGWILD};
    options_.transports = {Experiment::INPROC, Experiment::TCP};
  }

  Study load(const std::string& text) { return loadStudyText(text, "t.textproto", options_); }

  std::vector<std::string> errorsOf(const std::string& text) {
    try {
      load(text);
    } catch (const ConfigError& e) {
      return e.errors();
    }
    ADD_FAILURE() << "loaded without error:\n" << text.substr(0, 2000);
    return {};
  }

  // Exactly one error, and it contains `part`.
  void expectOneError(const std::string& text, const std::string& part) {
    const auto errors = errorsOf(text);
    ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
    EXPECT_NE(errors[0].find(part), std::string::npos) << errors[0] << "\nexpected to contain: " << part;
  }

  PluginLoader loader_;
  ConfigOptions options_;
};

const std::string kBase = "study: \"s\"\nworkload { name: \"mlp\" }\n";  // two lines: what tests add starts on line 3

std::string nested(int levels) {
  std::string text = "study: \"s\"\n";
  for (int i = 0; i < levels; ++i) text += "variants { overrides { ";
  for (int i = 0; i < levels; ++i) text += "} } ";
  return text + "\n";
}

// 5,000 levels overflowed the stack of protobuf's recursive parser (SIGSEGV); now the parser stops at the limit and
// the error says where.
TEST_F(ConfigBounds, DeepNestingIsRefusedNotACrash) {
  for (int levels : {5000, 17}) {  // 17 x 2 = 34 messages deep: just over the limit of 32
    try {
      parseConfigText(nested(levels), "deep.textproto");
      ADD_FAILURE() << levels << " levels parsed";
    } catch (const ConfigError& e) {
      ASSERT_EQ(e.errors().size(), 1u) << e.what();
      EXPECT_EQ(e.errors()[0].rfind("deep.textproto:2:", 0), 0u) << e.errors()[0];
      EXPECT_NE(e.errors()[0].find("messages nest deeper than 32 levels here; a valid config nests at most 4"),
                std::string::npos)
          << e.errors()[0];
    }
  }
  EXPECT_NO_THROW(parseConfigText(nested(16), "deep.textproto"));  // 32 deep parses (and is refused later: nesting)
  expectOneError(nested(5000), "t.textproto:2:");
}

TEST_F(ConfigBounds, DurationsAreBoundedAndNameFieldValueAndLimit) {
  // A latency of 1e10 s used to be accepted and silently ignored (it overflows the pacer's int64 nanoseconds).
  expectOneError(kBase + "link { latency: \"1e10s\" }\n",
                 "t.textproto:3:8: link.latency: duration '1e10s' is 1e+10 s, longer than the limit of 3600 s");
  expectOneError(kBase + "link { latency: \"1e300s\" }\n", "link.latency: duration '1e300s' is 1e+300 s, longer");
  expectOneError(kBase + "link { latency: \"3601s\" }\n", "longer than the limit of 3600 s");
  for (const char* bad : {"1e400s", "nans", "infs", "-1ms"})
    expectOneError(kBase + "link { latency: \"" + bad + "\" }\n", std::string("duration '") + bad + "' is not valid");
  load(kBase + "link { latency: \"3600s\" }\n");
  load(kBase + "link { latency: \"3600000ms\" }\n");
  expectOneError(kBase + "workers: 2\nlink { overrides { src: 0 dst: 1 latency: \"2h\" } }\n",
                 "link.overrides[0].latency: duration '2h' is not valid");
  expectOneError(kBase + "workers: 2\nlink { overrides { src: 0 dst: 1 latency: \"7200s\" } }\n",
                 "link.overrides[0].latency: duration '7200s' is 7200 s, longer than the limit of 3600 s");
  expectOneError(kBase + "tcp { timeout: \"86401s\" }\n",
                 "tcp.timeout: duration '86401s' is 86401 s, longer than the limit of 86400 s");
  expectOneError(kBase + "mode: ASYNC\nparameter_server { worker_timeout: \"1e9s\" }\n",
                 "parameter_server.worker_timeout: duration '1e9s' is 1e+09 s, longer than the limit of 86400 s");
  expectOneError(kBase + "clock: SIMULATED\nsimulation { topology { workers_per_node: 1 nic_latency: \"1e6s\" } }\n",
                 "simulation.topology.nic_latency: duration '1e6s' is 1e+06 s, longer than the limit of 3600 s");
  // In a variant: the variant is named with its index, the line is the variant's.
  const auto errors =
      errorsOf(kBase + "variants { name: \"a\" }\nvariants { name: \"b\" }\nvariants { name: \"c\" }\n" +
               "variants { name: \"slow\" overrides { link { latency: \"1e10s\" } } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0],
            "t.textproto:6:44: variants[3] (\"slow\").link.latency: duration '1e10s' is 1e+10 s, longer than the "
            "limit of 3600 s");
}

TEST_F(ConfigBounds, BandwidthsAndRatesAreBounded) {
  expectOneError(kBase + "link { bandwidth: \"1e300Tbps\" }\n", "link.bandwidth: bandwidth '1e300Tbps' is too large");
  expectOneError(kBase + "link { bandwidth: \"100bps\" }\n",
                 "link.bandwidth '100bps' must be in [1Kbps, 1000Tbps] or \"unlimited\"");
  expectOneError(kBase + "link { nic: \"2000Tbps\" }\n", "link.nic '2000Tbps' must be in [1Kbps, 1000Tbps]");
  load(kBase + "link { bandwidth: \"1Kbps\" nic: \"1000Tbps\" nic_ingress: \"unlimited\" }\n");
  expectOneError(kBase + "clock: SIMULATED\nsimulation { compute: FLOP_MODEL flops_per_second: 1e300 }\n",
                 "simulation.flops_per_second must be in [1e+06, 1e+18], got 1e+300");
}

// workers: 100000 answered std::bad_alloc after a minute of allocating; it is refused at once, naming the limit.
TEST_F(ConfigBounds, CountsAreBoundedAndNameTheLimit) {
  expectOneError(kBase + "workers: 100000\n",
                 "t.textproto:3:1: workers must be in [1, 1024], got 100000 (the most `terse launch -n` starts");
  expectOneError(kBase + "workers: 2147483647\n", "workers must be in [1, 1024], got 2147483647");
  load(kBase + "workers: 1024\n");
  expectOneError(kBase + "epochs: 1000000\n", "epochs must be in [1, 100000], got 1000000");
  expectOneError(kBase + "data { batch_size: 1000000 }\n", "data.batch_size must be in [1, 65536], got 1000000");
  expectOneError(kBase + "gradient_accumulation_steps: 5000\n",
                 "gradient_accumulation_steps must be in [1, 1024], got 5000");
  expectOneError(kBase + "mode: ASYNC\nparameter_server { servers: 5000 }\n",
                 "parameter_server.servers must be in [1, 1024], got 5000");
  expectOneError(kBase + "mode: SSP\nstaleness_bound: 2000000000\n",
                 "staleness_bound must be in [0, 1000000], got 2000000000");
  expectOneError("study: \"s\"\nworkload { name: \"mlp\" hidden_sizes: [8, 100000] }\n",
                 "workload.hidden_sizes[1] must be in [1, 65536], got 100000");
  expectOneError("study: \"s\"\nworkload { name: \"cnn\" conv_channels: [8, 5000] }\n",
                 "workload.conv_channels[1] must be in [1, 1024], got 5000");
  expectOneError(kBase + "workers: 2\nworker_settings { worker: 1 slowdown: 1e300 }\n",
                 "worker_settings[0].slowdown must be in [1, 1000], got 1e+300");
  expectOneError(kBase + "tcp { socket_buffer_bytes: 2000000000 }\n",
                 "tcp.socket_buffer_bytes must be in [0, 1073741824], got 2000000000");
  expectOneError(kBase + "clock: SIMULATED\nsimulation { topology { workers_per_node: 1 nics_per_node: 1000000 } }\n",
                 "simulation.topology.nics_per_node must be at most 64, got 1000000");
  // (The command line's --workers is --set workers=N, bounded as the file is: tests/cli, run_workers_bounded.)
  Study study = load(kBase);
  // A million seeds on the command line: one error about the count (the duplicate check used to compare every pair).
  std::vector<uint64_t> many(1000000, 7);
  try {
    overrideSeeds(study.experiments, many);
    ADD_FAILURE() << "a million seeds accepted";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.errors().size(), 1u);
    EXPECT_NE(e.errors()[0].find("seeds lists 1000000 seeds, at most 100"), std::string::npos) << e.errors()[0];
  }
}

TEST_F(ConfigBounds, ListsAndStringsAreBoundedBeforeVariantsAreResolved) {
  std::string layers;
  for (int i = 0; i < 1025; ++i) layers += (i ? ", " : "") + std::string("8");
  expectOneError("study: \"s\"\nworkload { name: \"mlp\" hidden_sizes: [" + layers + "] }\n",
                 "t.textproto:2:24: workload.hidden_sizes lists 1025 entries, at most 1024");
  expectOneError(kBase + "variants { name: \"a\" overrides { workload { hidden_sizes: [" + layers + "] } } }\n",
                 "t.textproto:3:45: variants[0].overrides.workload.hidden_sizes lists 1025 entries, at most 1024");
  std::string seeds;
  for (int i = 0; i < 101; ++i) seeds += (i ? ", " : "") + std::to_string(i);
  expectOneError(kBase + "seeds: [" + seeds + "]\n", "seeds lists 101 entries, at most 100");
  expectOneError("study: \"" + std::string(5000, 'x') + "\"\nworkload { name: \"mlp\" }\n",
                 "t.textproto:1:1: study is 5000 bytes long, at most 4096 ('xxxxxxxxxxxxxxxxxxxxxxxx...')");
  expectOneError(
      kBase + "compressor { name: \"none\" params { key: \"k\" value: \"" + std::string(5000, 'v') + "\" } }\n",
      "compressor.params[0].value is 5000 bytes long, at most 4096");
  // Each variant is a copy of the base: 300 variants of a 1 MB base would be 300 MB of copies.
  std::string params;
  for (int i = 0; i < 256; ++i)
    params += "params { key: \"k" + std::to_string(i) + "\" value: \"" + std::string(4000, 'v') + "\" } ";
  std::string text = kBase + "compressor { name: \"none\" " + params + "}\n";
  for (int i = 0; i < 300; ++i) text += "variants { name: \"v" + std::to_string(i) + "\" }\n";
  const auto errors = errorsOf(text);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("variants: 300 variants, each a copy of a base of "), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("more than the limit of 268435456; shorten the base's lists or split the study"),
            std::string::npos)
      << errors[0];
}

// Every repeated field and map of the schema has a limit (listLimit): a list added without one would be unbounded.
TEST(ConfigLimits, EveryListOfTheSchemaHasALimit) {
  std::vector<const google::protobuf::Descriptor*> todo{Experiment::descriptor()};
  std::set<const google::protobuf::Descriptor*> seen;
  int lists = 0;
  while (!todo.empty()) {
    const auto* type = todo.back();
    todo.pop_back();
    if (!seen.insert(type).second) continue;
    for (int i = 0; i < type->field_count(); ++i) {
      const auto* f = type->field(i);
      if (f->is_repeated()) {
        ++lists;
        EXPECT_GE(listLimit(*f), 0) << f->full_name() << " has no limit in listLimit (experiments/config/config.cc)";
      }
      if (f->message_type() != nullptr) todo.push_back(f->message_type());
    }
  }
  // variants, worker_settings, seeds, hidden_sizes, conv_channels, milestones, overrides, params, grid, grid[].values,
  // grid_point.coordinates
  EXPECT_EQ(lists, 11);
}

// The largest study the limits allow loads, and one over them is refused with one message naming the limit. 100,000
// variants or layers used to be checked for minutes (a duplicate-name check comparing every pair of variants, a plugin
// load per variant); the checks are now linear, and a list over its limit is refused before anything looks into it.
// No wall-clock threshold here: ctest's TIMEOUT (tests/config/CMakeLists.txt) catches a return of quadratic work; the
// numbers are in the commit that made them linear.
TEST_F(ConfigBounds, LargestStudiesLoadAndLargerOnesAreRefusedAtOnce) {
  std::string layers;
  for (int i = 0; i < limits::kHiddenLayers; ++i) layers += (i ? ", " : "") + std::string("8");
  const std::string base = "study: \"s\"\nworkload { name: \"mlp\" hidden_sizes: [" + layers +
                           "] }\ncompressor { name: \"topk\" params { key: \"ratio\" value: \"0.1\" } }\n";
  std::string text = base;
  for (int i = 0; i < limits::kVariants; ++i) {
    text += "variants { name: \"v" + std::to_string(i) + "\" overrides { optimizer { lr: 0." +
            std::to_string(i % 9 + 1) + "} } }\n";
  }
  const Study study = load(text);
  ASSERT_EQ(study.experiments.size(), static_cast<std::size_t>(limits::kVariants));
  EXPECT_EQ(study.experiments.back().variant(), "v9999");
  EXPECT_EQ(study.experiments.back().workload().hidden_sizes_size(), limits::kHiddenLayers);

  // A repeated name at the end is found (once) without comparing every pair.
  const std::string dup = text + "variants { name: \"v0\" }\n";
  auto errors = errorsOf(dup);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("variants lists 10001 entries, at most 10000"), std::string::npos) << errors[0];
  text.replace(text.rfind("name: \"v9999\""), 13, "name: \"v17\"");
  errors = errorsOf(text);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("variants[9999].name 'v17' repeats variants[17].name"), std::string::npos) << errors[0];

  // Every variant wrong: the first 100 errors, then a line saying the list stops there.
  std::string bad = "study: \"s\"\nworkload { name: \"mlp\" }\n";
  for (int i = 0; i < limits::kVariants; ++i)
    bad += "variants { name: \"v" + std::to_string(i) + "\" overrides { optimizer { lr: -1 } } }\n";
  errors = errorsOf(bad);
  ASSERT_EQ(errors.size(), kMaxReportedErrors + 1);
  EXPECT_EQ(errors.back(), "t.textproto: stopped after the first 100 errors");

  // Ten times the limits: one error each, before any variant is resolved or any layer checked.
  std::string many = "study: \"s\"\nworkload { name: \"mlp\" }\n";
  for (int i = 0; i < 10 * limits::kVariants; ++i) many += "variants { name: \"v" + std::to_string(i) + "\" }\n";
  errors = errorsOf(many);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0], "t.textproto:3:1: variants lists 100000 entries, at most 10000");
  std::string deep_layers;
  for (int i = 0; i < 100 * limits::kHiddenLayers; ++i) deep_layers += (i ? ", " : "") + std::string("0");
  errors = errorsOf("study: \"s\"\nworkload { name: \"mlp\" hidden_sizes: [" + deep_layers + "] }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0], "t.textproto:2:24: workload.hidden_sizes lists 102400 entries, at most 1024");
}

// The example studies stay within the limits (and valid): every file of experiments/configs, with every mode and
// transport a full build offers.
TEST_F(ConfigBounds, EveryExampleConfigLoads) {
  options_.transports = {Experiment::INPROC, Experiment::TCP, Experiment::NCCL};
  options_.cuda_workloads = {"softmax", "mlp", "cnn"};
  int files = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(TERSE_TEST_SOURCE_DIR) + "/experiments/configs")) {
    if (entry.path().extension() != ".textproto") continue;
    ++files;
    try {
      loadStudy(entry.path(), options_);
    } catch (const std::exception& e) {
      ADD_FAILURE() << entry.path().filename() << ": " << e.what();
    }
  }
  EXPECT_GE(files, 10);
}

// A file is read only up to the limit: a larger one, or a device that never ends, is refused without reading it all.
TEST_F(ConfigBounds, AFileOverTheSizeLimitIsRefused) {
  try {
    loadStudy("/dev/zero", options_);
    ADD_FAILURE() << "/dev/zero loaded";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.errors().size(), 1u);
    EXPECT_NE(e.errors()[0].find("/dev/zero: more than "), std::string::npos) << e.errors()[0];
    EXPECT_NE(e.errors()[0].find("bytes, larger than the limit of 67108864 bytes (64 MiB) for a config"),
              std::string::npos)
        << e.errors()[0];
  }
}

}  // namespace
}  // namespace terse::experiments
