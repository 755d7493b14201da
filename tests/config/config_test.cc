// Experiment configs: the quickstart study loads, every class of error is reported with file:line and the field,
// variants merge by the documented rules, and a resolved config survives a round trip through text.
#include "experiments/config/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/plugin/loader.h"
#include "experiments/config/quickstart.h"

namespace terse::experiments {
namespace {

const std::vector<std::string> kWorkloads = {"linear_regression", "softmax", "mlp", "cnn", "glove", "pytorch"};

class ConfigTest : public ::testing::Test {
 protected:
  ConfigTest() : loader_(PluginLoader::withSearchDirs({SearchDir{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}})) {
    options_.workloads = kWorkloads;
    options_.loader = &loader_;
  }

  Study load(const std::string& text) { return loadStudyText(text, "t.textproto", options_); }

  // The errors loading `text` reports; fails the test when it loads.
  std::vector<std::string> errorsOf(const std::string& text) {
    try {
      load(text);
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.source(), "t.textproto");
      return e.errors();
    }
    ADD_FAILURE() << "loaded without error:\n" << text;
    return {};
  }

  // Exactly one error, equal to `expected`.
  void expectError(const std::string& text, const std::string& expected) {
    auto errors = errorsOf(text);
    ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
    EXPECT_EQ(errors[0], expected);
  }

  PluginLoader loader_;
  ConfigOptions options_;
};

// A valid study of one experiment, with line numbers the tests below rely on.
const std::string kMinimal =
    "study: \"s\"\n"                    // 1
    "workload { name: \"mlp\" }\n"      // 2
    "optimizer {\n"                     // 3
    "  lr: 0.1\n"                       // 4
    "}\n"                               // 5
    "compressor { name: \"none\" }\n";  // 6

TEST_F(ConfigTest, QuickstartLoadsAndValidates) {
  Study study = loadStudyText(quickstartConfigText(), std::string(kQuickstartSourceName), options_);
  ASSERT_EQ(study.experiments.size(), 5u);
  EXPECT_EQ(study.experiments[0].variant(), "dense");
  EXPECT_EQ(study.experiments[2].variant(), "qsgd-8bit");
  EXPECT_EQ(study.experiments[3].variant(), "topk-1pct-ef");
  EXPECT_EQ(study.experiments[3].compressor().name(), "topk");
  EXPECT_TRUE(study.experiments[3].error_feedback());
  // DGC's recipe: the optimizer's momentum moves into the codec's momentum correction.
  EXPECT_DOUBLE_EQ(study.experiments[3].momentum_correction().factor(), 0.9);
  EXPECT_DOUBLE_EQ(study.experiments[3].optimizer().momentum(), 0.0);
  EXPECT_DOUBLE_EQ(study.experiments[0].optimizer().momentum(), 0.9);
  EXPECT_FALSE(study.experiments[0].error_feedback());
  for (const auto& e : study.experiments) {
    EXPECT_EQ(e.study(), "quickstart");
    EXPECT_EQ(e.workers(), 4);
    EXPECT_EQ(e.workload().name(), "mlp");
    EXPECT_EQ(e.variants_size(), 0);
    EXPECT_DOUBLE_EQ(emulationConfig(e).link.bandwidth_bps, 1e9);
  }
}

TEST_F(ConfigTest, QuickstartFileMatchesEmbeddedCopy) {
  std::ifstream in(std::string(TERSE_TEST_SOURCE_DIR) + "/experiments/configs/quickstart.textproto");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, quickstartConfigText());
  Study study = loadStudy(std::string(TERSE_TEST_SOURCE_DIR) + "/experiments/configs/quickstart.textproto", options_);
  EXPECT_EQ(study.experiments.size(), 5u);
}

TEST_F(ConfigTest, MinimalGetsDefaults) {
  Study study = load(kMinimal);
  ASSERT_EQ(study.experiments.size(), 1u);
  const Experiment& e = study.experiments[0];
  EXPECT_EQ(e.variant(), "base");
  EXPECT_EQ(e.data().dataset_dir(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(e.workers(), 1);
  EXPECT_EQ(e.mode(), Experiment::SYNC);
  EXPECT_EQ(e.scheduler().name(), "fifo");
  EXPECT_FALSE(emulationConfig(e).enabled());
}

TEST_F(ConfigTest, UnknownField) {
  expectError("study: \"s\"\noptimizer {\n  lrr: 0.1\n}\n",
              "t.textproto:3:3: optimizer: Message type \"terse.experiments.Optimizer\" has no field named \"lrr\"; "
              "did you mean 'lr'?");
}

// An unknown name after a known field is not that field: the path is the enclosing message's ("optimizer", not
// "optimizer.lr", the field the tokens named last), at any depth and at the top level; the errors that are about a
// field still name it when another field comes first.
TEST_F(ConfigTest, UnknownFieldAfterAnotherNamesTheMessage) {
  expectError("study: \"s\"\noptimizer {\n  lr: 0.1\n  momentun: 0.9\n}\n",
              "t.textproto:4:3: optimizer: Message type \"terse.experiments.Optimizer\" has no field named "
              "\"momentun\"; did you mean 'momentum'?");
  expectError("workload {\n  name: \"pytorch\"\n  pytorch {\n    module: \"m.py\"\n    max_step_per_epoch: 2\n  }\n}\n",
              "t.textproto:5:5: workload.pytorch: Message type \"terse.experiments.PyTorch\" has no field named "
              "\"max_step_per_epoch\"; did you mean 'max_steps_per_epoch'?");
  expectError("study: \"s\"\nepoch: 1\n",
              "t.textproto:2:1: Message type \"terse.experiments.Experiment\" has no field named \"epoch\"; did you "
              "mean 'epochs'?");
  expectError("study: \"s\"\noptimizer { momentum: 0.9 schedule: COSINEE }\n",
              "t.textproto:2:37: optimizer.schedule: Unknown enumeration value of \"COSINEE\" for field \"schedule\"; "
              "did you mean COSINE?");
  expectError("study: \"s\"\noptimizer { momentum: 0.9 lr: \"fast\" }\n",
              "t.textproto:2:31: optimizer.lr: Expected double, got: \"fast\"");
  expectError("study: \"s\"\noptimizer { lr: 0.1 lr: 0.2 }\n",
              "t.textproto:2:21: optimizer.lr: Non-repeated field \"lr\" is specified multiple times.");
  // At the top level, after another field: the path is the repeated field's, not the one before it.
  expectError("study: \"s\"\nepochs: 2\nseed: 1\nseed: 2\n",
              "t.textproto:4:1: seed: Non-repeated field \"seed\" is specified multiple times.");
}

TEST_F(ConfigTest, WrongType) {
  expectError("study: \"s\"\noptimizer { lr: \"fast\" }\n",
              "t.textproto:2:17: optimizer.lr: Expected double, got: \"fast\"");
}

TEST_F(ConfigTest, BadEnum) {
  expectError("study: \"s\"\nmode: FAST\n",
              "t.textproto:2:7: mode: Unknown enumeration value of \"FAST\" for field \"mode\"; it takes SYNC, ASYNC, "
              "SSP, HOGWILD");
}

TEST_F(ConfigTest, SyntaxError) {
  auto errors = errorsOf("study: \"s\"\nworkload { name: \"mlp\"\n");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].rfind("t.textproto:3:1: ", 0), 0u) << errors[0];
}

TEST_F(ConfigTest, NegativeLr) {
  std::string text = kMinimal;
  text.replace(text.find("0.1"), 3, "-0.1");
  expectError(text, "t.textproto:4:3: optimizer.lr must be > 0, got -0.1");
}

TEST_F(ConfigTest, AccumulationAndClippingNameTheirField) {
  expectError(kMinimal + "gradient_accumulation_steps: 0\n",
              "t.textproto:7:1: gradient_accumulation_steps must be in [1, 1024], got 0");
  std::string text = kMinimal;
  text.replace(text.find("lr: 0.1"), 7, "lr: 0.1 clip_grad_norm: -2");
  expectError(text, "t.textproto:4:11: optimizer.clip_grad_norm must be >= 0, got -2");
  std::string infinite = kMinimal;
  infinite.replace(infinite.find("lr: 0.1"), 7, "lr: 0.1 clip_grad_norm: inf");
  expectError(infinite, "t.textproto:4:11: optimizer.clip_grad_norm must be finite and >= 0, got inf");
  // A parameter-server worker accumulates its own micro-batches (this test's runner options offer SYNC only: that
  // error is all).
  const auto async = errorsOf(kMinimal + "mode: ASYNC\ngradient_accumulation_steps: 4\n");
  EXPECT_TRUE(std::none_of(async.begin(), async.end(), [](const std::string& e) {
    return e.find("gradient_accumulation_steps") != std::string::npos;
  })) << ::testing::PrintToString(async);
  text.replace(text.find("-2"), 2, "1");
  EXPECT_NO_THROW(load(text + "gradient_accumulation_steps: 4\n"));
  // A worker clips its own gradient before the push (this test's runner options offer SYNC only: that error is all).
  const auto clipped = errorsOf(text + "mode: ASYNC\n");
  EXPECT_TRUE(std::none_of(clipped.begin(), clipped.end(), [](const std::string& e) {
    return e.find("clip_grad_norm") != std::string::npos;
  })) << ::testing::PrintToString(clipped);
  const auto sparse = errorsOf(text + "sparse_gradients: true\n");
  EXPECT_TRUE(std::any_of(sparse.begin(), sparse.end(), [](const std::string& e) {
    return e.find("optimizer.clip_grad_norm: sparse_gradients applies each row-sparse tensor") != std::string::npos;
  })) << ::testing::PrintToString(sparse);
}

