// A study's grid (experiments/config/grid.h): every variant at every point of the axes' product, each value set as
// --set sets it, named and selected by point, and every kind of bad axis refused naming the axis's line or option.
#include "experiments/config/grid.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/plugin/loader.h"
#include "experiments/config/config.h"
#include "experiments/config/limits.h"

namespace terse::experiments {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class GridTest : public ::testing::Test {
 protected:
  GridTest() : loader_(PluginLoader::withSearchDirs({SearchDir{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}})) {
    options_.workloads = {"mlp", "cnn"};
    options_.loader = &loader_;
  }

  Study load(const std::string& text) { return loadStudyText(text, "g.textproto", options_); }

  std::vector<std::string> errorsOf(const std::string& text) {
    try {
      load(text);
    } catch (const ConfigError& e) {
      return e.errors();
    }
    ADD_FAILURE() << "loaded without error:\n" << text;
    return {};
  }

  static std::vector<std::string> names(const Study& s) {
    std::vector<std::string> out;
    for (const auto& e : s.experiments) out.push_back(e.variant());
    return out;
  }

  PluginLoader loader_;
  ConfigOptions options_;
};

// Line numbers matter: the messages below name them.
const std::string kGridBase =
    "study: \"g\"\n"                                     // 1
    "workload { name: \"mlp\" }\n"                       // 2
    "optimizer { lr: 0.1 }\n"                            // 3
    "workers: 4\n"                                       // 4
    "link { bandwidth: \"1Gbps\" latency: \"50us\" }\n"  // 5
    "compressor { name: \"none\" }\n";                   // 6
const std::string kGridVariants =
    "variants { name: \"dense\" }\n"
    "variants { name: \"topk\" overrides { epochs: 2 compressor { name: \"topk\" params { key: \"ratio\" value: "
    "\"0.1\" } } } }\n";

TEST_F(GridTest, EveryVariantRunsAtEveryPointLastAxisFastest) {
  const Study s = load(kGridBase +
                       "grid {\n"
                       "  path: \"link.bandwidth\"\n"
                       "  values: [\"1Gbps\", \"10Gbps\"]\n"
                       "}\n"
                       "grid { path: \"workers\" values: [\"2\", \"8\", \"16\"] }\n" +
                       kGridVariants);
  EXPECT_THAT(names(s), ElementsAre("dense.bandwidth-1Gbps.workers-2", "dense.bandwidth-1Gbps.workers-8",
                                    "dense.bandwidth-1Gbps.workers-16", "dense.bandwidth-10Gbps.workers-2",
                                    "dense.bandwidth-10Gbps.workers-8", "dense.bandwidth-10Gbps.workers-16",
                                    "topk.bandwidth-1Gbps.workers-2", "topk.bandwidth-1Gbps.workers-8",
                                    "topk.bandwidth-1Gbps.workers-16", "topk.bandwidth-10Gbps.workers-2",
                                    "topk.bandwidth-10Gbps.workers-8", "topk.bandwidth-10Gbps.workers-16"));
  const Experiment& e = s.experiments[10];  // topk at 10Gbps, 8 workers
  EXPECT_EQ(e.workers(), 8);
  EXPECT_EQ(e.epochs(), 2);  // the variant's own settings stay
  EXPECT_EQ(e.link().bandwidth(), "10Gbps");
  EXPECT_EQ(e.link().latency(), "50us");  // the axis sets one field; its siblings stay
  EXPECT_EQ(e.compressor().name(), "topk");
  EXPECT_EQ(e.grid_size(), 0);  // a resolved run is one point, not the grid
  ASSERT_TRUE(e.has_grid_point());
  EXPECT_EQ(e.grid_point().variant(), "topk");
  ASSERT_EQ(e.grid_point().coordinates_size(), 2);
  EXPECT_EQ(e.grid_point().coordinates(0).path(), "link.bandwidth");
  EXPECT_EQ(e.grid_point().coordinates(0).label(), "bandwidth");
  EXPECT_EQ(e.grid_point().coordinates(0).value(), "10Gbps");
  EXPECT_EQ(e.grid_point().coordinates(1).value(), "8");
  // The resolved text parses back to the same run (the results folder's config.textproto).
  EXPECT_EQ(parseConfigText(toText(e), "back").DebugString(), e.DebugString());
}

TEST_F(GridTest, AStudyWithoutVariantsGridsItsBase) {
  std::string text = kGridBase;
  text.replace(text.find("\"none\""), 6, "\"topk\"");
  const Study s = load(text + "grid { path: \"compressor.params.ratio\" label: \"r\" values: [\"0.01\", \"0.1\"] }\n");
  EXPECT_THAT(names(s), ElementsAre("base.r-0.01", "base.r-0.1"));
  EXPECT_EQ(s.experiments[1].compressor().params().at("ratio"), "0.1");
  EXPECT_EQ(s.experiments[1].grid_point().variant(), "base");
}

// Points that train the same thing: a grid over a field a variant ignores, and values that parse alike.
TEST_F(GridTest, RunsThatTrainTheSameThingAreNamed) {
  EXPECT_TRUE(sameRunWarnings(load(kGridBase + kGridVariants).experiments).empty());
  const Study alpha =
      load(kGridBase + "data { partition: DIRICHLET dirichlet_alpha: 0.5 }\n" +
           "grid { path: \"data.dirichlet_alpha\" label: \"a\" values: [\"0.1\", \"1\"] }\n" +
           "variants { name: \"noniid\" }\n" + "variants { name: \"iid\" overrides { data { partition: IID } } }\n");
  ASSERT_EQ(alpha.experiments.size(), 4u);
  const auto same = sameRunWarnings(alpha.experiments);
  ASSERT_EQ(same.size(), 1u);
  EXPECT_THAT(same[0], StartsWith("2 runs train the same thing under different names: 'iid.a-0.1', 'iid.a-1' ("));
  // 0.1 and 0.10 are two names for one learning rate; repeats over seeds stay apart.
  const Study lr =
      load(kGridBase + "seeds: [1, 2]\ngrid { path: \"optimizer.lr\" values: [\"0.1\", \"0.10\", \"0.2\"] }\n");
  const auto twice = sameRunWarnings(expandRepeats(lr.experiments));
  ASSERT_EQ(twice.size(), 2u) << ::testing::PrintToString(twice);
  EXPECT_THAT(twice[0], HasSubstr("'base.lr-0.1/seed-1', 'base.lr-0.10/seed-1'"));
  EXPECT_THAT(twice[1], HasSubstr("'base.lr-0.1/seed-2', 'base.lr-0.10/seed-2'"));
}

TEST_F(GridTest, ListValuesAreNamedByTheirCharacters) {
  const Study s =
      load(kGridBase + "grid { path: \"workload.hidden_sizes\" values: [\"[64, 32]\", \"[128]\"] }\n" + kGridVariants);
  EXPECT_THAT(names(s), ElementsAre("dense.hidden_sizes-64_32", "dense.hidden_sizes-128", "topk.hidden_sizes-64_32",
                                    "topk.hidden_sizes-128"));
  EXPECT_THAT(s.experiments[0].workload().hidden_sizes(), ElementsAre(64, 32));
  EXPECT_THAT(s.experiments[1].workload().hidden_sizes(), ElementsAre(128));
}

TEST_F(GridTest, ASetGoesToEveryPointAfterTheAxes) {
  options_.overrides = parseFieldOverrides({"epochs=3"});
  const Study s = load(kGridBase + "grid { path: \"workers\" values: [\"2\", \"3\"] }\n" + kGridVariants);
  for (const auto& e : s.experiments) EXPECT_EQ(e.epochs(), 3) << e.variant();
}

TEST_F(GridTest, VariantSelectsItsPointsOrOnePoint) {
  const std::string text = kGridBase + "grid { path: \"workers\" values: [\"2\", \"3\"] }\n" + kGridVariants;
  const Study s = load(text);
  EXPECT_THAT(names(Study{s.source, s.file, selectVariants(s, {"topk"})}),
              ElementsAre("topk.workers-2", "topk.workers-3"));
  EXPECT_THAT(names(Study{s.source, s.file, selectVariants(s, {"dense.workers-3", "dense", "topk.workers-2"})}),
              ElementsAre("dense.workers-3", "dense.workers-2", "topk.workers-2"));
  try {
    selectVariants(s, {"nope"});
    FAIL() << "selected an unknown variant";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("(variants: dense, topk; or one point of the grid, e.g. 'dense.workers-2')"));
  }
  // A --set goes to the selected points alone: one point by its name, both points of a variant by the variant's.
  options_.overrides = parseFieldOverrides({"optimizer.lr=0.7"});
  options_.plugin_variants = {"topk.workers-3"};
  for (const auto& e : load(text).experiments)
    EXPECT_EQ(e.optimizer().lr(), e.variant() == "topk.workers-3" ? 0.7 : 0.1) << e.variant();
  options_.plugin_variants = {"dense"};
  for (const auto& e : load(text).experiments)
    EXPECT_EQ(e.optimizer().lr(), e.grid_point().variant() == "dense" ? 0.7 : 0.1) << e.variant();
}

