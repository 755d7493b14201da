// `--set PATH=VALUE` (experiments/config/field_override.h): every kind of field it sets, that it wins over the base and
// the variant and comes before the defaults and the checks, and every error naming the flag and what is wrong.
#include "experiments/config/field_override.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/plugin/loader.h"
#include "experiments/config/config.h"

namespace terse::experiments {
namespace {

// The one error of parseFieldOverride(text); fails the test when it parses.
std::string errorOf(const std::string& text) {
  try {
    parseFieldOverride(text);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.source(), "--set");
    EXPECT_EQ(e.errors().size(), 1u);
    return e.errors().empty() ? "" : e.errors().front();
  }
  ADD_FAILURE() << "parsed without error: " << text;
  return "";
}

Experiment applied(const Experiment& e, const std::string& text) {
  Experiment out = e;
  applyFieldOverride(out, parseFieldOverride(text));
  return out;
}

TEST(FieldOverride, ScalarsReplaceTheValue) {
  Experiment e;
  e.set_epochs(10);
  EXPECT_EQ(applied(e, "epochs=1").epochs(), 1);
  EXPECT_EQ(applied(e, "seed=18446744073709551615").seed(), 18446744073709551615u);
  EXPECT_FALSE(applied(e, "error_feedback=false").error_feedback());
  EXPECT_TRUE(applied(e, "error_feedback=false").has_error_feedback());  // set to false, not left unset
  EXPECT_TRUE(applied(e, "error_feedback=true").error_feedback());
}

TEST(FieldOverride, NestedFieldsKeepTheirSiblings) {
  Experiment e;
  e.mutable_optimizer()->set_lr(0.1);
  e.mutable_optimizer()->set_momentum(0.9);
  const Experiment o = applied(e, "optimizer.lr=0.05");
  EXPECT_DOUBLE_EQ(o.optimizer().lr(), 0.05);
  EXPECT_DOUBLE_EQ(o.optimizer().momentum(), 0.9);
  EXPECT_EQ(applied(e, "data.batch_size=8").data().batch_size(), 8);
  EXPECT_EQ(applied(e, "workload.pytorch.max_steps_per_epoch=5").workload().pytorch().max_steps_per_epoch(), 5);
  EXPECT_EQ(applied(e, "simulation.topology.nodes_per_rack=2").simulation().topology().nodes_per_rack(), 2);
}

TEST(FieldOverride, EnumsByName) {
  Experiment e;
  EXPECT_EQ(applied(e, "mode=SSP").mode(), Experiment::SSP);
  EXPECT_EQ(applied(e, "optimizer.schedule=COSINE").optimizer().schedule(), Optimizer::COSINE);
  EXPECT_EQ(applied(e, "parameter_server.pull_dtype=BF16").parameter_server().pull_dtype(), ParameterServer::BF16);
}

TEST(FieldOverride, StringsBareOrQuoted) {
  Experiment e;
  e.mutable_compressor()->set_name("none");
  EXPECT_EQ(applied(e, "compressor.name=topk").compressor().name(), "topk");
  EXPECT_EQ(applied(e, "compressor.name=\"topk\"").compressor().name(), "topk");
  EXPECT_EQ(applied(e, "compressor.name='topk'").compressor().name(), "topk");
  // A bare string is taken as it is: spaces, quotes inside, '=' and '#' included.
  EXPECT_EQ(applied(e, "link.bandwidth=10 Gbps").link().bandwidth(), "10 Gbps");
  EXPECT_EQ(applied(e, "study=a\"b=c # d").study(), "a\"b=c # d");
  EXPECT_EQ(applied(e, "output_dir=").output_dir(), "");
  EXPECT_TRUE(applied(e, "output_dir=").has_output_dir());
  EXPECT_EQ(applied(e, "output_dir=\"x\\ty\"").output_dir(), "x\ty");  // quoted: the text format's escapes
}

TEST(FieldOverride, ListsAreReplacedNotAppended) {
  Experiment e;
  e.mutable_workload()->add_hidden_sizes(256);
  e.mutable_workload()->add_hidden_sizes(128);
  const Experiment o = applied(e, "workload.hidden_sizes=[64, 32, 16]");
  ASSERT_EQ(o.workload().hidden_sizes_size(), 3);
  EXPECT_EQ(o.workload().hidden_sizes(0), 64);
  EXPECT_EQ(o.workload().hidden_sizes(2), 16);
  EXPECT_EQ(applied(e, "workload.hidden_sizes=[]").workload().hidden_sizes_size(), 0);
  EXPECT_EQ(applied(e, "workload.hidden_sizes=7").workload().hidden_sizes_size(), 1);  // one value: a list of one
  const Experiment w = applied(e, "worker_settings=[{worker: 1 slowdown: 3}, {worker: 2 slowdown: 2}]");
  ASSERT_EQ(w.worker_settings_size(), 2);
  EXPECT_DOUBLE_EQ(w.worker_settings(0).slowdown(), 3);
}

TEST(FieldOverride, MapEntryReplacesItsKeyAlone) {
  Experiment e;
  auto& params = *e.mutable_compressor()->mutable_params();
  params["ratio"] = "0.1";
  params["other"] = "x";
  const Experiment o = applied(e, "compressor.params.ratio=0.01");
  EXPECT_EQ(o.compressor().params().at("ratio"), "0.01");
  EXPECT_EQ(o.compressor().params().at("other"), "x");
  EXPECT_EQ(o.compressor().params().size(), 2u);
  EXPECT_EQ(applied(e, "compressor.params.new=\"a b\"").compressor().params().at("new"), "a b");
  EXPECT_EQ(applied(e, "compressor.params.a.b=1").compressor().params().at("a.b"), "1");  // a key may hold dots
  // The whole map, as a list of entries: replaced, and [] empties it (for a compressor that takes other params).
  EXPECT_EQ(applied(e, "compressor.params=[]").compressor().params().size(), 0u);
  const Experiment whole = applied(e, "compressor.params=[{key: \"k\" value: \"v\"}]");
  ASSERT_EQ(whole.compressor().params().size(), 1u);
  EXPECT_EQ(whole.compressor().params().at("k"), "v");
}

TEST(FieldOverride, ErrorsNameTheFlagAndWhatIsWrong) {
  EXPECT_EQ(errorOf("epochs"),
            "--set epochs: expected PATH=VALUE (a field of the experiment and its value), e.g. --set epochs=1");
  EXPECT_EQ(errorOf("=1"), "--set =1: no field path before '=', e.g. --set optimizer.lr=0.1");
  EXPECT_EQ(errorOf("optimizer..lr=1"),
            "--set optimizer..lr=1: 'optimizer..lr' has an empty field name; fields are joined by one '.'");
  EXPECT_EQ(errorOf("optimizer.lrr=0.1"),
            "--set optimizer.lrr=0.1: Experiment.optimizer has no field 'lrr'; did you "
            "mean 'lr'?");
  EXPECT_EQ(errorOf("epoch=1"), "--set epoch=1: Experiment has no field 'epoch'; did you mean 'epochs'?");
  // A field named without the message it lives in.
  EXPECT_EQ(errorOf("max_steps_per_epoch=5"),
            "--set max_steps_per_epoch=5: Experiment has no field "
            "'max_steps_per_epoch'; did you mean 'workload.pytorch."
            "max_steps_per_epoch'?");
  EXPECT_EQ(errorOf("data.frobnicate=1"),
            "--set data.frobnicate=1: Experiment.data has no field 'frobnicate'; its "
            "fields: dataset_dir, batch_size, global_batch_size, train_subset, test_subset, partition, "
            "dirichlet_alpha, partition_seed");
  EXPECT_EQ(errorOf("data=0.1"),
            "--set data=0.1: data is a message (Data): set one of its fields: data.dataset_dir, data.batch_size, "
            "data.global_batch_size, data.train_subset, data.test_subset, data.partition, data.dirichlet_alpha, "
            "data.partition_seed");
  EXPECT_EQ(errorOf("epochs.max=1"),
            "--set epochs.max=1: epochs is of type int32, not a message: it has no field 'max'");
  EXPECT_EQ(errorOf("seeds[0]=1"), "--set seeds[0]=1: seeds is a list: --set replaces it whole, e.g. seeds=[...]");
  EXPECT_EQ(errorOf("worker_settings.slowdown=2"),
            "--set worker_settings.slowdown=2: worker_settings is a list: "
            "--set replaces it whole (worker_settings=[...]), not a field "
            "inside it");
  EXPECT_EQ(errorOf("variant=x"),
            "--set variant=x: variant comes from the file (variants[].name); select variants with --variant NAME "
            "instead");
  EXPECT_EQ(errorOf("variants=[]").rfind("--set variants=[]: variants comes from the file", 0), 0u);
}

TEST(FieldOverride, ValuesThatDoNotParseNameTheType) {
  EXPECT_EQ(errorOf("epochs=abc"), "--set epochs=abc: epochs takes int32, got 'abc' (Expected integer, got: abc)");
  EXPECT_EQ(errorOf("epochs=1.5"), "--set epochs=1.5: epochs takes int32, got '1.5' (Expected integer, got: 1.5)");
  EXPECT_EQ(errorOf("epochs=99999999999").rfind("--set epochs=99999999999: epochs takes int32", 0), 0u);
  EXPECT_EQ(errorOf("optimizer.lr=fast"),
            "--set optimizer.lr=fast: optimizer.lr takes double, got 'fast' (Expected double, got: fast)");
  EXPECT_EQ(errorOf("mode=FAST").rfind("--set mode=FAST: mode takes one of SYNC, ASYNC, SSP, HOGWILD, got 'FAST' (", 0),
            0u);
  EXPECT_EQ(errorOf("error_feedback=maybe").rfind("--set error_feedback=maybe: error_feedback takes bool", 0), 0u);
  EXPECT_EQ(errorOf("seeds=[1, x]").rfind("--set seeds=[1, x]: seeds takes a list in brackets of uint64, got", 0), 0u);
  EXPECT_EQ(errorOf("optimizer.lr=\"0.1").rfind("--set optimizer.lr=\"0.1: optimizer.lr takes double", 0), 0u);
  // A VALUE is one value of the field: it cannot set another field beside it.
  EXPECT_EQ(errorOf("epochs=1 seed: 5"),
            "--set epochs=1 seed: 5: epochs takes int32, got '1 seed: 5': VALUE sets more than the one field");
  EXPECT_EQ(errorOf("compressor.params.ratio=\"1\" key: \"x\"").rfind("--set compressor.params.ratio", 0), 0u);
}

TEST(FieldOverride, AllErrorsTogetherAndAPathGivenOnce) {
  try {
    parseFieldOverrides({"epochs=1", "optimizer.lrr=1", "epochs=2", "data.batch_size=x"});
    FAIL() << "parsed";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.errors().size(), 3u) << e.what();
    EXPECT_NE(e.errors()[0].find("has no field 'lrr'"), std::string::npos);
    EXPECT_EQ(e.errors()[1], "--set epochs=2: epochs is already set by --set epochs=1; give each field once");
    EXPECT_NE(e.errors()[2].find("data.batch_size takes int32"), std::string::npos);
  }
  // Nested paths are distinct fields: a map emptied and one key set, in either order (the entry applies after the
  // whole map, so the order on the command line does not decide).
  for (const auto& order : {std::vector<std::string>{"compressor.params=[]", "compressor.params.ratio=0.5"},
                            std::vector<std::string>{"compressor.params.ratio=0.5", "compressor.params=[]"}}) {
    Experiment e;
    (*e.mutable_compressor()->mutable_params())["levels"] = "4";
    for (const auto& o : parseFieldOverrides(order)) applyFieldOverride(e, o);
    ASSERT_EQ(e.compressor().params().size(), 1u) << order[0];
    EXPECT_EQ(e.compressor().params().at("ratio"), "0.5") << order[0];
  }
}