TEST_F(ConfigTest, MaxGroupsInFlightNamesItsField) {
  expectError(kMinimal + "max_groups_in_flight: 0\n",
              "t.textproto:7:1: max_groups_in_flight must be in [1, 64], got 0");
  const auto async = errorsOf(kMinimal + "mode: ASYNC\nmax_groups_in_flight: 4\n");
  EXPECT_TRUE(std::any_of(async.begin(), async.end(), [](const std::string& e) {
    return e.find("max_groups_in_flight: groups are the sync trainer's; mode ASYNC") != std::string::npos;
  })) << ::testing::PrintToString(async);
  EXPECT_NO_THROW(load(kMinimal + "max_groups_in_flight: 4\n"));
}

// compute_jitter: written into the resolved config only when set (an unset one reads as before the field), every bad
// sigma refused with its value, and workload pytorch, whose steps are torch's, refuses it by name.
TEST_F(ConfigTest, ComputeJitterNamesItsField) {
  const Experiment plain = load(kMinimal).experiments.at(0);
  EXPECT_FALSE(plain.has_compute_jitter());
  EXPECT_EQ(toText(plain).find("compute_jitter"), std::string::npos) << toText(plain);
  const Experiment set = load(kMinimal + "compute_jitter: 0.5\n").experiments.at(0);
  EXPECT_EQ(set.compute_jitter(), 0.5);
  EXPECT_NE(toText(set).find("compute_jitter: 0.5"), std::string::npos) << toText(set);
  expectError(kMinimal + "compute_jitter: -0.1\n", "t.textproto:7:1: compute_jitter must be in [0, 4], got -0.1");
  expectError(kMinimal + "compute_jitter: 5\n", "t.textproto:7:1: compute_jitter must be in [0, 4], got 5");
  expectError(kMinimal + "compute_jitter: inf\n", "t.textproto:7:1: compute_jitter must be in [0, 4], got inf");
  const auto nan = errorsOf(kMinimal + "compute_jitter: nan\n");
  ASSERT_EQ(nan.size(), 1u) << ::testing::PrintToString(nan);
  EXPECT_NE(nan[0].find("compute_jitter must be"), std::string::npos) << nan[0];
  EXPECT_NE(nan[0].find("got nan"), std::string::npos) << nan[0];
  const auto torch = errorsOf(
      "study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" } }\nclock: REAL_TIME\n"
      "compute_jitter: 0.5\n");
  ASSERT_EQ(torch.size(), 1u) << ::testing::PrintToString(torch);
  EXPECT_EQ(torch[0],
            "t.textproto:4:1: compute_jitter: workload pytorch has no per-step compute jitter (its steps "
            "are torch's), got 0.5");
  options_.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP, Experiment::HOGWILD};
  for (const char* mode : {"SYNC", "ASYNC", "SSP", "HOGWILD"})
    EXPECT_NO_THROW(load(kMinimal + "workers: 2\ncompute_jitter: 1\nmode: " + mode + "\n" +
                         (std::string(mode) == "SSP" ? "staleness_bound: 1\n" : "")))
        << mode;
}

// SSP's bound has no default: left out, the study would run in lockstep (SYNC through the parameter server) under
// SSP's name. The other modes still get 0 written in.
TEST_F(ConfigTest, SspNeedsItsBound) {
  options_.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP};
  const auto errors = errorsOf(kMinimal + "workers: 2\nmode: SSP\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find(": mode: SSP needs staleness_bound set"), std::string::npos) << errors[0];
  EXPECT_EQ(load(kMinimal + "workers: 2\nmode: SSP\nstaleness_bound: 0\n").experiments.at(0).staleness_bound(), 0);
  const Experiment async = load(kMinimal + "workers: 2\nmode: ASYNC\n").experiments.at(0);
  EXPECT_TRUE(async.has_staleness_bound());
  EXPECT_EQ(async.staleness_bound(), 0);
}

TEST_F(ConfigTest, MissingPlugin) {
  std::string text = kMinimal;
  text.replace(text.find("\"none\""), 6, "\"topk2\"");
  auto errors = errorsOf(text);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].rfind("t.textproto:6:14: compressor.name: compressor 'topk2' not found", 0), 0u) << errors[0];
  EXPECT_NE(errors[0].find(TERSE_TEST_BUILD_PLUGIN_DIR), std::string::npos) << errors[0];
}

TEST_F(ConfigTest, BadPluginParamInVariant) {
  auto errors = errorsOf(kMinimal +
                         "variants { name: \"a\" }\n"                      // 7
                         "variants {\n"                                    // 8
                         "  name: \"topk-ef\"\n"                           // 9
                         "  overrides {\n"                                 // 10
                         "    compressor {\n"                              // 11
                         "      name: \"topk\"\n"                          // 12
                         "      params { key: \"ratio\" value: \"2\" }\n"  // 13
                         "    }\n"                                         // 14
                         "  }\n"                                           // 15
                         "}\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0].rfind("t.textproto:13:7: variants[1] (\"topk-ef\").compressor.params: ", 0), 0u) << errors[0];
  EXPECT_NE(errors[0].find("topk: 'ratio' must be in (0, 1], got 2"), std::string::npos) << errors[0];
}

TEST_F(ConfigTest, MissingPluginInVariant) {
  auto errors = errorsOf(kMinimal + "variants { name: \"x\" overrides { compressor { name: \"nope\" } } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0].rfind("t.textproto:7:47: variants[0] (\"x\").compressor.name: compressor 'nope' not found", 0),
            0u)
      << errors[0];
}

// `terse run --variant`: only the selected variants' plugins are loaded (ConfigOptions::plugin_variants), so a variant
// naming a plugin this machine lacks does not stop another; every field of every variant is still checked.
TEST_F(ConfigTest, OnlyTheSelectedVariantsPluginsAreLoaded) {
  const std::string text = kMinimal +
                           "variants { name: \"good\" }\n"                                            // 7
                           "variants { name: \"elsewhere\" overrides { compressor { name: \"nope\" "  // 8
                           "params { key: \"ratio\" value: \"2\" } } } }\n";
  options_.plugin_variants = {"good"};
  const Study study = load(text);
  ASSERT_EQ(study.experiments.size(), 2u);
  EXPECT_EQ(study.experiments[1].compressor().name(), "nope");

  // A bad value in the unselected variant still fails, naming it; its plugin is still not looked for.
  auto errors = errorsOf(text + "variants { name: \"typo\" overrides { optimizer { lr: -1 } } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0].rfind("t.textproto:9:49: variants[2] (\"typo\").optimizer.lr must be > 0, got -1", 0), 0u)
      << errors[0];
  // An unselected variant's plugin name must still be set.
  errors = errorsOf(text + "variants { name: \"unnamed\" overrides { compressor { name: \"\" } } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("variants[2] (\"unnamed\").compressor.name must be set"), std::string::npos) << errors[0];

  // Selecting the variant, or every variant (no selection), loads its plugin and fails naming it and the variant.
  for (const auto& selected : {std::vector<std::string>{"elsewhere"}, std::vector<std::string>{}}) {
    options_.plugin_variants = selected;
    errors = errorsOf(text);
    ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
    EXPECT_EQ(errors[0].rfind(
                  "t.textproto:8:55: variants[1] (\"elsewhere\").compressor.name: compressor 'nope' not found", 0),
              0u)
        << errors[0];
  }
}

TEST_F(ConfigTest, DuplicateVariant) {
  expectError(kMinimal + "variants { name: \"a\" }\nvariants { name: \"a\" }\n",
              "t.textproto:8:12: variants[1].name 'a' repeats variants[0].name");
}

TEST_F(ConfigTest, BadBandwidth) {
  auto errors = errorsOf(kMinimal + "link { bandwidth: \"10 furlongs\" }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0].rfind("t.textproto:7:8: link.bandwidth: ", 0), 0u) << errors[0];
  EXPECT_NE(errors[0].find("10 furlongs"), std::string::npos) << errors[0];
}

TEST_F(ConfigTest, UnknownWorkloadEmptyStudyAndWorkers) {
  auto errors = errorsOf("study: \"\"\nworkload { name: \"resnet\" }\nworkers: 0\n");
  ASSERT_EQ(errors.size(), 3u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0], "t.textproto:1:1: study must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got ''");
  EXPECT_EQ(errors[1],
            "t.textproto:2:12: workload.name: unknown workload 'resnet' (known: linear_regression, softmax, mlp, cnn, "
            "glove, pytorch)");
  EXPECT_EQ(errors[2],
            "t.textproto:3:1: workers must be in [1, 1024], got 0 (the most `terse launch -n` starts and the simulator "
            "is studied at)");
}