TEST_F(GridTest, TheCommandLinesAxesJoinOrReplaceTheFiles) {
  options_.grid = {"workers=6,7", "epochs=1,2"};
  const Study s = load(kGridBase + "grid { path: \"workers\" label: \"w\" values: [\"2\", \"3\"] }\n");
  // workers keeps its place and label, with the command line's values; epochs comes after.
  EXPECT_THAT(names(s),
              ElementsAre("base.w-6.epochs-1", "base.w-6.epochs-2", "base.w-7.epochs-1", "base.w-7.epochs-2"));
  // More values or axes than the limits allow are the option's, not the file's.
  std::string many = "epochs=1";
  for (int i = 2; i <= 101; ++i) many += "," + std::to_string(i);
  options_.grid = {many};
  auto refused = errorsOf(kGridBase);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_THAT(refused[0], HasSubstr("--grid epochs=1,2,3"));
  EXPECT_THAT(refused[0], HasSubstr(": 101 values, more than an axis may have (100)"));
  options_.grid = {"epochs=1",
                   "seed=1",
                   "optimizer.lr=0.1",
                   "optimizer.momentum=0",
                   "data.batch_size=8",
                   "data.train_subset=0",
                   "data.test_subset=0",
                   "eval.every_steps=5",
                   "optimizer.warmup_steps=0"};
  refused = errorsOf(kGridBase);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0], "--grid: 9 axes with the config's, more than a study may have (8)");
  options_.grid = {"workers=2,3", "workers=4"};
  const auto errors = errorsOf(kGridBase);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "--grid workers=4: workers is already an axis by --grid workers=2,3; give each axis once");
}