// Through the loader: after the variants, before the defaults and the checks.
class FieldOverrideStudy : public ::testing::Test {
 protected:
  FieldOverrideStudy()
      : loader_(PluginLoader::withSearchDirs({SearchDir{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}})) {
    options_.workloads = {"linear_regression", "mlp"};
    options_.loader = &loader_;
  }

  Study load(const std::string& text, const std::vector<std::string>& sets) {
    options_.overrides = parseFieldOverrides(sets);
    return loadStudyText(text, "t.textproto", options_);
  }
  std::vector<std::string> errorsOf(const std::string& text, const std::vector<std::string>& sets) {
    try {
      load(text, sets);
    } catch (const ConfigError& e) {
      return e.errors();
    }
    ADD_FAILURE() << "loaded without error";
    return {};
  }

  PluginLoader loader_;
  ConfigOptions options_;
};

const std::string kStudy =
    "study: \"s\"\n"                                                                            // 1
    "workload { name: \"mlp\" }\n"                                                              // 2
    "optimizer { lr: 0.1 }\n"                                                                   // 3
    "epochs: 3\n"                                                                               // 4
    "compressor { name: \"none\" }\n"                                                           // 5
    "variants { name: \"dense\" }\n"                                                            // 6
    "variants { name: \"long\" overrides { epochs: 9 } }\n"                                     // 7
    "variants {\n"                                                                              // 8
    "  name: \"topk\"\n"                                                                        // 9
    "  overrides { compressor { name: \"topk\" params { key: \"ratio\" value: \"0.1\" } } }\n"  // 10
    "}\n";