// conv_channels and dropout belong to the cnn: two channel counts there, and an error anywhere else (they used to be
// accepted and ignored).
TEST_F(ConfigTest, CnnShapeFields) {
  const Study ok = load(
      "study: \"s\"\nworkload { name: \"cnn\" conv_channels: [32, 48] hidden_sizes: [64] dropout: "
      "0.25 }\n");
  EXPECT_EQ(ok.experiments[0].workload().conv_channels_size(), 2);
  EXPECT_EQ(ok.experiments[0].workload().dropout(), 0.25);
  EXPECT_EQ(load("study: \"s\"\nworkload { name: \"cnn\" }\n").experiments[0].workload().dropout(), 0);
  EXPECT_FALSE(load(kMinimal).experiments[0].workload().has_dropout()) << "only the cnn gets the default";
  expectError("study: \"s\"\nworkload { name: \"cnn\" conv_channels: [8, 16, 32] }\n",
              "t.textproto:2:24: workload.conv_channels: cnn has two convolutions, give 2 channel counts (or none for "
              "[8, 16]), got 3");
  expectError("study: \"s\"\nworkload { name: \"cnn\" dropout: 1 }\n",
              "t.textproto:2:24: workload.dropout must be in [0, 1), got 1");
  expectError("study: \"s\"\nworkload { name: \"mlp\" conv_channels: [8, 16] }\n",
              "t.textproto:2:24: workload.conv_channels: only workload cnn has convolutions, not 'mlp'");
  expectError("study: \"s\"\nworkload { name: \"mlp\" dropout: 0.5 }\n",
              "t.textproto:2:24: workload.dropout: only workload cnn has dropout, not 'mlp'");
}

// workload.glove: defaults only for glove, every range named, and sparse_gradients only where a sparse allgather runs.
TEST_F(ConfigTest, GloveFieldsAndSparseGradients) {
  const Study ok = load("study: \"s\"\nworkload { name: \"glove\" glove { dim: 20 } }\nsparse_gradients: true\n");
  const auto& g = ok.experiments[0].workload().glove();
  EXPECT_EQ(g.dim(), 20);
  EXPECT_EQ(g.corpus(), "/usr/share/games/fortunes");
  EXPECT_EQ(g.optimizer(), Glove::ADAGRAD);
  EXPECT_TRUE(ok.experiments[0].sparse_gradients());
  EXPECT_FALSE(load(kMinimal).experiments[0].workload().has_glove()) << "only glove gets the defaults";
  const std::string head = "study: \"s\"\nworkload { name: \"glove\" glove { ";
  expectError(head + "window: 0 } }\n", "t.textproto:2:34: workload.glove.window must be in [1, 1000], got 0");
  expectError(head + "vocab_size: 1 } }\n", "t.textproto:2:34: workload.glove.vocab_size must be in [2, 2^24], got 1");
  expectError(head + "min_count: 0 } }\n", "t.textproto:2:34: workload.glove.min_count must be >= 1, got 0");
  expectError(head + "dim: 0 } }\n", "t.textproto:2:34: workload.glove.dim must be in [1, 4096], got 0");
  expectError(head + "x_max: -1 } }\n", "t.textproto:2:34: workload.glove.x_max must be > 0, got -1");
  expectError(head + "alpha: 2 } }\n", "t.textproto:2:34: workload.glove.alpha must be in (0, 1], got 2");
  expectError(head + "test_fraction: 1 } }\n",
              "t.textproto:2:34: workload.glove.test_fraction must be in [0, 1), got 1");
  expectError(head + "} }\noptimizer { momentum: 0.9 }\n",
              "t.textproto: workload.glove.optimizer: ADAGRAD takes no momentum, got optimizer.momentum 0.9");
  expectError("study: \"s\"\nworkload { name: \"mlp\" glove { dim: 4 } }\n",
              "t.textproto:2:24: workload.glove: only workload glove reads it, not 'mlp'");
  const auto errors = errorsOf("study: \"s\"\nworkload { name: \"glove\" }\nmode: HOGWILD\nsparse_gradients: true\n");
  EXPECT_TRUE(std::any_of(errors.begin(), errors.end(), [](const std::string& e) {
    return e.find("t.textproto:4:1: sparse_gradients: mode HOGWILD sends nothing") == 0;
  })) << ::testing::PrintToString(errors);
  const auto ps = errorsOf(
      "study: \"s\"\nworkload { name: \"glove\" }\nmode: SSP\nstaleness_bound: 1\n"
      "sparse_gradients: true\n");
  EXPECT_TRUE(std::none_of(ps.begin(), ps.end(), [](const std::string& e) {
    return e.find("sparse_gradients") != std::string::npos;
  })) << ::testing::PrintToString(ps);
}

// workload pytorch: defaults only for its block (the image fields only for torchvision models), every range named, and
// what DDP through the hook cannot honour refused by name.
TEST_F(ConfigTest, PluginTimeout) {
  // Default 60 s; 0 turns the watchdog off; a day, a negative or a malformed value is refused naming the field.
  EXPECT_EQ(load(kMinimal).experiments.at(0).plugin_timeout(), "60s");
  EXPECT_EQ(load(kMinimal + "plugin_timeout: \"0s\"\n").experiments.at(0).plugin_timeout(), "0s");
  for (const char* bad : {"24h", "soon", "-1s"}) {
    const auto errors = errorsOf(kMinimal + "plugin_timeout: \"" + bad + "\"\n");
    ASSERT_EQ(errors.size(), 1u) << bad << ": " << ::testing::PrintToString(errors);
    EXPECT_NE(errors[0].find("plugin_timeout"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find(bad), std::string::npos) << errors[0];
  }
}

TEST_F(ConfigTest, PyTorchWorkload) {
  const std::string rt = "clock: REAL_TIME\n";
  const Study tv = load("study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" } }\n" + rt);
  const auto& t = tv.experiments[0].workload().pytorch();
  EXPECT_EQ(t.data(), PyTorch::FASHION_MNIST);
  EXPECT_EQ(t.image_size(), 32);
  EXPECT_EQ(t.channels(), 3);
  EXPECT_EQ(t.num_classes(), 10);
  EXPECT_EQ(t.device(), "cpu");
  EXPECT_FALSE(t.has_synthetic_examples()) << "only SYNTHETIC gets a synthetic size";
  const Study mod = load("study: \"s\"\nworkload { name: \"pytorch\" pytorch { module: \"m.py\" } }\n" + rt);
  EXPECT_FALSE(mod.experiments[0].workload().pytorch().has_image_size()) << "a module's data is its own";
  EXPECT_FALSE(mod.experiments[0].workload().pytorch().has_loader_workers()) << "unfilled: 0 is the driver's reading";
  EXPECT_EQ(load("study: \"s\"\nworkload { name: \"pytorch\" pytorch { module: \"m.py\" loader_workers: 4 } }\n" + rt)
                .experiments[0]
                .workload()
                .pytorch()
                .loader_workers(),
            4);
  EXPECT_FALSE(load(kMinimal).experiments[0].workload().has_pytorch()) << "only pytorch gets the defaults";

  const auto has = [](const std::vector<std::string>& errors, const std::string& fragment) {
    return std::any_of(errors.begin(), errors.end(),
                       [&](const std::string& e) { return e.find(fragment) != std::string::npos; });
  };
  const std::string head = "study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" ";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"study: \"s\"\nworkload { name: \"pytorch\" }\n" + rt, "must name exactly one model"},
      {"study: \"s\"\nworkload { name: \"pytorch\" pytorch { } }\n" + rt, "must name exactly one model"},
      {"study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"a\" module: \"b\" } }\n" + rt,
       "must name exactly one model"},
      {"study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"os.system\" } }\n" + rt,
       "workload.pytorch.torchvision must be a torchvision.models constructor name like \"resnet18\", got 'os.system'"},
      {"study: \"s\"\nworkload { name: \"pytorch\" pytorch { module: \"m.py\" image_size: 64 } }\n" + rt,
       "workload.pytorch.image_size: a module's data(rank, world) gives its inputs"},
      {head + "image_size: 4 } }\n" + rt, "workload.pytorch.image_size must be in [8, 1024], got 4"},
      {head + "channels: 2 } }\n" + rt, "workload.pytorch.channels must be 1 or 3, got 2"},
      {head + "num_classes: 1 } }\n" + rt, "workload.pytorch.num_classes must be in [2, 100000], got 1"},
      {head + "num_classes: 5 } }\n" + rt, "Fashion-MNIST has 10 classes, got 5"},
      {head + "synthetic_examples: 8 } }\n" + rt, "workload.pytorch.synthetic_examples: only data SYNTHETIC reads it"},
      {head + "data: SYNTHETIC synthetic_examples: 0 } }\n" + rt,
       "workload.pytorch.synthetic_examples must be in [1, 2^24], got 0"},
      {head + "max_steps_per_epoch: -1 } }\n" + rt, "workload.pytorch.max_steps_per_epoch must be >= 0, got -1"},
      {head + "device: \"tpu\" } }\n" + rt, "workload.pytorch.device must be \"cpu\" or \"cuda\", got 'tpu'"},
      {head + "loader_workers: 2 } }\n" + rt,
       "workload.pytorch.loader_workers: a torchvision model's data is held as tensors"},
      {"study: \"s\"\nworkload { name: \"pytorch\" pytorch { module: \"m.py\" loader_workers: 65 } }\n" + rt,
       "workload.pytorch.loader_workers must be in [0, 64], got 65"},
      {head + "} }\nclock: SIMULATED\n", "clock: workload pytorch runs in real time"},
      {head + "} }\nmode: ASYNC\n" + rt, "mode: workload pytorch trains with DistributedDataParallel"},
      {head + "} }\nscheduler { name: \"priority\" }\n" + rt, "scheduler.name: workload pytorch is scheduler-free"},
      {head + "} }\nlink { bandwidth: \"1Gbps\" }\n" + rt, "link: workload pytorch has no link emulation"},
      {head + "} hidden_sizes: [4] }\n" + rt, "workload.hidden_sizes: workload pytorch's model is the pytorch block's"},
      {"study: \"s\"\nworkload { name: \"mlp\" pytorch { torchvision: \"resnet18\" } }\n",
       "workload.pytorch: only workload pytorch reads it, not 'mlp'"},
  };
  for (const auto& [text, fragment] : bad) {
    const auto errors = errorsOf(text);
    EXPECT_TRUE(has(errors, fragment)) << text << "\nwanted: " << fragment
                                       << "\ngot: " << ::testing::PrintToString(errors);
  }
}