TEST(GridOption, CommasInsideBracketsAndQuotesBelongToTheValue) {
  const GridAxis a = parseGridOption("workload.hidden_sizes=[64, 32],[128],'a,b',\"c,d\"");
  EXPECT_EQ(a.path(), "workload.hidden_sizes");
  EXPECT_THAT(a.values(), ElementsAre("[64, 32]", "[128]", "'a,b'", "\"c,d\""));
  auto errorOf = [](const std::string& text) {
    try {
      parseGridOption(text);
    } catch (const ConfigError& e) {
      return e.errors().front();
    }
    return std::string("parsed");
  };
  EXPECT_THAT(errorOf("workers"), HasSubstr("--grid workers: expected PATH=V1,V2,..."));
  EXPECT_THAT(errorOf("=1,2"), HasSubstr("no field path before '='"));
  EXPECT_THAT(errorOf("workers=2,,3"), HasSubstr("an empty value"));
  EXPECT_THAT(errorOf("workers=2,"), HasSubstr("an empty value"));
}

TEST_F(GridTest, AValueTheFieldRefusesNamesTheAxisLineOnce) {
  // Type errors come from the parser, value errors from the checks; both name the value and its axis's line, once
  // however many variants run at that point.
  auto errors = errorsOf(kGridBase +
                         "grid {\n"               // 7
                         "  path: \"workers\"\n"  // 8
                         "  values: \"2\"\n"      // 9
                         "  values: \"two\"\n"    // 10
                         "}\n" +
                         kGridVariants);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0],
            "g.textproto:10:3: grid[0].values[1] workers=two: workers takes int32, got 'two' (Expected "
            "integer, got: two)");
  errors = errorsOf(kGridBase + "grid { path: \"link.bandwidth\" values: [\"1Gbps\", \"10Xbps\"] }\n" + kGridVariants);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_THAT(errors[0], HasSubstr("g.textproto:7:31: grid[0].values[1] (link.bandwidth=10Xbps): link.bandwidth: "
                                   "bandwidth '10Xbps' is not valid"));
  errors = errorsOf(kGridBase + "grid { path: \"workers\" values: [\"2\", \"2000\"] }\n" + kGridVariants);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_THAT(errors[0], HasSubstr("grid[0].values[1] (workers=2000): workers must be in [1, 1024], got 2000"));
  options_.grid = {"workers=2,0"};
  errors = errorsOf(kGridBase);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_THAT(errors[0], HasSubstr("--grid workers=2,0 (workers=0): workers must be in [1, 1024], got 0"));
}