TEST_F(FieldOverrideStudy, WinsOverTheBaseAndTheVariantAndIsWrittenOut) {
  const Study study = load(kStudy, {"epochs=1", "optimizer.lr=0.05"});
  ASSERT_EQ(study.experiments.size(), 3u);
  for (const auto& e : study.experiments) {
    EXPECT_EQ(e.epochs(), 1) << e.variant();
    EXPECT_DOUBLE_EQ(e.optimizer().lr(), 0.05);
    EXPECT_NE(toText(e).find("epochs: 1\n"), std::string::npos);  // config.textproto holds it
  }
  EXPECT_EQ(study.experiments[2].compressor().name(), "topk");  // the variant's other settings stay
}

TEST_F(FieldOverrideStudy, AppliedBeforeTheDefaults) {
  // `seed` defaults to the first of `seeds`: filled after the override, it follows it.
  const Study study = load(kStudy, {"seeds=[4, 5]"});
  EXPECT_EQ(study.experiments[0].seed(), 4u);
  EXPECT_EQ(study.experiments[0].seeds_size(), 2);
  // A map entry changes the variant that has the map and gives one to those without.
  const Study ratio = load(kStudy, {"compressor.name=topk", "compressor.params.ratio=0.25"});
  for (const auto& e : ratio.experiments) EXPECT_EQ(e.compressor().params().at("ratio"), "0.25") << e.variant();
}