// optimizer.kind: SGD written into a pytorch config (with find_unused_parameters false), nothing into a native one
// (its resolved config reads as before the field); Adam's betas and eps filled for ADAM and ADAMW alone; each mix
// the runs cannot honour refused at its field: Adam for a native workload, SGD's momentum or nesterov with Adam,
// Adam's fields with SGD, DGC's momentum correction with Adam, a beta or eps out of range.
TEST_F(ConfigTest, OptimizerKind) {
  const std::string torch =
      "study: \"s\"\n"                                                          // 1
      "workload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" } }\n"  // 2
      "clock: REAL_TIME\n";                                                     // 3
  const Experiment sgd = load(torch).experiments.at(0);
  EXPECT_EQ(sgd.optimizer().kind(), Optimizer::SGD);
  EXPECT_FALSE(sgd.optimizer().has_beta1() || sgd.optimizer().has_beta2() || sgd.optimizer().has_eps());
  EXPECT_TRUE(sgd.workload().pytorch().has_find_unused_parameters());
  EXPECT_FALSE(sgd.workload().pytorch().find_unused_parameters());
  EXPECT_NE(toText(sgd).find("kind: SGD"), std::string::npos) << toText(sgd);
  const Experiment native = load(kMinimal).experiments.at(0);
  EXPECT_FALSE(native.optimizer().has_kind()) << "a native workload's resolved config reads as before the field";
  EXPECT_EQ(toText(native).find("kind:"), std::string::npos) << toText(native);
  EXPECT_NO_THROW(load("study: \"s\"\nworkload { name: \"mlp\" }\noptimizer { kind: SGD }\n"));

  const Experiment adamw = load(torch + "optimizer { kind: ADAMW beta2: 0.95 weight_decay: 0.1 }\n").experiments.at(0);
  EXPECT_EQ(adamw.optimizer().kind(), Optimizer::ADAMW);
  EXPECT_DOUBLE_EQ(adamw.optimizer().beta1(), 0.9);
  EXPECT_DOUBLE_EQ(adamw.optimizer().beta2(), 0.95);
  EXPECT_DOUBLE_EQ(adamw.optimizer().eps(), 1e-8);
  const std::string resolved = toText(adamw);
  for (const char* field : {"kind: ADAMW", "beta1: 0.9", "beta2: 0.95", "eps: 1e-08"})
    EXPECT_NE(resolved.find(field), std::string::npos) << field << " in\n" << resolved;

  expectError("study: \"s\"\nworkload { name: \"mlp\" }\noptimizer { kind: ADAM }\n",
              "t.textproto:3:13: optimizer.kind: ADAM is for workload pytorch only (torch.optim's); terse's own "
              "workloads ('mlp') implement SGD");
  expectError(torch + "optimizer { kind: ADAMW momentum: 0.9 }\n",
              "t.textproto:4:25: optimizer.momentum is SGD's heavy-ball momentum, got 0.9 with kind ADAMW, whose "
              "moving average of the gradient is beta1: leave momentum 0");
  expectError(torch + "optimizer { kind: ADAM nesterov: true }\n",
              "t.textproto:4:24: optimizer.nesterov is SGD's, got true with kind ADAM: leave it false");
  expectError(torch + "optimizer { beta1: 0.8 }\n",
              "t.textproto:4:13: optimizer.beta1: only kind ADAM and ADAMW read it, got kind SGD");
  expectError("study: \"s\"\nworkload { name: \"mlp\" }\noptimizer { eps: 1e-6 }\n",
              "t.textproto:3:13: optimizer.eps: only kind ADAM and ADAMW read it, got kind SGD (unset)");
  expectError(torch + "optimizer { kind: ADAMW beta1: 1 }\n",
              "t.textproto:4:25: optimizer.beta1 must be in [0, 1), got 1");
  expectError(torch + "optimizer { kind: ADAM beta2: -0.5 }\n",
              "t.textproto:4:24: optimizer.beta2 must be in [0, 1), got -0.5");
  expectError(torch + "optimizer { kind: ADAM eps: 0 }\n", "t.textproto:4:24: optimizer.eps must be > 0, got 0");
  const auto dgc = errorsOf(torch + "optimizer { kind: ADAMW }\nmomentum_correction { factor: 0.9 }\n");
  ASSERT_EQ(dgc.size(), 1u) << ::testing::PrintToString(dgc);
  EXPECT_EQ(dgc[0].rfind("t.textproto:5:23: momentum_correction.factor 0.9 with optimizer kind ADAMW: DGC's momentum "
                         "correction accumulates the momentum",
                         0),
            0u)
      << dgc[0];
  // A variant may choose the kind: the base's SGD momentum is overridden with it, and Adam's defaults fill the variant.
  const Study study = load(torch +
                           "optimizer { momentum: 0.9 }\nvariants { name: \"sgd\" }\n"
                           "variants { name: \"adam\" overrides { optimizer { kind: ADAM momentum: 0 } } }\n");
  EXPECT_DOUBLE_EQ(study.experiments.at(0).optimizer().momentum(), 0.9);
  EXPECT_FALSE(study.experiments.at(0).optimizer().has_beta1());
  EXPECT_EQ(study.experiments.at(1).optimizer().kind(), Optimizer::ADAM);
  EXPECT_DOUBLE_EQ(study.experiments.at(1).optimizer().beta1(), 0.9);
}

// With the config's folder known (terse run sets it), a module that is not a file there is a config error naming the
// field, the path it looked for and, for a variant's module, the variant: found before any driver starts.
TEST_F(ConfigTest, PyTorchModuleMustBeAFile) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "config_test_modules";
  std::filesystem::create_directories(dir / "models");
  std::ofstream(dir / "models" / "m.py") << "def model(): pass\ndef data(rank, world): pass\n";
  const std::string text =
      "study: \"s\"\n"                                                        // 1
      "workload { name: \"pytorch\" pytorch { module: \"models/m.py\" } }\n"  // 2
      "clock: REAL_TIME\n";                                                   // 3
  EXPECT_NO_THROW(load(text)) << "not looked for without the folder";
  options_.module_dir = dir;
  EXPECT_NO_THROW(load(text));
  std::string missing = text;
  missing.replace(missing.find("models/m.py"), 11, "models/n.py");
  expectError(missing, "t.textproto:2:38: workload.pytorch.module: no file '" + (dir / "models/n.py").string() +
                           "' (the module is named relative to the config's folder)");
  const std::string absolute = (dir / "gone.py").string();
  expectError(text + "variants { name: \"v\" overrides { workload { pytorch { module: \"" + absolute + "\" } } } }\n",
              "t.textproto:4:55: variants[0] (\"v\").workload.pytorch.module: no file '" + absolute + "'");
  missing.replace(missing.find("models/n.py"), 11, "models");
  expectError(missing, "t.textproto:2:38: workload.pytorch.module: '" + (dir / "models").string() + "' is not a file");
}