TEST_F(GridTest, AnErrorAtSomePointsNamesThem) {
  // worker_settings names worker 3, which exists at 4 workers but not at 2 or 3.
  const auto errors = errorsOf(kGridBase + "worker_settings { worker: 3 slowdown: 2 }\n" +
                               "grid { path: \"workers\" values: [\"2\", \"3\", \"4\"] }\n");
  ASSERT_EQ(errors.size(), 2u) << ::testing::PrintToString(errors);
  EXPECT_THAT(errors[0], HasSubstr("g.textproto:7:19: worker_settings[0].worker must be in [0, workers = 2), got 3 "
                                   "(at grid point workers=2)"));
  EXPECT_THAT(errors[1], HasSubstr("worker_settings[0].worker must be in [0, workers = 3), got 3 (at grid point "
                                   "workers=3)"));
}

TEST_F(GridTest, BadAxesAreRefusedNamingTheAxis) {
  auto one = [&](const std::string& grid) {
    const auto errors = errorsOf(kGridBase + grid + kGridVariants);
    EXPECT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
    return errors.empty() ? std::string() : errors.front();
  };
  EXPECT_EQ(one("grid { values: \"1\" }\n"),
            "g.textproto:7:1: grid[0]: path must be set (the field the axis varies, e.g. \"link.bandwidth\")");
  EXPECT_THAT(one("grid { path: \"workers\" }\n"), HasSubstr("grid[0]: workers has no values; give at least one"));
  EXPECT_THAT(one("grid { path: \"wrokers\" values: \"1\" }\n"),
              HasSubstr("Experiment has no field 'wrokers'; did you mean 'workers'?"));
  // A problem of the path is the axis's, said once however many values it has.
  EXPECT_EQ(one("grid { path: \"frobnicate\" values: [\"1\", \"2\", \"3\"] }\n"),
            "g.textproto:7:1: grid[0]: Experiment has no field 'frobnicate'; its fields: study, variant, workload, "
            "data, optimizer, workers, mode, staleness_bound, transport, tcp, parameter_server, worker_settings, "
            "compute_jitter, link, compressor, error_feedback, error_feedback_rule, ef21_momentum, "
            "compression_start_step, momentum_correction, local_sgd, scheduler, "
            "max_groups_in_flight, plugin_timeout, trace, step_trace, clock, simulation, collectives, "
            "sparse_gradients, epochs, eval, seed, seeds, gradient_accumulation_steps, output_dir, variants, grid");
  EXPECT_THAT(one("grid { path: \"lr\" values: \"1\" }\n"), HasSubstr("did you mean 'optimizer.lr'?"));
  EXPECT_THAT(one("grid { path: \"seeds\" values: \"[1, 2]\" }\n"),
              HasSubstr("grid[0]: seeds cannot be an axis: repeats over seeds are `seeds`"));
  EXPECT_THAT(one("grid { path: \"study\" values: \"x\" }\n"), HasSubstr("study cannot be an axis"));
  EXPECT_THAT(one("grid { path: \"output_dir\" values: \"x\" }\n"), HasSubstr("output_dir cannot be an axis"));
  EXPECT_THAT(one("grid { path: \"grid\" values: \"x\" }\n"), HasSubstr("grid cannot be an axis: axes do not nest"));
  EXPECT_THAT(one("grid { path: \"variant\" values: \"x\" }\n"), HasSubstr("variant comes from the file"));
  EXPECT_THAT(one("grid { path: \"workers\" values: [\"2\", \"2\"] }\n"), HasSubstr("'2' repeats values[0]"));
  EXPECT_THAT(one("grid { path: \"workload.hidden_sizes\" values: [\"[64, 32]\", \"[64,32]\"] }\n"),
              HasSubstr("'[64,32]' and values[0] '[64, 32]' both become '64_32' in variant names"));
  EXPECT_THAT(one("grid { path: \"link.latency\" values: [\"50us\", \"\\\"\\\"\"] }\n"),
              HasSubstr("has no character a folder name may hold"));
  EXPECT_THAT(one("grid { path: \"workers\" label: \"a/b\" values: \"2\" }\n"),
              HasSubstr("label must be a folder name ([A-Za-z0-9._-], not '.' or '..'), got 'a/b'"));
  EXPECT_THAT(one("grid { path: \"link\" values: \"{bandwidth: '1Gbps'}\" }\n"), HasSubstr("link is a message"));
  EXPECT_THAT(errorsOf(kGridBase + "grid { path: \"compressor.params\" values: \"[{key: 'ratio' value: '0.1'}]\" }\n" +
                       "grid { path: \"compressor.params.ratio\" values: \"0.1\" }\n")
                  .front(),
              HasSubstr("grid[1]: compressor.params.ratio overlaps the axis of compressor.params"));
  EXPECT_THAT(one("grid { path: \"link.latency\" values: \"1ms\" }\n"
                  "grid { path: \"simulation.topology.intra_latency\" label: \"latency\" values: \"1us\" }\n"),
              HasSubstr("grid[1]: label 'latency' is also link.latency's; give the axes distinct labels"));
  EXPECT_THAT(one("grid_point { variant: \"x\" }\ngrid { path: \"workers\" values: \"2\" }\n"),
              HasSubstr("grid_point: the loader sets it in each run of a grid (a results folder's config.textproto)"));
  EXPECT_THAT(
      errorsOf(kGridBase + "variants { name: \"v\" overrides { grid { path: \"workers\" values: \"2\" } } }\n").front(),
      HasSubstr("variants[0].overrides.grid: the grid is the study's"));
}