TEST_F(FieldOverrideStudy, ChecksNameTheOverride) {
  // The check a file's value gets, said once for every variant, naming the flag instead of line 3.
  EXPECT_EQ(errorsOf(kStudy, {"optimizer.lr=-0.1"}),
            std::vector<std::string>{"--set optimizer.lr=-0.1: optimizer.lr must be > 0, got -0.1"});
  EXPECT_EQ(errorsOf(kStudy, {"epochs=0"}),
            std::vector<std::string>{"--set epochs=0: epochs must be in [1, 100000], got 0"});
  // A plugin's parameter: only the variant whose compressor refuses it.
  const auto errors = errorsOf(kStudy, {"compressor.params.ratio=2"});
  ASSERT_EQ(errors.size(), 2u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0].rfind("--set compressor.params.ratio=2: variants 'dense', 'long': compressor.params: ", 0), 0u)
      << errors[0];
  EXPECT_EQ(errors[1].rfind("--set compressor.params.ratio=2: variant 'topk': compressor.params: ", 0), 0u)
      << errors[1];
  EXPECT_NE(errors[1].find("'ratio' must be in (0, 1], got 2"), std::string::npos) << errors[1];
  // The file's own errors keep their lines beside an override's.
  std::string bad = kStudy;
  bad.replace(bad.find("epochs: 3"), 9, "epochs: -3");
  EXPECT_EQ(errorsOf(bad, {"optimizer.lr=-1"}),
            (std::vector<std::string>{"t.textproto:4:1: epochs must be in [1, 100000], got -3",
                                      "--set optimizer.lr=-1: optimizer.lr must be > 0, got -1"}));
}

// A rule across fields reports at the file's field and names the other in its text: when that other came from the
// command line, the message says so (it used to name line 5 alone, and the reader looked for a period in the file).
TEST_F(FieldOverrideStudy, ARuleAcrossFieldsNamesTheOverrideItNames) {
  const std::string dgc =
      "study: \"s\"\n"                                                            // 1
      "workload { name: \"mlp\" }\n"                                              // 2
      "optimizer { lr: 0.1 momentum: 0 }\n"                                       // 3
      "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.1\" } }\n"  // 4
      "momentum_correction { factor: 0.9 }\n";                                    // 5
  const auto errors = errorsOf(dgc, {"local_sgd.period=4"});
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0].rfind("t.textproto:5:", 0), 0u) << errors[0];
  EXPECT_NE(errors[0].find("with local_sgd.period 4"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("(local_sgd.period is --set local_sgd.period=4)"), std::string::npos) << errors[0];
  // A path the message names only inside a longer one is not the override's.
  const FieldOverride lr = parseFieldOverride("optimizer.lr=0.1");
  const std::vector<const FieldOverride*> one = {&lr};
  EXPECT_EQ(overrideNamedIn(one, "optimizer.lr_decay 3 with x"), "");
  EXPECT_EQ(overrideNamedIn(one, "x.optimizer.lr 3"), "");
  EXPECT_EQ(overrideNamedIn(one, "needs optimizer.lr."), " (optimizer.lr is --set optimizer.lr=0.1)");
}

TEST_F(FieldOverrideStudy, ListsAndStringsAreBoundedAsTheFilesAre) {
  std::string many = "seeds=[";
  for (int i = 0; i <= limits::kSeeds; ++i) many += std::to_string(i) + ",";
  many.back() = ']';
  const auto errors = errorsOf(kStudy, {many});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "--set " + many + ": seeds lists " + std::to_string(limits::kSeeds + 1) + " entries, at most " +
                           std::to_string(limits::kSeeds));
  const auto long_name = errorsOf(kStudy, {"study=" + std::string(limits::kStringBytes + 1, 'a')});
  ASSERT_EQ(long_name.size(), 1u);
  EXPECT_NE(long_name[0].find(": study is " + std::to_string(limits::kStringBytes + 1) + " bytes long"),
            std::string::npos);
}

}  // namespace
}  // namespace terse::experiments