// A resolved pytorch experiment names what the run uses: with the config's folder known, the module by its canonical
// path (a relative name, "..", a link: one file, one text, so `terse compare` sees one workload), and no data set
// where the run reads none (a module's data(), SYNTHETIC images), set or defaulted; Fashion-MNIST keeps its fields.
TEST_F(ConfigTest, PyTorchModuleCanonicalAndDataFieldsOnlyWhereRead) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "config_test_canonical";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "models");
  std::ofstream(dir / "models" / "m.py") << "def model(): pass\ndef data(rank, world): pass\n";
  std::filesystem::create_directory_symlink(dir / "models", dir / "link");
  const std::string canonical = std::filesystem::canonical(dir / "models" / "m.py").string();
  auto module = [&](const std::string& name) {
    return load("study: \"s\"\nworkload { name: \"pytorch\" pytorch { module: \"" + name +
                "\" } }\ndata { dataset_dir: \"/d\" test_subset: 8 }\nclock: REAL_TIME\n")
        .experiments.at(0);
  };
  EXPECT_EQ(module("models/m.py").workload().pytorch().module(), "models/m.py") << "not rewritten without the folder";
  options_.module_dir = dir;
  for (const std::string& name :
       std::vector<std::string>{"models/m.py", "link/../models/m.py", "link/m.py", (dir / "link" / "m.py").string()}) {
    const Experiment e = module(name);
    EXPECT_EQ(e.workload().pytorch().module(), canonical) << name;
    EXPECT_FALSE(e.data().has_dataset_dir() || e.data().has_train_subset() || e.data().has_test_subset()) << name;
  }
  const std::string tv = "study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" ";
  const Experiment synthetic = load(tv + "data: SYNTHETIC } }\nclock: REAL_TIME\n").experiments.at(0);
  EXPECT_FALSE(synthetic.data().has_dataset_dir() || synthetic.data().has_test_subset());
  const Experiment fashion = load(tv + "} }\nclock: REAL_TIME\n").experiments.at(0);
  EXPECT_TRUE(fashion.data().has_dataset_dir() && fashion.data().has_test_subset());
}

// seeds: one run per seed (expandRepeats), each in <variant>/seed-<seed>; the seed defaults to the first; bad lists
// are errors naming the entry.
TEST_F(ConfigTest, SeedsRepeatEveryVariant) {
  const Study study = load(kMinimal + "seeds: [3, 1, 2]\nvariants { name: \"a\" }\nvariants { name: \"b\" }\n");
  ASSERT_EQ(study.experiments.size(), 2u);
  EXPECT_EQ(study.experiments[0].seed(), 3u);
  const std::vector<Experiment> runs = expandRepeats(study.experiments);
  ASSERT_EQ(runs.size(), 6u);
  EXPECT_EQ(runs[0].variant(), "a");
  EXPECT_EQ(runs[1].seed(), 1u);
  EXPECT_EQ(runs[5].variant(), "b");
  EXPECT_EQ(runs[5].seed(), 2u);
  EXPECT_EQ(runs[5].seeds_size(), 3) << "the list stays in the resolved config";
  EXPECT_EQ(resultsSubfolder(runs[4]), "b/seed-1");
  EXPECT_EQ(resultsSubfolder(load(kMinimal).experiments[0]), "base");
  EXPECT_EQ(expandRepeats(load(kMinimal).experiments).size(), 1u);

  expectError(
      kMinimal + "seeds: [1, 2, 1]\n",
      "t.textproto:7:1: seeds: entry 2 repeats entry 0 (1): a seed run twice gives the same numbers twice, which "
      "narrows the interval without measuring anything");
  expectError(kMinimal + "seed: 7\nseeds: [1, 2]\n",
              "t.textproto:7:1: seed 7 is not one of seeds [1, 2]: with seeds, give seed only to name one of them (or "
              "leave it out)");
  EXPECT_NO_THROW(load(kMinimal + "seed: 2\nseeds: [1, 2]\n"));
}

TEST_F(ConfigTest, BaseErrorReportedOnceNotPerVariant) {
  std::string text = kMinimal;
  text.replace(text.find("0.1"), 3, "-0.1");
  auto errors = errorsOf(text + "variants { name: \"a\" }\nvariants { name: \"b\" }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0], "t.textproto:4:3: optimizer.lr must be > 0, got -0.1");
}

TEST_F(ConfigTest, UnsupportedModeAndMomentumConflict) {
  auto errors = errorsOf(kMinimal + "mode: ASYNC\nmomentum_correction { factor: 0.9 }\noptimizer { momentum: 0.9 }\n");
  // The second optimizer block is a parse error (a singular message may appear once).
  ASSERT_EQ(errors.size(), 1u);
  errors = errorsOf(
      "study: \"s\"\nworkload { name: \"mlp\" }\noptimizer { momentum: 0.9 }\nmode: ASYNC\n"
      "momentum_correction { factor: 0.9 }\n");
  ASSERT_EQ(errors.size(), 2u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0], "t.textproto:4:1: mode: ASYNC is not supported by this runner (supported: SYNC)");
  EXPECT_EQ(errors[1].rfind("t.textproto:5:23: momentum_correction.factor 0.9 needs optimizer.momentum 0", 0), 0u)
      << errors[1];
}

TEST(ConfigMerge, ScalarSubmessageAndMapRules) {
  Experiment base = parseConfigText(
      "study: \"s\"\n"
      "error_feedback: true\n"
      "optimizer { lr: 0.1 momentum: 0.9 }\n"
      "workload { name: \"mlp\" hidden_sizes: [256, 128] }\n"
      "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.01\" } params { key: \"sample_ratio\" value: "
      "\"0.1\" } }\n",
      "base");
  Experiment over = parseConfigText(
      "error_feedback: false\n"
      "optimizer { lr: 0.2 }\n"
      "workload { hidden_sizes: [64] }\n"
      "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.05\" } }\n",
      "over");
  mergeOverrides(base, over);
  EXPECT_FALSE(base.error_feedback());  // a scalar set to false overrides true
  EXPECT_DOUBLE_EQ(base.optimizer().lr(), 0.2);
  EXPECT_DOUBLE_EQ(base.optimizer().momentum(), 0.9);  // partial submessage: the rest stays
  EXPECT_EQ(base.workload().name(), "mlp");
  ASSERT_EQ(base.workload().hidden_sizes_size(), 1);  // a list replaces, never appends
  EXPECT_EQ(base.workload().hidden_sizes(0), 64);
  ASSERT_EQ(base.compressor().params_size(), 1);  // the map replaced: sample_ratio is gone
  EXPECT_EQ(base.compressor().params().at("ratio"), "0.05");

  // A PluginSpec replaces the base's whole: params of another compressor never leak into this one.
  mergeOverrides(base, parseConfigText("compressor { name: \"onebit\" }\n", "over2"));
  EXPECT_EQ(base.compressor().name(), "onebit");
  EXPECT_TRUE(base.compressor().params().empty());

  // An unset field leaves the base alone.
  mergeOverrides(base, Experiment{});
  EXPECT_DOUBLE_EQ(base.optimizer().lr(), 0.2);
  EXPECT_EQ(base.workload().hidden_sizes_size(), 1);
}

TEST_F(ConfigTest, ResolvedConfigRoundTrips) {
  Study study = loadStudyText(quickstartConfigText(), std::string(kQuickstartSourceName), options_);
  const Experiment& e = study.experiments[2];
  std::string text = toText(e);
  Experiment back = parseConfigText(text, "resolved");
  EXPECT_EQ(back.SerializeAsString(), e.SerializeAsString());

  auto dir = std::filesystem::path(TERSE_TEST_BINARY_DIR) / "tests" / "config";
  std::filesystem::create_directories(dir);
  auto file = dir / "resolved.textproto";
  writeResolvedConfig(e, file);
  Study again = loadStudy(file, options_);
  ASSERT_EQ(again.experiments.size(), 1u);
  EXPECT_EQ(again.experiments[0].SerializeAsString(), e.SerializeAsString());
}

TEST_F(ConfigTest, VariantSelectionAndWorkersOverride) {
  Study study = loadStudyText(quickstartConfigText(), std::string(kQuickstartSourceName), options_);
  auto picked = selectVariants(study, {"onebit-ef", "dense"});
  ASSERT_EQ(picked.size(), 2u);
  EXPECT_EQ(picked[0].variant(), "onebit-ef");
  EXPECT_EQ(selectVariants(study, {}).size(), 5u);
  try {
    selectVariants(study, {"nope"});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--variant 'nope': no such variant in quickstart.textproto (variants: dense, "
                                         "fp16, qsgd-8bit, topk-1pct-ef, onebit-ef)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ConfigTest, SeedsOverrideTurnsAStudyIntoRepeats) {
  Study study = loadStudyText(quickstartConfigText(), std::string(kQuickstartSourceName), options_);
  auto picked = selectVariants(study, {"dense", "fp16"});
  ASSERT_EQ(picked[0].seeds_size(), 0);  // the quickstart runs one seed
  const std::vector<uint64_t> seeds = {7, 2, 9};
  overrideSeeds(picked, seeds);
  const auto runs = expandRepeats(picked);
  ASSERT_EQ(runs.size(), 6u);
  EXPECT_EQ(runs[0].seed(), 7u);
  EXPECT_EQ(runs[2].seed(), 9u);
  EXPECT_EQ(runs[3].variant(), "fp16");
  EXPECT_EQ(resultsSubfolder(runs[4]), "fp16/seed-2");

  EXPECT_THROW(overrideSeeds(picked, std::vector<uint64_t>{}), InvalidArgument);
  try {
    overrideSeeds(picked, std::vector<uint64_t>{1, 2, 1});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--seeds: variant 'dense': seeds: entry 2 repeats entry 0 (1)"),
              std::string::npos)
        << e.what();
  }
}

TEST(ConfigCodec, OptionsAndParams) {
  Experiment e = parseConfigText(
      "error_feedback: true\nmomentum_correction { factor: 0.9 nesterov: true }\n"
      "compressor { name: \"topk\" params { key: \"z\" value: \"1\" } params { key: \"a\" value: \"2\" } }\n",
      "x");
  applyDefaults(e);
  CodecOptions o = codecOptions(e);
  EXPECT_TRUE(o.error_feedback);
  EXPECT_DOUBLE_EQ(o.momentum_correction, 0.9);
  EXPECT_TRUE(o.momentum_masking);
  EXPECT_TRUE(o.momentum_nesterov);
  Params p = pluginParams(e.compressor());
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].first, "a");
}