// An axis sets its field at every point after the variant's settings: a variant's own value of it would never be used.
TEST_F(GridTest, AVariantsOwnValueOfAnAxisIsRefused) {
  auto errors = errorsOf(kGridBase + "grid { path: \"workers\" values: [\"2\", \"4\"] }\n" +
                         "variants { name: \"dense\" }\n" + "variants { name: \"odd\" overrides { workers: 3 } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0],
            "g.textproto:9:36: variants[1] ('odd').workers: an axis of the study's grid (g.textproto:7:1: grid[0]) "
            "sets it at every point, so the variant's value would never be used; leave the field to the axis");
  // A map entry: the variant's ratio against an axis of ratio; another key of the map is the variant's own.
  errors = errorsOf(kGridBase + "grid { path: \"compressor.params.ratio\" values: [\"0.01\", \"0.1\"] }\n" +
                    "variants { name: \"a\" overrides { compressor { name: \"topk\" params { key: \"ratio\" value: "
                    "\"0.5\" } } } }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_THAT(errors[0], HasSubstr("variants[0] ('a').compressor.params.ratio: an axis of the study's grid"));
  EXPECT_EQ(load(kGridBase + "grid { path: \"compressor.params.ratio\" values: [\"0.01\", \"0.1\"] }\n" +
                 "variants { name: \"a\" overrides { compressor { name: \"randomk\" params { key: \"unbiased\" "
                 "value: \"true\" } } } }\n")
                .experiments[1]
                .compressor()
                .params()
                .at("ratio"),
            "0.1");
}

// An axis --grid adds wins over a variant's value of its field, as --set does: a sweep of one variant's parameter.
TEST_F(GridTest, AnAxisFromTheCommandLineWinsOverTheVariant) {
  options_.grid = {"compressor.params.ratio=0.001,0.1"};
  options_.plugin_variants = {"topk"};
  const Study s = load(kGridBase + kGridVariants);
  const auto topk = selectVariants(s, {"topk"});
  ASSERT_EQ(topk.size(), 2u);
  EXPECT_EQ(topk[0].variant(), "topk.ratio-0.001");
  EXPECT_EQ(topk[0].compressor().params().at("ratio"), "0.001");  // the variant's own 0.1 gives way
  EXPECT_EQ(topk[1].compressor().params().at("ratio"), "0.1");
}

// A results folder's config.textproto run again is one point of its study's grid: another value of its axis' field is
// refused, as the run would be filed under the old point; other fields may change.
TEST_F(GridTest, ARunsConfigKeepsItsPoint) {
  options_.grid = {"workers=2,3"};
  const Study s = load(kGridBase + kGridVariants);
  options_.grid.clear();
  const std::string resolved = toText(s.experiments[3]);  // topk at 3 workers
  EXPECT_EQ(s.experiments[3].variant(), "topk.workers-3");
  options_.overrides = parseFieldOverrides({"epochs=5"});
  const Study again = loadStudyText(resolved, "run.textproto", options_);
  ASSERT_EQ(again.experiments.size(), 1u);
  EXPECT_EQ(again.experiments[0].variant(), "topk.workers-3");
  EXPECT_EQ(again.experiments[0].grid_point().variant(), "topk");
  EXPECT_EQ(again.experiments[0].epochs(), 5);
  options_.overrides = parseFieldOverrides({"workers=4"});
  try {
    loadStudyText(resolved, "run.textproto", options_);
    FAIL() << "another value of the point's axis was taken";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.errors().size(), 1u) << ::testing::PrintToString(e.errors());
    EXPECT_EQ(e.errors()[0],
              "--set workers=4: this config is the run of variant 'topk' at workers=3 (its grid_point, as a results "
              "folder's config.textproto says), so workers is that point's; run the study's own file with --grid "
              "workers=..., or remove grid_point to make this a run of its own");
  }
}