// The asynchronous modes' fields: defaults written out, every bad value named with its field, and the rank range of
// link overrides including the parameter server's shards.
TEST_F(ConfigTest, AsyncModesDefaultsAndErrors) {
  options_.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP, Experiment::HOGWILD};
  const auto ok = load(kMinimal +
                       "mode: SSP\nstaleness_bound: 2\nworkers: 3\n"
                       "worker_settings { worker: 1 slowdown: 2.5 }\n");
  const Experiment& e = ok.experiments.at(0);
  EXPECT_EQ(e.parameter_server().servers(), 1);
  EXPECT_FALSE(e.parameter_server().staleness_aware_lr());
  EXPECT_EQ(e.parameter_server().pull_dtype(), ParameterServer::F32);
  EXPECT_EQ(e.parameter_server().worker_timeout(), "10s");
  EXPECT_EQ(workerSettings(e, 1).slowdown(), 2.5);
  EXPECT_EQ(workerSettings(e, 1).fail_after_steps(), 0);
  EXPECT_EQ(workerSettings(e, 2).slowdown(), 1);  // unlisted: the defaults
  EXPECT_EQ(jobRanks(e), 4);

  auto errors = errorsOf(kMinimal +
                         "mode: ASYNC\nworkers: 2\n"
                         "parameter_server { servers: 0 worker_timeout: \"soon\" }\n"
                         "worker_settings { worker: 2 slowdown: 0.5 }\n"
                         "worker_settings { worker: 1 fail_after_steps: -1 }\n"
                         "worker_settings { worker: 1 }\n"
                         "link { overrides { src: 0 dst: 2 bandwidth: \"1Gbps\" } }\n");
  ASSERT_EQ(errors.size(), 7u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0], "t.textproto:9:20: parameter_server.servers must be in [1, 1024], got 0");
  EXPECT_NE(errors[1].find("parameter_server.worker_timeout: "), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("soon"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[2], "t.textproto:10:19: worker_settings[0].worker must be in [0, workers = 2), got 2");
  EXPECT_EQ(errors[3], "t.textproto:10:29: worker_settings[0].slowdown must be in [1, 1000], got 0.5");
  EXPECT_EQ(errors[4], "t.textproto:11:29: worker_settings[1].fail_after_steps must be >= 0, got -1");
  EXPECT_EQ(errors[5], "t.textproto:12:19: worker_settings[2].worker: worker 1 is listed twice");
  // The shards are ranks too: with servers 0 only 2 ranks remain.
  EXPECT_EQ(errors[6], "t.textproto:13:27: link.overrides[0].dst must be in [0, servers + workers = 2), got 2");

  // With servers 1 the override's dst 2 is a worker rank (ranks 0 = shard, 1 and 2 = workers): valid.
  load(kMinimal + "mode: ASYNC\nworkers: 2\nlink { overrides { src: 0 dst: 2 bandwidth: \"1Gbps\" } }\n");
  errors = errorsOf(kMinimal + "workers: 2\nlink { overrides { src: 0 dst: 2 bandwidth: \"1Gbps\" } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("link.overrides[0].dst must be in [0, workers = 2), got 2"), std::string::npos);

  // A failing worker stops a sync run: only the asynchronous modes accept one.
  errors = errorsOf(kMinimal + "workers: 2\nworker_settings { worker: 1 fail_after_steps: 5 }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("worker_settings[0].fail_after_steps: a failed worker stops a SYNC run"), std::string::npos)
      << errors[0];

  errors = errorsOf(
      "study: \"s\"\nworkload { name: \"mlp\" }\noptimizer { momentum: 0.9 }\nmode: HOGWILD\ntransport: TCP\n"
      "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.1\" } }\nerror_feedback: true\ntrace: true\n");
  // In the file's order (lines 3, 5, 5, 6, 7, 8).
  ASSERT_EQ(errors.size(), 6u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("optimizer.momentum: mode HOGWILD applies plain SGD"), std::string::npos);
  EXPECT_NE(errors[1].find("transport: mode HOGWILD shares memory between threads and needs INPROC"),
            std::string::npos);
  EXPECT_NE(errors[2].find("transport: TCP is not supported"), std::string::npos);
  EXPECT_NE(errors[3].find("compressor.name: mode HOGWILD sends nothing to compress, got 'topk'"), std::string::npos);
  EXPECT_NE(errors[4].find("error_feedback: mode HOGWILD"), std::string::npos);
  EXPECT_NE(errors[5].find("trace: timelines are recorded in mode SYNC only"), std::string::npos);
}

// Compressed pulls (parameter_server.pull_compressor) and the compressors a parameter server can run at all: each push
// and delta pull is decoded on its own, so several rounds or a CUSTOM reduce are refused by the config, naming the
// plugin, rather than by the shard's constructor once the run started.
TEST_F(ConfigTest, PullCompressorAndParameterServerCompressors) {
  options_.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP, Experiment::HOGWILD};
  const std::string topk =
      "parameter_server { pull_compressor { name: \"topk\" params { key: \"ratio\" value: \"0.01\" } } }\n";
  const auto ok = load(kMinimal + "mode: ASYNC\nworkers: 2\n" + topk);
  EXPECT_EQ(ok.experiments.at(0).parameter_server().pull_compressor().name(), "topk");
  EXPECT_EQ(load(kMinimal + "mode: ASYNC\n").experiments.at(0).parameter_server().pull_compressor().name(), "none");

  // Line 7 is the mode's, line 8 the parameter_server's.
  auto errors = errorsOf(kMinimal + "mode: SYNC\n" + topk);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0],
            "t.textproto:8:38: parameter_server.pull_compressor.name 'topk' in mode SYNC: pulls exist in modes ASYNC "
            "and SSP (the parameter server's); leave it unset");
  errors = errorsOf(kMinimal + "mode: ASYNC\nparameter_server { pull_dtype: BF16 " + topk.substr(19));
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("parameter_server.pull_dtype BF16 beside pull_compressor 'topk': the compressor decides "
                           "what travels down; leave pull_dtype F32"),
            std::string::npos)
      << errors[0];
  errors = errorsOf(kMinimal + "mode: ASYNC\nsparse_gradients: true\n" + topk);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("'topk' with sparse_gradients: row-sparse tensors travel as rows"), std::string::npos)
      << errors[0];
  errors = errorsOf(kMinimal + "mode: ASYNC\nparameter_server { pull_compressor { name: \"nosuch\" } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("parameter_server.pull_compressor.name: "), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("nosuch"), std::string::npos) << errors[0];

  errors = errorsOf(kMinimal +
                    "mode: ASYNC\nparameter_server { pull_compressor { params { key: \"ratio\" value: "
                    "\"0.1\" } } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("parameter_server.pull_compressor.params: pull compressor none (pulls carry the parameters) "
                           "takes no parameters"),
            std::string::npos)
      << errors[0];

  // PowerSGD's two rounds and signSGD's majority vote (CUSTOM) cannot be decoded one push at a time, up or down.
  errors = errorsOf(kMinimal + "mode: SSP\nstaleness_bound: 1\n" +
                    "parameter_server { pull_compressor { name: \"powersgd\" } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("parameter_server.pull_compressor.name: 'powersgd' has 2 rounds, and a parameter server "
                           "decodes each push and pull on its own; use a single-round compressor"),
            std::string::npos)
      << errors[0];
  errors = errorsOf("study: \"s\"\nworkload { name: \"mlp\" }\ncompressor { name: \"signsgd\" }\nmode: ASYNC\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("t.textproto:3:14: compressor.name: 'signsgd' has CUSTOM aggregation"), std::string::npos)
      << errors[0];
  // The same compressor in mode SYNC is fine: the allreduce folds the payloads.
  load("study: \"s\"\nworkload { name: \"mlp\" }\ncompressor { name: \"signsgd\" }\nmode: SYNC\n");
}

// Local SGD: mode SYNC on a host transport, terse's own workloads; a warm-up of gradient steps only with stateless
// codecs.
TEST_F(ConfigTest, LocalSgdRules) {
  options_.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP, Experiment::HOGWILD};
  const auto ok = load(kMinimal + "local_sgd { period: 8 start_step: 100 }\n");
  EXPECT_EQ(ok.experiments.at(0).local_sgd().period(), 8);
  EXPECT_EQ(ok.experiments.at(0).local_sgd().start_step(), 100);
  EXPECT_EQ(load(kMinimal).experiments.at(0).local_sgd().period(), 0);
  // Qsparse-local-SGD: a lossy compressor with error feedback from the first step.
  load(kMinimal.substr(0, kMinimal.find("compressor")) +
       "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.01\" } }\nerror_feedback: true\n"
       "local_sgd { period: 4 }\n");

  auto expectOne = [&](const std::string& text, const std::string& want) {
    const auto errors = errorsOf(text);
    ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
    EXPECT_NE(errors[0].find(want), std::string::npos) << errors[0];
  };
  // Line 7 is the first line after kMinimal.
  expectOne(kMinimal + "local_sgd { period: 4 }\nmode: ASYNC\n",
            "t.textproto:7:13: local_sgd.period 4 in mode ASYNC: local SGD averages synchronous replicas (mode SYNC)");
  expectOne(kMinimal + "local_sgd { period: -1 }\n", "local_sgd.period");
  expectOne(kMinimal + "local_sgd { start_step: 5 }\n",
            "local_sgd.start_step with period 0: local SGD is off; set local_sgd.period or leave start_step unset");
  expectOne(kMinimal + "local_sgd { outer_momentum: 0.9 }\n",
            "local_sgd.outer_momentum with period 0: local SGD is off; set local_sgd.period or leave outer_momentum "
            "unset");
  expectOne(kMinimal + "local_sgd { period: 4 outer_momentum: 1 }\n",
            "local_sgd.outer_momentum must be in [0, 1), got 1");
  expectOne(kMinimal + "local_sgd { period: 4 outer_lr: 0 }\n", "local_sgd.outer_lr must be finite and in (0, 100]");
  expectOne(kMinimal + "local_sgd { period: 4 outer_nesterov: true }\n",
            "local_sgd.outer_nesterov needs local_sgd.outer_momentum > 0");
  load(kMinimal + "local_sgd { period: 4 outer_lr: 0.7 outer_momentum: 0.9 outer_nesterov: true }\n");
  // The quadratic synchronization rule: not negative, not without a period, not over a warm-up.
  auto warmup = [&](const std::string& field) {
    std::string text = kMinimal;
    text.insert(text.find("  lr: 0.1\n"), "  " + field + "\n");
    return text;
  };
  EXPECT_EQ(load(kMinimal + "local_sgd { period: 2 qsr_alpha: 0.2 }\n").experiments.at(0).local_sgd().qsr_alpha(), 0.2);
  load(warmup("warmup_steps: 50") + "local_sgd { period: 2 qsr_alpha: 0.2 start_step: 50 }\n");
  expectOne(kMinimal + "local_sgd { period: 2 qsr_alpha: -1 }\n", "local_sgd.qsr_alpha must be finite and >= 0");
  expectOne(kMinimal + "local_sgd { qsr_alpha: 0.2 }\n",
            "local_sgd.qsr_alpha with period 0: local SGD is off; set local_sgd.period or leave qsr_alpha unset");
  expectOne(warmup("warmup_steps: 50") + "local_sgd { period: 2 qsr_alpha: 0.2 start_step: 49 }\n",
            "local_sgd.qsr_alpha 0.2 with local_sgd.start_step 49 inside optimizer.warmup_steps 50: the warm-up's "
            "small rates would ask for the longest rounds first; set local_sgd.start_step to at least 50");
  expectOne(warmup("warmup_epochs: 1") + "local_sgd { period: 2 qsr_alpha: 0.2 start_step: 49 }\n",
            "local_sgd.qsr_alpha 0.2 with optimizer.warmup_epochs 1: the warm-up's small rates would ask for the "
            "longest rounds first; give the warm-up as optimizer.warmup_steps");
  // A step trace records the local steps as compute and the averagings as groups (`terse whatif` replays them).
  EXPECT_TRUE(load(kMinimal + "local_sgd { period: 4 }\nstep_trace: true\n").experiments.at(0).step_trace());
  expectOne(kMinimal + "local_sgd { period: 4 start_step: 10 }\nerror_feedback: true\n",
            "error_feedback with local_sgd.start_step 10: the residual of the gradient steps would be added to the "
            "parameter deltas");
  expectOne(kMinimal.substr(0, kMinimal.find("compressor")) +
                "compressor { name: \"powersgd\" }\nlocal_sgd { period: 4 start_step: 10 }\n",
            "compressor.name: 'powersgd' keeps state from step to step, which local_sgd.start_step > 0 would carry");
  // signSGD's majority vote would move every weight by +-1 at each averaging; DGC's momentum would be an outer one.
  expectOne("study: \"s\"\nworkload { name: \"mlp\" }\ncompressor { name: \"signsgd\" }\nlocal_sgd { period: 4 }\n",
            "t.textproto:3:14: compressor.name: 'signsgd' has CUSTOM aggregation, whose aggregate need not be the mean "
            "of the inputs");
  expectOne(kMinimal + "local_sgd { period: 4 }\nmomentum_correction { factor: 0.9 }\n",
            "momentum_correction.factor 0.9 with local_sgd.period 4: DGC's momentum would run over the averagings' "
            "deltas");
  // The same compressor from the first step is Qsparse-local-SGD's setting: its state only ever sees deltas.
  load(kMinimal.substr(0, kMinimal.find("compressor")) +
       "compressor { name: \"powersgd\" }\nlocal_sgd { period: 4 }\n");
  // Workload pytorch: its driver runs the schedule through terse.torch.LocalSGD, under the same rules.
  const std::string pt =
      "study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" } }\n"
      "clock: REAL_TIME\n";
  EXPECT_EQ(
      load(pt + "local_sgd { period: 8 start_step: 10 outer_momentum: 0.5 }\n").experiments.at(0).local_sgd().period(),
      8);
  expectOne(pt + "compressor { name: \"topk\" }\nerror_feedback: true\nlocal_sgd { period: 4 start_step: 10 }\n",
            "error_feedback with local_sgd.start_step 10");
}

// EF21 (error_feedback_rule EF21, core/compress/ef21.h): with error_feedback, in mode SYNC, on terse's own workloads,
// without local SGD, momentum correction or a CUSTOM-aggregation compressor; ef21_momentum with EF21 only.
TEST_F(ConfigTest, Ef21Rules) {
  options_.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP, Experiment::HOGWILD};
  const std::string topk = kMinimal.substr(0, kMinimal.find("compressor")) +
                           "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.01\" } }\n";
  const auto ok = load(topk + "error_feedback: true\nerror_feedback_rule: EF21\nef21_momentum: 0.1\n");
  EXPECT_EQ(ok.experiments.at(0).error_feedback_rule(), Experiment::EF21);
  EXPECT_EQ(ok.experiments.at(0).ef21_momentum(), 0.1);
  EXPECT_EQ(codecOptions(ok.experiments.at(0)).error_feedback_rule, ErrorFeedbackRule::kEf21);
  EXPECT_EQ(codecOptions(ok.experiments.at(0)).ef21_momentum, 0.1);
  // Unset: rule EF, and EF21's momentum reads as plain EF21's 1 (the loader leaves both unset).
  const Experiment plain = load(topk + "error_feedback: true\n").experiments.at(0);
  EXPECT_FALSE(plain.has_error_feedback_rule());
  EXPECT_FALSE(plain.has_ef21_momentum());
  EXPECT_EQ(codecOptions(plain).error_feedback_rule, ErrorFeedbackRule::kEf);
  EXPECT_EQ(
      codecOptions(load(topk + "error_feedback: true\nerror_feedback_rule: EF21\n").experiments.at(0)).ef21_momentum,
      1.0);

  auto expectOne = [&](const std::string& text, const std::string& want) {
    const auto errors = errorsOf(text);
    ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
    EXPECT_NE(errors[0].find(want), std::string::npos) << errors[0];
  };
  const std::string ef21 = topk + "error_feedback: true\nerror_feedback_rule: EF21\n";
  expectOne(topk + "error_feedback_rule: EF21\n",
            "error_feedback_rule EF21 with error_feedback false: the rule says which error feedback error_feedback "
            "turns on; set error_feedback: true");
  expectOne(topk + "ef21_momentum: 0.5\n",
            "ef21_momentum 0.5 with error_feedback_rule unset (EF): the momentum is EF21-SGDM's");
  expectOne(topk + "error_feedback: true\nerror_feedback_rule: EF\nef21_momentum: 0.5\n",
            "ef21_momentum 0.5 with error_feedback_rule EF: the momentum is EF21-SGDM's");
  load(topk + "error_feedback: true\nef21_momentum: 1\n");  // the default's value is no momentum: accepted
  for (const char* eta : {"0", "1.5", "-0.1", "nan"}) expectOne(ef21 + "ef21_momentum: " + eta + "\n", "ef21_momentum");
  expectOne(ef21 + "ef21_momentum: 1e-50\n", "ef21_momentum 1e-50 rounds to 0 as a float");
  for (const char* mode : {"SSP\nstaleness_bound: 2", "HOGWILD"}) {
    const auto errors = errorsOf(ef21 + "mode: " + mode + "\n");
    EXPECT_TRUE(std::any_of(errors.begin(), errors.end(),
                            [&](const std::string& m) { return m.find("error_feedback_rule EF21 in mode") != m.npos; }))
        << mode << ": " << ::testing::PrintToString(errors);
  }
  expectOne(topk.substr(0, topk.find("compressor")) +
                "compressor { name: \"fp16\" }\nerror_feedback: true\n"
                "error_feedback_rule: EF21\n",
            "compressor.name: 'fp16' sums in f16, and EF21 keeps the sum of the estimates from those sums");
  expectOne(ef21 + "mode: ASYNC\n",
            "error_feedback_rule EF21 in mode ASYNC: every rank keeps the sum of the ranks' estimates from the step's "
            "aggregate, which only mode SYNC decodes on every rank");
  expectOne(ef21 + "local_sgd { period: 4 }\n",
            "error_feedback_rule EF21 with local_sgd.period 4: EF21's estimates follow each rank's gradient");
  // EF21-SGDM's momentum is the step's: not beside the optimizer's (line 4 holds the optimizer's rate).
  std::string with_momentum = ef21;
  with_momentum.insert(with_momentum.find("  lr: 0.1\n"), "  momentum: 0.9\n");
  expectOne(with_momentum + "ef21_momentum: 0.1\n",
            "ef21_momentum 0.1 needs optimizer.momentum 0, got 0.9: EF21-SGDM's momentum is the step's momentum");
  load(with_momentum + "ef21_momentum: 1\n");  // plain EF21 beside the optimizer's momentum
  expectOne(ef21 + "momentum_correction { factor: 0.9 }\n",
            "error_feedback_rule EF21 with momentum_correction.factor 0.9");
  expectOne(
      "study: \"s\"\nworkload { name: \"mlp\" }\ncompressor { name: \"signsgd\" }\nerror_feedback: true\n"
      "error_feedback_rule: EF21\n",
      "t.textproto:3:14: compressor.name: 'signsgd' has CUSTOM aggregation, whose aggregate need not be the sum "
      "of what the ranks sent");
  // Workload pytorch: its driver passes both to terse.torch.CompressionState.
  const std::string pt =
      "study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" } }\n"
      "clock: REAL_TIME\ncompressor { name: \"topk\" }\nerror_feedback: true\n"
      "error_feedback_rule: EF21\n";
  EXPECT_EQ(load(pt).experiments.at(0).error_feedback_rule(), Experiment::EF21);
  expectOne(pt + "ef21_momentum: 0.1\noptimizer { kind: ADAM }\n",
            "ef21_momentum 0.1 with optimizer kind ADAM: EF21-SGDM's momentum is the step's momentum, and Adam's "
            "beta1 would average it again");
}