TEST_F(GridTest, ASetOfAnAxisIsRefused) {
  options_.overrides = parseFieldOverrides({"link.bandwidth=10Gbps"});
  const auto refused = errorsOf(kGridBase + "grid { path: \"link.bandwidth\" values: [\"1Gbps\", \"100Gbps\"] }\n");
  ASSERT_EQ(refused.size(), 1u) << ::testing::PrintToString(refused);
  EXPECT_EQ(refused[0],
            "--set link.bandwidth=10Gbps: link.bandwidth is an axis of the study's grid (g.textproto:7:1: grid[0]); "
            "give its values with --grid link.bandwidth=V1,V2,...");
  EXPECT_THROW(parseFieldOverride("grid=[]"), ConfigError);
  EXPECT_THROW(parseFieldOverride("grid_point.variant=x"), ConfigError);
}

TEST_F(GridTest, RunsAreBoundedBeforeTheyAreMade) {
  // 2 variants x 100 x 100 points = 20,000 runs, above limits::kVariants.
  std::string values;
  for (int i = 1; i <= 100; ++i) values += (i > 1 ? ", \"" : "\"") + std::to_string(i) + "\"";
  const auto errors = errorsOf(kGridBase + "grid { path: \"optimizer.warmup_steps\" values: [" + values + "] }\n" +
                               "grid { path: \"data.batch_size\" values: [" + values + "] }\n" + kGridVariants);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_THAT(errors[0], HasSubstr("2 variant(s) at 10000 grid points make 20000 runs, more than the limit of 10000"));
  // 8 axes of 100 values: 10^16 points, whose product with the variants would overflow 64 bits; refused all the same.
  std::string eight;
  for (const char* path : {"epochs", "data.batch_size", "data.train_subset", "data.test_subset", "optimizer.lr",
                           "optimizer.warmup_steps", "optimizer.weight_decay", "eval.every_steps"})
    eight += "grid { path: \"" + std::string(path) + "\" values: [" + values + "] }\n";
  std::string many_variants;
  for (int i = 0; i < 10000; ++i) many_variants += "variants { name: \"v" + std::to_string(i) + "\" }\n";
  const auto huge = errorsOf(kGridBase + eight + many_variants);
  ASSERT_EQ(huge.size(), 1u) << ::testing::PrintToString(huge);
  EXPECT_THAT(huge[0], HasSubstr("10000 variant(s) at 10000000000000000 grid points make more than 10000 runs"));
  // And a list of more values than an axis may hold, by the file's list limits.
  const auto many = errorsOf(kGridBase + "grid { path: \"epochs\" values: [" + values + ", \"101\"] }\n");
  ASSERT_FALSE(many.empty());
  EXPECT_THAT(many[0], HasSubstr("grid[0].values"));
  EXPECT_THAT(many[0], HasSubstr(std::to_string(limits::kGridValues)));
}