// The dense warm-up: SYNC only, not beside local SGD or DGC's momentum correction; workload pytorch takes it too.
TEST_F(ConfigTest, CompressionStartStepRules) {
  options_.modes = {Experiment::SYNC, Experiment::ASYNC, Experiment::SSP, Experiment::HOGWILD};
  const std::string topk = kMinimal.substr(0, kMinimal.find("compressor")) +
                           "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.01\" } }\n";
  EXPECT_EQ(
      load(topk + "compression_start_step: 100\nerror_feedback: true\n").experiments.at(0).compression_start_step(),
      100);
  EXPECT_FALSE(load(topk).experiments.at(0).has_compression_start_step());  // unfilled: 0, written only when given
  auto expectOne = [&](const std::string& text, const std::string& want) {
    const auto errors = errorsOf(text);
    ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
    EXPECT_NE(errors[0].find(want), std::string::npos) << errors[0];
  };
  for (const char* bad : {"-1", "1000000001"})
    expectOne(topk + "compression_start_step: " + bad + "\n", "compression_start_step");
  const std::string warm = topk + "compression_start_step: 10\n";
  expectOne(warm + "mode: ASYNC\n",
            "compression_start_step 10 in mode ASYNC: the switch to the compressor is a step every rank aggregates at "
            "once, which only mode SYNC has");
  expectOne(warm + "local_sgd { period: 4 }\n",
            "compression_start_step 10 with local_sgd.period 4: local SGD's gradient steps before local_sgd.start_step "
            "are its warm-up");
  expectOne(warm + "momentum_correction { factor: 0.9 }\n",
            "compression_start_step 10 with momentum_correction.factor 0.9: DGC's momentum lives in the compressor's "
            "decorator, which the dense steps do not run");
  const std::string pt =
      "study: \"s\"\nworkload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" } }\n"
      "clock: REAL_TIME\ncompressor { name: \"powersgd\" }\nerror_feedback: true\ncompression_start_step: 3\n";
  EXPECT_EQ(load(pt).experiments.at(0).compression_start_step(), 3);
}

// Non-IID shards: DIRICHLET with its alpha, for a classifier of terse's own or a torchvision model on Fashion-MNIST;
// the alpha alone is refused.
TEST_F(ConfigTest, DataPartitionRules) {
  const auto ok = load(kMinimal + "data { partition: DIRICHLET dirichlet_alpha: 0.1 }\n");
  EXPECT_EQ(ok.experiments.at(0).data().partition(), Data::DIRICHLET);
  EXPECT_EQ(ok.experiments.at(0).data().dirichlet_alpha(), 0.1);
  // Unset stays unset in the resolved config (IID), so configs from before the field read as they did.
  EXPECT_FALSE(load(kMinimal).experiments.at(0).data().has_partition());
  auto expectOne = [&](const std::string& text, const std::string& want) {
    const auto errors = errorsOf(text);
    ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
    EXPECT_NE(errors[0].find(want), std::string::npos) << errors[0];
  };
  expectOne(kMinimal + "data { partition: DIRICHLET }\n",
            "data.partition DIRICHLET needs data.dirichlet_alpha (0.1 strongly skewed, 100 near IID)");
  expectOne(kMinimal + "data { partition: DIRICHLET dirichlet_alpha: 0 }\n",
            "data.dirichlet_alpha must be in [0.001, 1000], got 0");
  expectOne(kMinimal + "data { dirichlet_alpha: 0.5 }\n",
            "data.dirichlet_alpha with partition unset (IID): only partition DIRICHLET reads it");
  expectOne(kMinimal + "data { partition_seed: 3 }\n", "data.partition_seed with partition unset (IID)");
  // An IID variant of a DIRICHLET base keeps the base's alpha aside.
  const auto both =
      load(kMinimal + "data { partition: DIRICHLET dirichlet_alpha: 0.1 partition_seed: 4 }\n" +
           "variants { name: \"noniid\" }\nvariants { name: \"iid\" overrides { data { partition: IID } } }\n");
  ASSERT_EQ(both.experiments.size(), 2u);
  EXPECT_EQ(both.experiments.at(1).data().partition(), Data::IID);
  EXPECT_EQ(both.experiments.at(0).data().partition_seed(), 4u);
  expectOne(
      "study: \"s\"\nworkload { name: \"linear_regression\" }\ndata { partition: DIRICHLET dirichlet_alpha: 1 }\n",
      "data.partition DIRICHLET splits a classifier's labels; workload 'linear_regression' has none");
  // Workload pytorch: a torchvision model on Fashion-MNIST takes the native shards; its synthetic labels do not.
  const std::string tv =
      "study: \"s\"\nclock: REAL_TIME\ndata { partition: DIRICHLET dirichlet_alpha: 0.5 }\n"
      "workload { name: \"pytorch\" pytorch { torchvision: \"resnet18\" ";
  EXPECT_EQ(load(tv + "} }\n").experiments.at(0).data().partition(), Data::DIRICHLET);
  expectOne(tv + "data: SYNTHETIC } }\n", "data.partition DIRICHLET with workload.pytorch.data SYNTHETIC");
}

// Transport NCCL: offered only by builds with CUDA and NCCL, and then only for what runs on a GPU.
TEST_F(ConfigTest, NcclTransport) {
  // A runner without NCCL (this test's options, as in a build without CUDA) says why.
  auto errors = errorsOf(kMinimal + "transport: NCCL\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("transport: NCCL is not supported by this runner (supported: INPROC)"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("NCCL needs a terse built with CUDA and NCCL"), std::string::npos) << errors[0];

  // A runner with NCCL accepts a SYNC run of a model with a CUDA version...
  options_.transports = {Experiment::INPROC, Experiment::TCP, Experiment::NCCL};
  options_.modes = {Experiment::SYNC, Experiment::ASYNC};
  options_.cuda_workloads = {"softmax", "mlp", "cnn"};
  load(kMinimal + "transport: NCCL\nworkers: 2\n");
  // ...and refuses the parameter server, a CPU-only model and emulated links, naming each field.
  errors = errorsOf(
      "study: \"s\"\nworkload { name: \"linear_regression\" }\nmode: ASYNC\ntransport: NCCL\n"
      "link { bandwidth: \"1Gbps\" }\n");
  ASSERT_EQ(errors.size(), 3u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("workload.name: transport NCCL trains on the GPU, and 'linear_regression' has no CUDA "
                           "version (those with one: softmax, mlp, cnn)"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("mode: transport NCCL runs mode SYNC"), std::string::npos) << errors[1];
  EXPECT_NE(errors[2].find("link: emulated links apply to the host transports"), std::string::npos) << errors[2];
}

}  // namespace
}  // namespace terse::experiments