TEST_F(GridTest, NamesStayUniqueAndShortEnoughForAFolder) {
  // Variant "a" at value "2.w-3" and variant "a.w-2" at value "3" would both be a.w-2.w-3: one folder for two runs.
  const auto clash =
      errorsOf(kGridBase + "grid { path: \"tcp.bind_address\" label: \"w\" values: [\"2.w-3\", \"3\"] }\n" +
               "variants { name: \"a\" }\nvariants { name: \"a.w-2\" }\n");
  ASSERT_EQ(clash.size(), 1u) << ::testing::PrintToString(clash);
  EXPECT_THAT(clash[0], HasSubstr("two runs would be named 'a.w-2.w-3': variant 'a' at tcp.bind_address=2.w-3 and "
                                  "variant 'a.w-2' at tcp.bind_address=3"));
  const auto long_name = errorsOf(kGridBase + "grid { path: \"link.latency\" label: \"" + std::string(100, 'l') +
                                  "\" values: \"50us\" }\n" + "grid { path: \"tcp.bind_address\" label: \"" +
                                  std::string(100, 'b') + "\" values: \"" + std::string(100, 'a') + "\" }\n");
  ASSERT_EQ(long_name.size(), 1u) << ::testing::PrintToString(long_name);
  EXPECT_THAT(long_name[0], HasSubstr("would be named 312 bytes long, above a folder name's 255"));
}

// data.global_batch_size (a scaling study at one global batch): the per-worker batch follows the workers at every
// point, and a global batch the workers do not divide is refused at the points where they do not.
TEST_F(GridTest, AGlobalBatchIsSplitOverEachPointsWorkers) {
  const std::string text = kGridBase + "data { global_batch_size: 256 }\n" + "gradient_accumulation_steps: 2\n" +
                           "grid { path: \"workers\" values: [\"2\", \"4\", \"8\"] }\n";
  const Study s = load(text);
  ASSERT_EQ(s.experiments.size(), 3u);
  EXPECT_EQ(s.experiments[0].data().batch_size(), 64);  // 256 / (2 workers x 2 micro-batches)
  EXPECT_EQ(s.experiments[1].data().batch_size(), 32);
  EXPECT_EQ(s.experiments[2].data().batch_size(), 16);
  EXPECT_EQ(s.experiments[2].data().global_batch_size(), 256);
  // Without it the default stays 32 per worker.
  EXPECT_EQ(load(kGridBase).experiments[0].data().batch_size(), 32);

  auto errors = errorsOf(kGridBase + "data { global_batch_size: 96 }\n" +
                         "grid { path: \"workers\" values: [\"2\", \"3\", \"64\"] }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(
      errors[0],
      "g.textproto:7:8: data.global_batch_size 96 is not a multiple of workers (64) x gradient_accumulation_steps "
      "(1) = 64 (at grid point workers=64)");
  // A batch_size beside it must be its share.
  errors = errorsOf(kGridBase + "data { batch_size: 32 global_batch_size: 256 }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0],
            "g.textproto:7:8: data.batch_size 32 is not data.global_batch_size 256 / workers (4) x "
            "gradient_accumulation_steps (1) = 64; give one of the two");
  EXPECT_EQ(load(kGridBase + "data { batch_size: 64 global_batch_size: 256 }\n").experiments[0].data().batch_size(),
            64);
  // Workers out of range are said once, by their own rule (the share's check divided by zero: SIGFPE).
  errors =
      errorsOf(kGridBase + "data { global_batch_size: 64 }\n" + "grid { path: \"workers\" values: [\"0\", \"2\"] }\n");
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_THAT(errors[0], HasSubstr("grid[0].values[0] (workers=0): workers must be in [1, 1024], got 0"));
  // The share must be a batch a worker may take.
  errors = errorsOf(kGridBase + "data { global_batch_size: 67108864 }\n");
  ASSERT_FALSE(errors.empty());
  EXPECT_THAT(errors[0], HasSubstr("data.batch_size must be in [1, 65536], got 16777216"));
}

}  // namespace
}  // namespace terse::experiments
