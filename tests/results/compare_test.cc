// compare's numbers on synthetic folders with known answers, and its handling of broken folders.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "results/compare.h"
#include "tests/results/results_fixture.h"

namespace terse::results {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

const CompareRow& row(const StudyTable& t, const std::string& variant) {
  for (const auto& r : t.rows)
    if (r.variant == variant) return r;
  ADD_FAILURE() << "no row " << variant;
  static CompareRow none;
  return none;
}

std::vector<std::string> order(const StudyTable& t) {
  std::vector<std::string> out;
  for (const auto& r : t.rows) out.push_back(r.variant);
  return out;
}

TEST(CrossTarget, InterpolatesLinearlyBetweenTheBracketingPoints) {
  std::vector<EvalPoint> pts(3);
  pts[0].accuracy = 0.5, pts[0].wire_bytes = 100, pts[0].wall_s = 10;
  pts[1].accuracy = 0.7, pts[1].wire_bytes = 200, pts[1].wall_s = 20;
  pts[2].accuracy = 0.9, pts[2].wire_bytes = 400, pts[2].wall_s = 40;
  auto c = crossTarget(pts, 0.8);
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->wire_bytes, 300);  // half way from 200 to 400
  EXPECT_DOUBLE_EQ(c->wall_s, 30);
  c = crossTarget(pts, 0.7);  // exactly at a point: that point
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->wire_bytes, 200);
  c = crossTarget(pts, 0.3);  // the first point already reaches it: nothing was measured before
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->wire_bytes, 100);
  EXPECT_FALSE(crossTarget(pts, 0.95));
  EXPECT_FALSE(crossTarget({}, 0.5));
}

TEST(CrossTarget, TakesTheFirstCrossingWhenAccuracyDipsAgain) {
  std::vector<EvalPoint> pts(4);
  const double acc[] = {0.5, 0.9, 0.6, 0.95};
  for (int i = 0; i < 4; ++i) pts[i].accuracy = acc[i], pts[i].wire_bytes = 100.0 * (i + 1), pts[i].wall_s = i;
  auto c = crossTarget(pts, 0.7);
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->wire_bytes, 150);
}

class KnownStudy : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = freshDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    for (const auto& s : knownStudy()) writeRun(root_, s);
    runs_ = loadRuns({root_}, warnings_);
  }
  fs::path root_;
  std::vector<std::string> warnings_;
  std::vector<RunData> runs_;
};

TEST_F(KnownStudy, ReadsEveryVariantBack) {
  ASSERT_EQ(runs_.size(), 5u);
  // Only the failed run is worth a warning.
  EXPECT_EQ(warnings_.size(), 1u) << joined(warnings_);
  EXPECT_TRUE(anyContains(warnings_, "qsgd", "the run failed: rank 2: qsgd: compress failed"));
  for (const auto& r : runs_) {
    EXPECT_EQ(r.study, "s");
    EXPECT_TRUE(r.has_config);
    EXPECT_TRUE(r.provenance.has_value());
    EXPECT_EQ(r.config_sha256, sha256Hex(readText(r.dir / "config.textproto")));
  }
}

// Error feedback's rule, from each run's config: EF, EF21 and EF21-SGDM's eta tell apart runs whose compressor and
// error_feedback flag are the same (rows, JSON, CSV); DGC's momentum correction alone is EF's; none is empty.
TEST(CompareRows, ErrorFeedbacksRuleComesFromTheConfig) {
  const fs::path root = freshDir("error_feedback_rule");
  std::vector<RunSpec> specs = {{"s", "dense", "none", false, {{10, 0.9, 100, 1}}},
                                {"s", "topk-ef", "topk", true, {{10, 0.85, 10, 1}}},
                                {"s", "topk-ef21", "topk", true, {{10, 0.84, 10, 1}}},
                                {"s", "topk-sgdm", "topk", true, {{10, 0.83, 10, 1}}},
                                {"s", "topk-dgc", "topk", false, {{10, 0.86, 10, 1}}}};
  specs[2].config_extra = "error_feedback_rule: EF21\n";
  specs[3].config_extra = "error_feedback_rule: EF21\nef21_momentum: 0.1\n";
  specs[4].config_extra = "momentum_correction { factor: 0.9 }\n";
  for (const auto& s : specs) writeRun(root, s);
  std::vector<std::string> warnings;
  const Comparison c = compare(loadRuns({root}, warnings), {}, warnings);
  ASSERT_EQ(c.studies.size(), 1u);
  const StudyTable& t = c.studies[0];
  EXPECT_EQ(row(t, "dense").error_feedback_rule, "");
  EXPECT_EQ(row(t, "topk-ef").error_feedback_rule, "EF");
  EXPECT_EQ(row(t, "topk-ef21").error_feedback_rule, "EF21");
  EXPECT_EQ(row(t, "topk-sgdm").error_feedback_rule, "EF21 eta=0.1");
  EXPECT_EQ(row(t, "topk-dgc").error_feedback_rule, "EF");
  const std::string csv = toCsv(c);
  EXPECT_NE(csv.find(",EF21 eta=0.1,0\n"), std::string::npos) << csv;
  const auto json = parseJson(toJson(c, warnings));
  ASSERT_TRUE(json);
  std::set<std::string> rules;
  for (const Json& r : json->at("studies").at(0).at("rows"))
    rules.insert(getString(r, "error_feedback_rule").value_or("?"));
  EXPECT_EQ(rules, (std::set<std::string>{"", "EF", "EF21", "EF21 eta=0.1"}));
  // The Markdown table has no column for it: a note names the rows whose rule is not EF.
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("- error feedback's rule other than EF: topk-ef21 EF21, topk-sgdm EF21 eta=0.1\n"),
            std::string::npos)
      << md;
}

// A dense warm-up's length comes from the config too: the last CSV column and a JSON field, 0 without one.
TEST(CompareRows, ADenseWarmupsStartStepComesFromTheConfig) {
  const fs::path root = freshDir("compression_start_step");
  std::vector<RunSpec> specs = {{"s", "dense", "none", false, {{10, 0.9, 100, 1}}},
                                {"s", "topk-warm", "topk", true, {{10, 0.85, 10, 1}}}};
  specs[1].config_extra = "compression_start_step: 469\n";
  for (const auto& s : specs) writeRun(root, s);
  std::vector<std::string> warnings;
  const Comparison c = compare(loadRuns({root}, warnings), {}, warnings);
  ASSERT_EQ(c.studies.size(), 1u);
  EXPECT_EQ(row(c.studies[0], "dense").compression_start_step, 0);
  EXPECT_EQ(row(c.studies[0], "topk-warm").compression_start_step, 469);
  const std::string csv = toCsv(c);
  EXPECT_NE(csv.find(",EF,469\n"), std::string::npos) << csv;
  const auto json = parseJson(toJson(c, warnings));
  ASSERT_TRUE(json);
  std::set<int64_t> starts;
  for (const Json& r : json->at("studies").at(0).at("rows"))
    starts.insert(r.at("compression_start_step").get<int64_t>());
  EXPECT_EQ(starts, (std::set<int64_t>{0, 469}));
  // The Markdown table has no column for it: a note names the rows with a warm-up, and no rule note appears.
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("- compressed after a dense warm-up (compression_start_step; the warm-up's steps are allreduced "
                    "uncompressed and count in every column): topk-warm from step 469\n"),
            std::string::npos)
      << md;
  EXPECT_EQ(md.find("error feedback's rule"), std::string::npos) << md;
}

TEST_F(KnownStudy, KnownAnswers) {
  const Comparison c = compare(runs_, {}, warnings_);
  ASSERT_EQ(c.studies.size(), 1u);
  const StudyTable& t = c.studies[0];
  EXPECT_EQ(t.baseline, "dense");
  EXPECT_EQ(t.baseline_source, "auto");

  const CompareRow& dense = row(t, "dense");
  EXPECT_TRUE(dense.baseline);
  ASSERT_TRUE(dense.to_target);
  EXPECT_NEAR(dense.to_target->wire_bytes, 2500, 1e-9);
  EXPECT_NEAR(dense.to_target->wall_s, 2.5, 1e-12);
  EXPECT_DOUBLE_EQ(*dense.ratio, 1);
  EXPECT_DOUBLE_EQ(*dense.wire_bytes_per_step, 10);
  EXPECT_DOUBLE_EQ(*dense.final_accuracy, 0.90);
  EXPECT_DOUBLE_EQ(*dense.payload_bytes, 1500);

  const CompareRow& topk = row(t, "topk");
  EXPECT_FALSE(topk.baseline);
  ASSERT_TRUE(topk.to_target);
  EXPECT_NEAR(topk.to_target->wire_bytes, 100 + 100 * (0.25 / 0.26), 1e-9);
  EXPECT_NEAR(topk.to_target->wall_s, 1 + 0.25 / 0.26, 1e-12);
  EXPECT_DOUBLE_EQ(*topk.ratio, 10);
  EXPECT_DOUBLE_EQ(*topk.best_accuracy, 0.88);
  EXPECT_TRUE(topk.error_feedback);

  const CompareRow& fp16 = row(t, "fp16");
  ASSERT_TRUE(fp16.to_target);
  EXPECT_DOUBLE_EQ(fp16.to_target->wire_bytes, 500);
  EXPECT_DOUBLE_EQ(*fp16.ratio, 2);

  const CompareRow& sign = row(t, "signsgd");
  EXPECT_FALSE(sign.to_target);
  EXPECT_DOUBLE_EQ(*sign.final_accuracy, 0.80);

  const CompareRow& failed = row(t, "qsgd");
  EXPECT_EQ(failed.state, "failed");
  EXPECT_EQ(failed.records, 1);
  EXPECT_FALSE(failed.to_target);
  EXPECT_DOUBLE_EQ(*failed.final_accuracy, 0.5);
  EXPECT_TRUE(anyContains(t.notes, "`qsgd` failed: rank 2: qsgd: compress failed"));

  // Step time split: the last record's means; codec = compress + decompress.
  EXPECT_DOUBLE_EQ(*dense.compute_s, 0.001);
  EXPECT_NEAR(*dense.codec_s, 0.0003, 1e-15);
  EXPECT_DOUBLE_EQ(*dense.comm_s, 0.004);
  EXPECT_DOUBLE_EQ(*dense.exposed_comm_s, 0.003);
  EXPECT_DOUBLE_EQ(*dense.step_s, 0.0045);
  EXPECT_FALSE(dense.staleness);
}

TEST_F(KnownStudy, RowsReachedByBytesToTargetThenByFinalAccuracy) {
  const Comparison c = compare(runs_, {}, warnings_);
  EXPECT_EQ(order(c.studies[0]), (std::vector<std::string>{"topk", "fp16", "dense", "signsgd", "qsgd"}));
}

TEST_F(KnownStudy, TargetChangesTheAnswers) {
  CompareOptions o;
  o.target = 0.75;
  const Comparison c = compare(runs_, o, warnings_);
  const StudyTable& t = c.studies[0];
  ASSERT_TRUE(row(t, "signsgd").to_target);
  EXPECT_NEAR(row(t, "signsgd").to_target->wire_bytes, 20, 1e-12);
  EXPECT_NEAR(row(t, "dense").to_target->wire_bytes, 1500, 1e-9);
  EXPECT_EQ(order(t), (std::vector<std::string>{"signsgd", "topk", "fp16", "dense", "qsgd"}));
}

TEST_F(KnownStudy, BaselineOverride) {
  CompareOptions o;
  o.baseline = "topk";
  const Comparison c = compare(runs_, o, warnings_);
  const StudyTable& t = c.studies[0];
  EXPECT_EQ(t.baseline, "topk");
  EXPECT_EQ(t.baseline_source, "--baseline");
  EXPECT_TRUE(row(t, "topk").baseline);
  EXPECT_FALSE(row(t, "dense").baseline);
  EXPECT_DOUBLE_EQ(*row(t, "dense").ratio, 0.1);
  EXPECT_TRUE(anyContains(t.notes, "uses compressor 'topk', not none"));
}

TEST_F(KnownStudy, UnknownBaselineIsReportedAndLeavesNoRatios) {
  CompareOptions o;
  o.baseline = "nope";
  std::vector<std::string> w;
  const Comparison c = compare(runs_, o, w);
  EXPECT_TRUE(anyContains(w, "--baseline nope: no study has a variant of that name"));
  EXPECT_EQ(c.studies[0].baseline, "");
  for (const auto& r : c.studies[0].rows) EXPECT_FALSE(r.ratio) << r.variant;
}

TEST(Compare, NoDenseVariantMeansNoRatiosAndSaysSo) {
  const fs::path root = freshDir("NoDense");
  writeRun(root, {"s", "a", "topk", false, {{10, 0.5, 10, 1}}});
  writeRun(root, {"s", "b", "fp16", false, {{10, 0.6, 20, 1}}});
  std::vector<std::string> w;
  const Comparison c = compare(loadRuns({root}, w), {}, w);
  EXPECT_EQ(c.studies[0].baseline_source, "none");
  EXPECT_TRUE(anyContains(c.studies[0].notes, "no variant uses compressor none"));
  for (const auto& r : c.studies[0].rows) EXPECT_FALSE(r.ratio);
}

TEST(Compare, SeveralDenseVariantsPreferThePlainOne) {
  const fs::path root = freshDir("SeveralDense");
  writeRun(root, {"s", "a-dense-ef", "none", true, {{10, 0.5, 10, 1}}});
  writeRun(root, {"s", "b-dense", "none", false, {{10, 0.5, 40, 1}}});
  writeRun(root, {"s", "c", "topk", false, {{10, 0.5, 4, 1}}});
  std::vector<std::string> w;
  const Comparison c = compare(loadRuns({root}, w), {}, w);
  const StudyTable& t = c.studies[0];
  EXPECT_EQ(t.baseline, "b-dense");
  EXPECT_TRUE(anyContains(t.notes, "several variants use compressor none"));
  EXPECT_DOUBLE_EQ(*row(t, "c").ratio, 10);
}

TEST(Compare, StudiesAreSeparateTablesWithTheirOwnBaselines) {
  const fs::path root = freshDir("TwoStudies");
  writeRun(root, {"s1", "dense", "none", false, {{10, 0.5, 100, 1}}});
  writeRun(root, {"s1", "x", "topk", false, {{10, 0.5, 10, 1}}});
  writeRun(root, {"s2", "dense", "none", false, {{10, 0.5, 1000, 1}}});
  writeRun(root, {"s2", "x", "topk", false, {{10, 0.5, 10, 1}}});
  std::vector<std::string> w;
  // A study folder and a variant folder of the other study, and one reached twice: read once.
  const auto runs = loadRuns({root / "s1", root / "s2" / "dense", root / "s2" / "x", root / "s2" / "x"}, w);
  ASSERT_EQ(runs.size(), 4u) << joined(w);
  const Comparison c = compare(runs, {}, w);
  ASSERT_EQ(c.studies.size(), 2u);
  EXPECT_DOUBLE_EQ(*row(c.studies[0], "x").ratio, 10);
  EXPECT_DOUBLE_EQ(*row(c.studies[1], "x").ratio, 100);
}

// A study with a grid (experiment.proto `grid`): one table per point, in the natural order of the values (8 before 32),
// each with the rows named by the file's variant names, its own baseline and ratios, and the point in every format.
// The axis's field differs between the points by design: no "different data" warning for it.
TEST(Compare, AGridPointIsATableWithItsOwnBaseline) {
  const fs::path root = freshDir("Grid");
  for (const std::string workers : {"32", "8"}) {
    for (const std::string batch : {"256", "32"}) {
      const uint64_t dense_wire = static_cast<uint64_t>(std::stoi(workers) * std::stoi(batch));
      for (const auto& [variant, compressor, wire] :
           {std::tuple{"dense", "none", dense_wire}, std::tuple{"topk", "topk", uint64_t{8}}}) {
        RunSpec s{"s",
                  std::string(variant) + ".workers-" + workers + ".batch_size-" + batch,
                  compressor,
                  false,
                  {{10, 0.5, wire, 1}}};
        s.batch_size = batch;
        s.grid_variant = variant;
        s.grid = {{"workers", workers}, {"data.batch_size", batch}};
        writeRun(root, s);
      }
    }
  }
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 8u) << joined(w);
  EXPECT_TRUE(configMismatchWarnings(runs).empty()) << joined(configMismatchWarnings(runs));
  const Comparison c = compare(runs, {}, w);
  ASSERT_EQ(c.studies.size(), 4u);
  std::vector<std::string> titles;
  for (const auto& t : c.studies) titles.push_back(gridTitle(t));
  EXPECT_EQ(titles, (std::vector<std::string>{"workers=8, data.batch_size=32", "workers=8, data.batch_size=256",
                                              "workers=32, data.batch_size=32", "workers=32, data.batch_size=256"}));
  for (const auto& t : c.studies) {
    EXPECT_EQ(t.study, "s");
    EXPECT_EQ(t.baseline, "dense");
    EXPECT_EQ(order(t), (std::vector<std::string>{"dense", "topk"}));
    // Against that point's dense run: workers x batch bytes over topk's 8.
    const double dense = std::stod(t.grid[0].second) * std::stod(t.grid[1].second);
    EXPECT_DOUBLE_EQ(*row(t, "topk").ratio, dense / 8) << gridTitle(t);
  }
  // --baseline names the file's variant, found at every point.
  CompareOptions o;
  o.baseline = "topk";
  std::vector<std::string> w2;
  const Comparison by_topk = compare(runs, o, w2);
  for (const auto& t : by_topk.studies) EXPECT_EQ(t.baseline, "topk");
  EXPECT_TRUE(w2.empty()) << joined(w2);
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("### s at workers=8, data.batch_size=32\n"), std::string::npos) << md;
  // After the last point, the points side by side: time to target (none reached 0.85 here), then final accuracy.
  const auto pivot = md.find("### s across its grid\n");
  ASSERT_NE(pivot, std::string::npos) << md;
  EXPECT_LT(md.find("### s at workers=32, data.batch_size=256"), pivot);
  EXPECT_NE(md.find("One column per point (workers, data.batch_size)", pivot), std::string::npos) << md;
  EXPECT_NE(md.find("| variant | 8, 32 | 8, 256 | 32, 32 | 32, 256 |", pivot), std::string::npos) << md;
  EXPECT_NE(md.find("| topk | not reached | not reached | not reached | not reached |", pivot), std::string::npos);
  EXPECT_NE(md.find("| dense | 0.5000 | 0.5000 | 0.5000 | 0.5000 |", pivot), std::string::npos) << md;
  const std::string csv = toCsv(c);
  EXPECT_NE(csv.find(",grid_point,pull_residual_rel,error_feedback_rule,compression_start_step\n"), std::string::npos);
  // Pull residual and error feedback's rule: none.
  EXPECT_NE(csv.find(",workers=32;data.batch_size=256,,,0\n"), std::string::npos) << csv;
  const auto json = parseJson(toJson(c, w));
  ASSERT_TRUE(json);
  const Json& point = json->at("studies").at(0).at("grid_point");
  EXPECT_EQ(getString(point, "workers").value_or(""), "8");
  EXPECT_EQ(getString(point, "data.batch_size").value_or(""), "32");
}

// Values that natural order takes for one (leading zeros: 0.1, 0.01, 0.001) are three points, three tables; and a
// batch_size that a global batch sets differs between points by design: no "different data" warning.
TEST(Compare, GridValuesWithLeadingZerosAreTablesApart) {
  const fs::path root = freshDir("GridZeros");
  for (const std::string lr : {"0.1", "0.01", "0.001"}) {
    for (const auto& [variant, compressor, wire] :
         {std::tuple{"dense", "none", uint64_t{100}}, std::tuple{"fp16", "fp16", uint64_t{50}}}) {
      RunSpec s{"s", std::string(variant) + ".lr-" + lr, compressor, false, {{10, std::stod(lr), wire, 1}}};
      s.grid_variant = variant;
      s.grid = {{"optimizer.lr", lr}};
      s.batch_size = lr == "0.1" ? "32" : "64";
      s.global_batch = "128";
      writeRun(root, s);
    }
  }
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 6u) << joined(w);
  EXPECT_TRUE(configMismatchWarnings(runs).empty()) << joined(configMismatchWarnings(runs));
  const Comparison c = compare(runs, {}, w);
  ASSERT_EQ(c.studies.size(), 3u);
  std::vector<std::string> titles;
  for (const auto& t : c.studies) {
    titles.push_back(gridTitle(t));
    EXPECT_EQ(order(t), (std::vector<std::string>{"dense", "fp16"})) << gridTitle(t);
    EXPECT_DOUBLE_EQ(*row(t, "dense").final_accuracy, std::stod(t.grid[0].second));
  }
  EXPECT_EQ(titles, (std::vector<std::string>{"optimizer.lr=0.001", "optimizer.lr=0.01", "optimizer.lr=0.1"}));
}

// Runs of one study made with other axes share no columns: a pivot per set of axes.
TEST(Compare, AGridPivotPerSetOfAxes) {
  const fs::path root = freshDir("GridPivotAxes");
  for (const std::string v : {"2", "4"}) {
    RunSpec a{"s", "dense.workers-" + v, "none", false, {{10, 0.9, 100, 1}}};
    a.grid_variant = "dense";
    a.grid = {{"workers", v}};
    writeRun(root, a);
    RunSpec b{"s", "dense.bandwidth-" + v + "Gbps", "none", false, {{10, 0.9, 100, 1}}};
    b.grid_variant = "dense";
    b.grid = {{"link.bandwidth", v + "Gbps"}};
    writeRun(root, b);
  }
  std::vector<std::string> w;
  const std::string md = toMarkdown(compare(loadRuns({root}, w), {}, w));
  EXPECT_NE(md.find("One column per point (link.bandwidth)"), std::string::npos) << md;
  EXPECT_NE(md.find("One column per point (workers)"), std::string::npos) << md;
  EXPECT_NE(md.find("| variant | 2Gbps | 4Gbps |"), std::string::npos) << md;
  EXPECT_NE(md.find("| variant | 2 | 4 |"), std::string::npos) << md;
}

// Numbers of one unit come in their order, which digit runs alone get wrong past the point (0.05 after 0.1).
TEST(Compare, GridDecimalValuesAreTablesInNumericOrder) {
  const fs::path root = freshDir("GridDecimals");
  for (const std::string ratio : {"0.5", "0.1", "0.05", "1e-3"}) {
    RunSpec s{"s", "topk.ratio-" + ratio, "topk", false, {{10, 0.9, 100, 1}}};
    s.grid_variant = "topk";
    s.grid = {{"compressor.params.ratio", ratio}};
    writeRun(root, s);
  }
  std::vector<std::string> w;
  const Comparison c = compare(loadRuns({root}, w), {}, w);
  std::vector<std::string> order;
  for (const auto& t : c.studies) order.push_back(t.grid.at(0).second);
  EXPECT_EQ(order, (std::vector<std::string>{"1e-3", "0.05", "0.1", "0.5"}));
}

// The pivot's speedups are each point's: the baseline's time to target over the variant's at that point.
TEST(Compare, AGridsPivotGivesEachPointsSpeedupOverItsBaseline) {
  const fs::path root = freshDir("GridPivot");
  for (const auto& [workers, dense_s, topk_s] : {std::tuple{"2", 2.0, 1.0}, std::tuple{"4", 2.0, 4.0}}) {
    for (const auto& [variant, compressor, wall] :
         {std::tuple{"dense", "none", dense_s}, std::tuple{"topk", "topk", topk_s}}) {
      RunSpec s{"s", std::string(variant) + ".workers-" + workers, compressor, false, {{10, 0.9, 100, wall}}};
      s.grid_variant = variant;
      s.grid = {{"workers", workers}};
      writeRun(root, s);
    }
  }
  std::vector<std::string> w;
  const std::string md = toMarkdown(compare(loadRuns({root}, w), {}, w));
  const auto pivot = md.find("### s across its grid\n");
  ASSERT_NE(pivot, std::string::npos) << md;
  EXPECT_NE(md.find("| variant | 2 | 4 |", pivot), std::string::npos) << md;
  EXPECT_NE(md.find("| topk | 1.00 (2.00×) | 4.00 (0.500×) |", pivot), std::string::npos) << md;
  EXPECT_NE(md.find("| dense | 2.00 | 2.00 |", pivot), std::string::npos) << md;
}

// With seeds, the pivot's time and bytes carry their intervals, as the points' tables do; the bytes pivot gives each
// point's ratio against its baseline.
TEST(Compare, AGridsPivotCarriesTheSeedIntervals) {
  const fs::path root = freshDir("GridPivotSeeds");
  for (const std::string workers : {"2", "4"}) {
    for (uint64_t seed : {1, 2}) {
      for (const auto& [variant, compressor, wire] :
           {std::tuple{"dense", "none", uint64_t{400}}, std::tuple{"topk", "topk", uint64_t{100}}}) {
        RunSpec s{"s",
                  std::string(variant) + ".workers-" + workers,
                  compressor,
                  false,
                  {{10, 0.9, wire, 1.0 + static_cast<double>(seed)}}};
        s.grid_variant = variant;
        s.grid = {{"workers", workers}};
        s.seeds = "[1, 2]";
        s.seed = seed;
        writeRun(root, s);
      }
    }
  }
  std::vector<std::string> w;
  const std::string md = toMarkdown(compare(loadRuns({root}, w), {}, w));
  const auto pivot = md.find("### s across its grid\n");
  ASSERT_NE(pivot, std::string::npos) << md;
  // Seconds 2 and 3: mean 2.5, half-width t(0.975, 1) x 0.7071 / sqrt(2) = 6.35.
  EXPECT_NE(md.find("| topk | 2.50 ± 6.35 ≈ (1.00×) | 2.50 ± 6.35 ≈ (1.00×) |", pivot), std::string::npos) << md;
  EXPECT_NE(md.find("| topk | 0.0001 ± 0 (4.00×) | 0.0001 ± 0 (4.00×) |", pivot), std::string::npos) << md;
}

// One study run twice into two results folders (in-process and tcp, before and after): the rows of one name are
// labelled by the part of their folder's path that tells them apart, and a warning says so.
TEST(Compare, RunsOfOneNameFromTwoFoldersAreLabelledByTheFolder) {
  const fs::path root = freshDir("OneNameTwoFolders");
  writeRun(root / "a" / "res", {"s", "dense", "none", false, {{10, 0.5, 100, 1}}});
  writeRun(root / "b" / "res", {"s", "dense", "none", false, {{10, 0.6, 100, 1}}});
  writeRun(root / "res-tcp", {"s", "dense", "none", false, {{10, 0.7, 100, 1}}});
  writeRun(root / "res-tcp", {"s", "x", "topk", false, {{10, 0.7, 10, 1}}});
  std::vector<std::string> w;
  const auto runs = loadRuns({root / "a" / "res", root / "b" / "res", root / "res-tcp"}, w);
  ASSERT_EQ(runs.size(), 4u) << joined(w);
  std::set<std::string> variants;
  for (const auto& r : runs) variants.insert(r.variant);
  EXPECT_EQ(variants, (std::set<std::string>{"dense (a/res)", "dense (b/res)", "dense (res-tcp)", "x"}));
  EXPECT_NE(joined(w).find("study 's', variant 'dense': runs of that name from several results folders"),
            std::string::npos)
      << joined(w);
  const std::string md = toMarkdown(compare(runs, {}, w));
  EXPECT_NE(md.find("| dense (res-tcp) |"), std::string::npos) << md;
}

// The same, named as a user in the results folder would (relative paths, "."), with one folder holding the variant's
// repeats and the other a single run: labelled alike, and --baseline takes the bare name where it names one row.
TEST(Compare, RunsOfOneNameFromRelativeFoldersAndRepeatsAreLabelledToo) {
  const fs::path root = freshDir("OneNameRelative");
  RunSpec one{"s", "dense", "none", false, {{10, 0.5, 100, 1}}};
  writeRun(root / "res", one);
  for (const uint64_t seed : {1, 2}) {
    RunSpec repeat{"s", "dense", "none", false, {{10, 0.6, 100, 1}}};
    repeat.seeds = "[1, 2]";
    repeat.seed = seed;
    writeRun(root / "res-tcp", repeat);
  }
  writeRun(root / "res-tcp", {"s", "x", "topk", false, {{10, 0.7, 10, 1}}});
  const fs::path before = fs::current_path();
  fs::current_path(root / "res");
  std::vector<std::string> w;
  const auto runs = loadRuns({"s", "../res-tcp"}, w);
  fs::current_path(before);
  ASSERT_EQ(runs.size(), 4u) << joined(w);
  std::multiset<std::string> variants;
  for (const auto& r : runs) variants.insert(r.variant);
  EXPECT_EQ(variants, (std::multiset<std::string>{"dense (res)", "dense (res-tcp)", "dense (res-tcp)", "x"}));
  CompareOptions o;
  o.baseline = "x";
  const Comparison by_x = compare(runs, o, w);
  ASSERT_EQ(by_x.studies.size(), 1u);
  EXPECT_EQ(by_x.studies[0].baseline_source, "--baseline");
  o.baseline = "dense";  // two rows: a note names them
  const std::string md = toMarkdown(compare(runs, o, w));
  EXPECT_NE(md.find("`dense` (--baseline) names several rows here, `dense (res)`, `dense (res-tcp)`"),
            std::string::npos)
      << md;
}

// A run still in progress has no provenance.json yet: its config's clock says it is simulated, so a study of simulated
// runs stays one of simulated runs (before, the running one counted as real time and every other row was marked).
TEST(Compare, ARunWithoutProvenanceTakesItsClockFromItsConfig) {
  const fs::path root = freshDir("ClockFromConfig");
  RunSpec a{"sim", "dense", "none", false, {{10, 0.5, 100, 1}}};
  RunSpec b{"sim", "x", "topk", false, {{10, 0.5, 10, 1}}};
  a.simulated = b.simulated = true;
  writeRun(root, a);
  const fs::path running = writeRun(root, b);
  fs::remove(running / "provenance.json");
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 2u) << joined(w);
  const std::string md = toMarkdown(compare(runs, {}, w));
  EXPECT_NE(md.find("| sim step ms |"), std::string::npos) << md;
  EXPECT_EQ(md.find("(simulated time)"), std::string::npos) << md;
}

TEST(Compare, SimulatedTimesAreLabelledAsSuch) {
  const fs::path root = freshDir("SimulatedLabels");
  RunSpec a{"all", "dense", "none", false, {{10, 0.5, 100, 1}}};
  RunSpec b{"all", "x", "topk", false, {{10, 0.5, 10, 1}}};
  a.simulated = b.simulated = true;
  writeRun(root, a);
  writeRun(root, b);
  RunSpec c{"mixed", "dense", "none", false, {{10, 0.5, 100, 1}}};
  RunSpec d{"mixed", "x", "topk", false, {{10, 0.5, 10, 1}}};
  d.simulated = true;
  writeRun(root, c);
  writeRun(root, d);
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 4u) << joined(w);
  const Comparison cmp = compare(runs, {}, w);
  const std::string md = toMarkdown(cmp);
  // All simulated: the header says so once, the rows are plain.
  EXPECT_NE(md.find("| sim step ms |"), std::string::npos) << md;
  EXPECT_NE(md.find("times are simulated seconds on the modeled cluster"), std::string::npos) << md;
  // Mixed: only the simulated row is marked, and the note warns against comparing.
  EXPECT_NE(md.find("| x (simulated time) |"), std::string::npos) << md;
  EXPECT_EQ(md.find("| dense (simulated time) |"), std::string::npos) << md;
  EXPECT_NE(md.find("their times do not compare with the real-time rows'"), std::string::npos) << md;
  const std::string csv = toCsv(cmp);
  EXPECT_NE(csv.find(",real_time,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",simulated,"), std::string::npos) << csv;
  const auto json = parseJson(toJson(cmp, w));
  ASSERT_TRUE(json);
  std::set<std::string> clocks;
  for (const auto& study : json->at("studies"))
    for (const auto& row : study.at("rows")) clocks.insert(getString(row, "clock").value_or(""));
  EXPECT_TRUE(clocks.contains("simulated")) << dumpJson(*json);
  EXPECT_NE(provenanceTableMarkdown(runs).find("simulated"), std::string::npos);
}

TEST(Compare, StalenessFromTheReservedFields) {
  const fs::path root = freshDir("Staleness");
  const fs::path dir = writeRun(root, {"s", "async", "none", false, {}});
  // tau histogram 0:10 1:50 2:30 4:10 -> median 1, p90 2 (nearest rank); mean and max as recorded.
  appendText(dir / "metrics.jsonl",
             "{\"step\":100,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":1000,\"staleness_mean\":1.4,"
             "\"staleness_max\":4,\"staleness_hist_0\":10,\"staleness_hist_1\":50,\"staleness_hist_2\":30,"
             "\"staleness_hist_4\":10}\n");
  const fs::path hist_only = writeRun(root, {"s", "hist-only", "topk", false, {}});
  appendText(hist_only / "metrics.jsonl",
             "{\"step\":100,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":10,\"staleness_hist_0\":1,"
             "\"staleness_hist_3\":3,\"staleness_hist_x\":5}\n");
  std::vector<std::string> w;
  const Comparison c = compare(loadRuns({root}, w), {}, w);
  const CompareRow& a = row(c.studies[0], "async");
  ASSERT_TRUE(a.staleness);
  EXPECT_DOUBLE_EQ(a.staleness->mean, 1.4);
  EXPECT_DOUBLE_EQ(a.staleness->max, 4);
  EXPECT_EQ(a.staleness->p50, 1);
  EXPECT_EQ(a.staleness->p90, 2);
  const CompareRow& h = row(c.studies[0], "hist-only");
  ASSERT_TRUE(h.staleness);
  EXPECT_DOUBLE_EQ(h.staleness->mean, (0 * 1 + 3 * 3) / 4.0);  // from the histogram when not recorded
  EXPECT_DOUBLE_EQ(h.staleness->max, 3);
  EXPECT_TRUE(anyContains(w, "metrics.jsonl:1:", "'staleness_hist_x'")) << joined(w);
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("| staleness |"), std::string::npos) << md;
  EXPECT_NE(md.find("mean 1.40, max 4, p50 1, p90 2"), std::string::npos) << md;
}

// At hundreds of workers most pushes can be staler than the histogram's last bucket: a percentile there is shown as a
// bound (">= 64") in markdown, flagged in JSON and left empty in CSV, where it used to vanish without a word.
TEST(Compare, StalenessPercentilesPastTheHistogramAreBounds) {
  const fs::path root = freshDir("StalenessOverflow");
  const fs::path dir = writeRun(root, {"s", "async", "none", false, {}});
  // 100 pushes: 30 at tau 5, 70 past the buckets -> p50 and p90 both beyond.
  appendText(dir / "metrics.jsonl",
             "{\"step\":100,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":1000,\"staleness_mean\":90,"
             "\"staleness_max\":255,\"staleness_hist_5\":30,\"staleness_hist_overflow\":70}\n");
  const fs::path half = writeRun(root, {"s", "half", "topk", false, {}});
  // 100 pushes: 60 at tau 2, 40 past: p50 2, p90 beyond.
  appendText(half / "metrics.jsonl",
             "{\"step\":100,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":10,\"staleness_mean\":30,"
             "\"staleness_max\":100,\"staleness_hist_2\":60,\"staleness_hist_overflow\":40}\n");
  std::vector<std::string> w;
  const Comparison c = compare(loadRuns({root}, w), {}, w);
  const CompareRow& a = row(c.studies[0], "async");
  ASSERT_TRUE(a.staleness);
  EXPECT_TRUE(a.staleness->p50_beyond && a.staleness->p90_beyond);
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("mean 90.0, max 255, p50 >= 64, p90 >= 64"), std::string::npos) << md;
  EXPECT_NE(md.find("mean 30.0, max 100, p50 2, p90 >= 64"), std::string::npos) << md;
  const auto json = parseJson(toJson(c, w));
  ASSERT_TRUE(json);
  bool flagged = false;
  for (const auto& r : json->at("studies").at(0).at("rows"))
    if (getString(r, "variant") == "async") flagged = r.at("staleness").at("p90_at_least").get<bool>();
  EXPECT_TRUE(flagged) << dumpJson(*json);
}

// Records that say how many buckets they kept (staleness_buckets, 1024 since 64 left every percentile of a 256-worker
// parameter server past them) are read with their own bound; tau past 64 are buckets like any other.
TEST(Compare, StalenessBucketsAreTheRecordsOwn) {
  const fs::path root = freshDir("StalenessBuckets");
  const fs::path dir = writeRun(root, {"s", "w256", "none", false, {}});
  // 100 pushes: 50 at tau 250, 40 at 300, 10 past 1024 -> p50 250, p90 300, exact.
  appendText(dir / "metrics.jsonl",
             "{\"step\":100,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":1000,\"staleness_mean\":400,"
             "\"staleness_max\":2000,\"staleness_hist_250\":50,\"staleness_hist_300\":40,"
             "\"staleness_hist_overflow\":10,\"staleness_buckets\":1024}\n");
  const fs::path over = writeRun(root, {"s", "w4096", "none", false, {}});
  appendText(over / "metrics.jsonl",
             "{\"step\":100,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":1000,\"staleness_mean\":3000,"
             "\"staleness_max\":4000,\"staleness_hist_7\":5,\"staleness_hist_overflow\":95,"
             "\"staleness_buckets\":1024}\n");
  std::vector<std::string> w;
  const Comparison c = compare(loadRuns({root}, w), {}, w);
  EXPECT_TRUE(w.empty()) << joined(w);
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("mean 400, max 2000, p50 250, p90 300"), std::string::npos) << md;
  EXPECT_NE(md.find("mean 3000, max 4000, p50 >= 1024, p90 >= 1024"), std::string::npos) << md;
  // Every push past the buckets: bounds still, where the empty histogram hid the percentiles.
  const fs::path all = writeRun(root, {"s", "w8192", "none", false, {}});
  appendText(all / "metrics.jsonl",
             "{\"step\":100,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":1000,\"staleness_mean\":6000,"
             "\"staleness_max\":8000,\"staleness_hist_overflow\":100,\"staleness_buckets\":1024}\n");
  const std::string md2 = toMarkdown(compare(loadRuns({root}, w), {}, w));
  EXPECT_NE(md2.find("mean 6000, max 8000, p50 >= 1024, p90 >= 1024"), std::string::npos) << md2;
}

// A parameter server's wire bytes are both directions (result_writer.h): a record with push_ and pull_bytes_per_worker
// is read as written; one from before them (wire_bytes_per_worker = the mean of worker<w>_bytes_out, the pushes alone)
// is recounted from its per-worker counts and says so, and the ratio against a sync ring is of all the traffic.
TEST(Compare, AParameterServersWireBytesCountItsPulls) {
  const fs::path root = freshDir("PushPull");
  // A 4-worker ring: 1.5 gradients of 1000 bytes per worker and step.
  writeRun(root, {"s", "sync", "none", false, {{10, 0.8, 15000, 1}}});
  const fs::path now = writeRun(root, {"s", "ps-now", "none", false, {}});
  appendText(now / "metrics.jsonl",
             "{\"step\":10,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":20000,\"push_bytes_per_worker\":10000,"
             "\"pull_bytes_per_worker\":10000,\"worker0_bytes_out\":10000,\"worker0_bytes_in\":10000}\n");
  const fs::path before = writeRun(root, {"s", "ps-before", "none", false, {}});
  appendText(before / "metrics.jsonl",
             "{\"step\":5,\"test_accuracy\":0.5,\"wire_bytes_per_worker\":5000,\"worker0_bytes_out\":5000,"
             "\"worker0_bytes_in\":4000,\"worker1_bytes_out\":5000,\"worker1_bytes_in\":6000}\n"
             "{\"step\":10,\"test_accuracy\":0.8,\"wire_bytes_per_worker\":10000,\"worker0_bytes_out\":10000,"
             "\"worker0_bytes_in\":9000,\"worker1_bytes_out\":10000,\"worker1_bytes_in\":11000}\n");
  std::vector<std::string> w;
  CompareOptions o;
  o.target = 0.7;
  o.baseline = "sync";
  const Comparison c = compare(loadRuns({root}, w), o, w);
  ASSERT_EQ(c.studies.size(), 1u);
  const StudyTable& t = c.studies[0];
  EXPECT_FALSE(row(t, "sync").push_bytes);
  for (const std::string v : {"ps-now", "ps-before"}) {
    const CompareRow& r = row(t, v);
    ASSERT_TRUE(r.wire_bytes && r.push_bytes && r.pull_bytes && r.ratio) << v;
    EXPECT_DOUBLE_EQ(*r.wire_bytes, 20000) << v;
    EXPECT_DOUBLE_EQ(*r.push_bytes, 10000) << v;
    EXPECT_DOUBLE_EQ(*r.pull_bytes, 10000) << v;
    EXPECT_DOUBLE_EQ(*r.ratio, 0.75) << v;  // not the 1.5 of the pushes alone
  }
  // Bytes to target, interpolated between the recounted points (10000 at accuracy 0.5, 20000 at 0.8).
  ASSERT_TRUE(row(t, "ps-before").to_target);
  EXPECT_NEAR(row(t, "ps-before").to_target->wire_bytes, 10000 + (0.2 / 0.3) * 10000, 1e-6);
  std::string notes;
  for (const auto& n : t.notes) notes += n + "\n";
  EXPECT_NE(notes.find("`ps-before`: recorded when a parameter server's wire_bytes_per_worker counted the workers' "
                       "pushes alone"),
            std::string::npos)
      << notes;
  EXPECT_EQ(notes.find("`ps-now`"), std::string::npos) << notes;
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("| push / pull MB/worker |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0.01 / 0.01 |"), std::string::npos) << md;
  EXPECT_NE(md.find("both directions for a parameter server"), std::string::npos) << md;
  const std::string csv = toCsv(c);
  EXPECT_NE(csv.find(",push_bytes_per_worker,pull_bytes_per_worker,"), std::string::npos) << csv;
  const std::string json = toJson(c, {});
  EXPECT_NE(json.find("\"push_bytes_per_worker\": 10000"), std::string::npos) << json;
}

// ---- Broken folders: every problem a warning naming file and line, the rest still read.

TEST(CompareRobustness, MalformedAndTruncatedMetricsAreReportedAndSkipped) {
  const fs::path root = freshDir("Malformed");
  const fs::path dir = writeRun(root, {"s", "v", "none", false, {{100, 0.5, 1000, 1.0}}});
  const fs::path metrics = dir / "metrics.jsonl";
  appendText(metrics,
             "this is not json\n"                                                         // line 2
             "{\"step\":200,\"wire_bytes_per_worker\":2000}\n"                            // 3: no accuracy
             "{\"step\":200,\"test_accuracy\":1.5,\"wire_bytes_per_worker\":2000}\n"      // 4: out of range
             "{\"step\":50,\"test_accuracy\":0.6,\"wire_bytes_per_worker\":2000}\n"       // 5: step backwards
             "{\"step\":200,\"test_accuracy\":0.6,\"wire_bytes_per_worker\":500}\n"       // 6: bytes backwards
             "{\"step\":200,\"test_accuracy\":0.6,\"wire_bytes_per_worker\":\"lots\"}\n"  // 7: not a number
             "\n"                                                                         // 8: blank, ignored
             "{\"step\":300,\"test_accuracy\":0.7,\"wire_bytes_per_worker\":3000,\"wall_s\":-1}\n"  // 9: good, bad wall
             "{\"step\":400,\"test_accuracy\":0.8,\"wire_bytes_per_wor");                           // 10: torn
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 1u);
  const std::string file = metrics.string();
  EXPECT_TRUE(anyContains(w, file + ":2: not a JSON object")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":3: no 'test_accuracy'; record skipped")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":4: 'test_accuracy' is 1.5, must be a number in [0, 1]")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":5: step 50 does not follow step 100")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":6: wire_bytes_per_worker 500 is less than")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":7: 'wire_bytes_per_worker' is \"lots\"")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":9: 'wall_s' is -1")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":10: torn last line (no newline)")) << joined(w);
  EXPECT_FALSE(anyContains(w, file + ":8:")) << joined(w);
  ASSERT_EQ(runs[0].points.size(), 2u);
  EXPECT_EQ(runs[0].points[1].step, 300);
  EXPECT_EQ(runs[0].points[1].line, 9);
  EXPECT_TRUE(std::isnan(runs[0].points[1].wall_s));
  // The good records still make a table.
  const Comparison c = compare(runs, {}, w);
  EXPECT_DOUBLE_EQ(*c.studies[0].rows[0].final_accuracy, 0.7);
}

// metrics.jsonl is read a line at a time: a stream larger than any results file is read whole (256 MiB) keeps every
// record, a line of junk longer than a record can be is skipped in bounded memory, and a file of bad lines makes a
// bounded number of warnings. (The whole-file read skipped such a stream outright: a long run lost every record.)
TEST(CompareRobustness, AMetricsStreamIsReadALineAtATime) {
  const fs::path root = freshDir("LongStream");
  const fs::path dir = writeRun(root, {"s", "v", "none", false, {{100, 0.5, 1000, 1.0}}});
  const fs::path metrics = dir / "metrics.jsonl";
  // 300 MiB of NULs without a newline (a hole: no disk), then a good record.
  const auto size = fs::file_size(metrics);
  fs::resize_file(metrics, size + (std::uintmax_t{300} << 20));
  appendText(metrics, "\n{\"step\":200,\"test_accuracy\":0.7,\"wire_bytes_per_worker\":2000}\n");
  for (int i = 0; i < 100; ++i) appendText(metrics, "junk\n");
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 1u);
  ASSERT_EQ(runs[0].points.size(), 2u) << joined(w);
  EXPECT_EQ(runs[0].points[1].step, 200);
  EXPECT_EQ(runs[0].points[1].line, 3);
  const std::string file = metrics.string();
  EXPECT_TRUE(anyContains(w, file + ":2: a line longer than 16777216 bytes, no record; skipped")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":4: not a JSON object")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ":22: not a JSON object")) << joined(w);  // the 20th warning
  EXPECT_FALSE(anyContains(w, file + ":23:")) << joined(w);
  EXPECT_TRUE(anyContains(w, file + ": 81 more bad line(s) or field(s) after the first 20 reported")) << joined(w);
  fs::remove_all(root);  // 300 MiB of file size, even sparse
}

// A hand-made config whose computed default is no value of its field (a bandwidth holding a newline, copied into a
// link override's) is compared as written, with a warning, never an end of compare.
TEST(CompareRobustness, AConfigWhoseDefaultsCannotBeFilledIsComparedAsWritten) {
  const fs::path root = freshDir("BadDefaults");
  const fs::path dir = writeRun(root, {"s", "v", "none", false, {{100, 0.5, 1000, 1.0}}});
  appendText(dir / "config.textproto", "link {\n  bandwidth: \"a\\nb\"\n  overrides { src: 0 dst: 1 }\n}\n");
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_TRUE(runs[0].has_config) << joined(w);
  EXPECT_TRUE(anyContains(w, "config.textproto: its defaults could not be filled")) << joined(w);
  const Comparison c = compare(runs, {}, w);
  EXPECT_DOUBLE_EQ(*c.studies[0].rows[0].final_accuracy, 0.5);
}

// A metrics.jsonl that is no regular file (a FIFO, a link to /dev/zero) would be read forever: refused at once.
TEST(CompareRobustness, AMetricsStreamThatNeverEndsIsNotRead) {
  const fs::path root = freshDir("EndlessStream");
  const fs::path fifo = writeRun(root, {"s", "fifo", "none", false, {{100, 0.5, 1000, 1.0}}});
  const fs::path zero = writeRun(root, {"s", "zero", "none", false, {{100, 0.5, 1000, 1.0}}});
  fs::remove(fifo / "metrics.jsonl");
  ASSERT_EQ(::mkfifo((fifo / "metrics.jsonl").c_str(), 0600), 0);
  fs::remove(zero / "metrics.jsonl");
  fs::create_symlink("/dev/zero", zero / "metrics.jsonl");
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& r : runs) EXPECT_TRUE(r.points.empty());
  EXPECT_TRUE(anyContains(w, (fifo / "metrics.jsonl").string() + ": not a regular file")) << joined(w);
  EXPECT_TRUE(anyContains(w, (zero / "metrics.jsonl").string() + ": not a regular file")) << joined(w);
}

TEST(CompareRobustness, MissingAndBrokenFilesAreWarnings) {
  const fs::path root = freshDir("MissingFiles");
  const fs::path only_status = root / "s" / "only-status";
  fs::create_directories(only_status);
  writeFileAtomic(only_status / "status.json", "{\"state\":\"completed\"}\n");
  const fs::path garbage = root / "s" / "garbage";
  fs::create_directories(garbage);
  writeFileAtomic(garbage / "status.json", "{\"state\":");
  writeFileAtomic(garbage / "provenance.json", "{\"plugins\":[{\"kind\":");
  writeFileAtomic(garbage / "config.textproto", "study: \"s\"\nworkload {\n  name: \"mlp\"\n");
  writeFileAtomic(garbage / "metrics.jsonl", "");
  const fs::path odd_state = root / "s" / "odd";
  fs::create_directories(odd_state);
  writeFileAtomic(odd_state / "status.json", "{\"state\":\"exploded\"}");
  // Untrusted files: nested a million levels deep, or with a key twice (which of the two would count?).
  std::string deep;
  for (int i = 0; i < 1000000; ++i) deep += "{\"a\":[";
  writeFileAtomic(odd_state / "provenance.json", deep);
  writeFileAtomic(odd_state / "metrics.jsonl", "{\"step\":1,\"test_accuracy\":0.5,\"step\":2}\n");
  std::vector<std::string> w;
  const auto runs = loadRuns({root, root / "nonexistent"}, w);
  ASSERT_EQ(runs.size(), 3u) << joined(w);
  const std::string odd = odd_state.string();
  EXPECT_TRUE(anyContains(w, odd + "/provenance.json: not a JSON object (nested deeper than 64 levels)")) << joined(w);
  EXPECT_TRUE(anyContains(w, odd + "/metrics.jsonl:1: not a JSON object (duplicate key \"step\" in one object)"))
      << joined(w);
  const std::string os = only_status.string(), g = garbage.string();
  EXPECT_TRUE(anyContains(w, os + "/metrics.jsonl: missing; the variant has no records")) << joined(w);
  EXPECT_TRUE(anyContains(w, os + "/config.textproto: missing")) << joined(w);
  EXPECT_TRUE(anyContains(w, os + "/provenance.json: missing")) << joined(w);
  EXPECT_TRUE(anyContains(w, g + "/status.json:1: not a status object")) << joined(w);
  EXPECT_TRUE(anyContains(w, g + "/provenance.json: not a JSON object (parse error at line 1, column 21")) << joined(w);
  EXPECT_TRUE(anyContains(w, g + "/config.textproto:4:1: Expected identifier")) << joined(w);
  EXPECT_TRUE(anyContains(w, "odd/status.json:1: unknown state \"exploded\"")) << joined(w);
  EXPECT_TRUE(anyContains(w, (root / "nonexistent").string() + ": no such directory")) << joined(w);
  const Comparison c = compare(runs, {}, w);
  for (const auto& r : c.studies[0].rows) EXPECT_EQ(r.records, 0);
  // Variants without records sort last and print as dashes, never as numbers.
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("| garbage | unknown | - | - |"), std::string::npos) << md;
}

// Every prefix of every file, and every file with one byte flipped: loadRun must warn, never throw or crash (the
// sanitizer build checks the "never crash" part), and never invent records.
TEST(CompareRobustness, EveryTruncationAndByteFlipIsSurvivable) {
  const fs::path root = freshDir("Truncations");
  const fs::path dir = writeRun(root, knownStudy()[0]);
  for (const char* name : {"config.textproto", "provenance.json", "metrics.jsonl", "status.json"}) {
    const fs::path file = dir / name;
    const std::string original = readText(file);
    for (std::size_t n = 0; n <= original.size(); ++n) {
      writeFileAtomic(file, original.substr(0, n));
      std::vector<std::string> w;
      RunData run;
      ASSERT_NO_THROW(run = loadRun(dir, w)) << name << " cut at " << n;
      EXPECT_LE(run.points.size(), 3u);
      (void)compare({run}, {}, w);
    }
    for (std::size_t i = 0; i < original.size(); ++i) {
      std::string flipped = original;
      flipped[i] = static_cast<char>(flipped[i] ^ 0x5A);
      writeFileAtomic(file, flipped);
      std::vector<std::string> w;
      RunData run;
      ASSERT_NO_THROW(run = loadRun(dir, w)) << name << " flipped at " << i;
      (void)toMarkdown(compare({run}, {}, w));
    }
    writeFileAtomic(file, original);
  }
  std::vector<std::string> w;
  EXPECT_EQ(loadRun(dir, w).points.size(), 3u);
  EXPECT_TRUE(w.empty()) << joined(w);
}

TEST(CompareRobustness, RunningVariantIsMarkedAndKept) {
  const fs::path root = freshDir("Running");
  RunSpec s{"s", "live", "none", false, {{10, 0.4, 100, 1}}};
  s.state = "running";
  writeRun(root, s);
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  EXPECT_TRUE(anyContains(w, "status says running")) << joined(w);
  const Comparison c = compare(runs, {}, w);
  EXPECT_EQ(c.studies[0].rows[0].state, "running");
  EXPECT_NE(toMarkdown(c).find("running/killed"), std::string::npos);
}

// status.json names the process while "running" (results/result_writer.h): a run whose process on this host is gone
// was killed without a word, and compare says so; one whose process is alive is still running; one on another host
// cannot be asked.
TEST(CompareRobustness, RunningVariantWhoseProcessIsGoneIsSaidKilled) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);  // reaped: its pid names no process now
  const fs::path root = freshDir("RunningGone");
  const auto running = [&](const std::string& variant, int64_t pid, const std::string& host) {
    RunSpec s{"s", variant, "none", false, {{10, 0.4, 100, 1}}};
    s.state = "running";
    const fs::path dir = writeRun(root, s);
    writeFileAtomic(dir / "status.json", "{\"state\":\"running\",\"records\":1,\"pid\":" + std::to_string(pid) +
                                             ",\"host\":\"" + host + "\"}\n");
  };
  running("gone", child, hostName());
  running("alive", ::getpid(), hostName());
  running("elsewhere", child, hostName() + "-another");
  // Which process the pid named (boot id, start ticks: result_writer.h): this one, so still running; another start or
  // another boot, so the pid was reused and the run's process is gone.
  const auto ticks = processStartTicks(::getpid());
  ASSERT_TRUE(ticks);
  const auto named = [&](const std::string& variant, const std::string& boot, unsigned long long start) {
    RunSpec s{"s", variant, "none", false, {{10, 0.4, 100, 1}}};
    s.state = "running";
    const fs::path dir = writeRun(root, s);
    writeFileAtomic(dir / "status.json", "{\"state\":\"running\",\"records\":1,\"pid\":" + std::to_string(::getpid()) +
                                             ",\"host\":\"" + hostName() + "\",\"boot_id\":\"" + boot +
                                             "\",\"pid_start\":" + std::to_string(start) + "}\n");
  };
  named("same", bootId(), *ticks);
  named("reused", bootId(), *ticks + 1);
  named("rebooted", "00000000-0000-0000-0000-000000000000", *ticks);
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  const std::string pid = std::to_string(child);
  EXPECT_TRUE(anyContains(w, "gone: status says running, but its process (pid " + pid + " on this host) is gone"))
      << joined(w);
  EXPECT_TRUE(anyContains(w, "alive: still running (pid " + std::to_string(::getpid()) + " on this host)"))
      << joined(w);
  EXPECT_TRUE(anyContains(w, "elsewhere: status says running (still running, or killed)")) << joined(w);
  const std::string table = toMarkdown(compare(runs, {}, w));
  EXPECT_NE(table.find("running (pid " + pid + " gone)"), std::string::npos) << table;
  EXPECT_NE(table.find("| **alive** (baseline) | running |"), std::string::npos) << table;
  EXPECT_NE(table.find("| elsewhere | running/killed |"), std::string::npos) << table;
  EXPECT_NE(table.find("| same | running |"), std::string::npos) << table;
  EXPECT_NE(table.find("| reused | running (pid " + std::to_string(::getpid()) + " gone) |"), std::string::npos)
      << table;
  EXPECT_NE(table.find("| rebooted | running (pid " + std::to_string(::getpid()) + " gone) |"), std::string::npos)
      << table;
}

// The writer itself names the process while running, and no longer once the run ended.
TEST(CompareRobustness, TheWriterNamesItsProcessWhileRunning) {
  const fs::path root = freshDir("RunningPid");
  ResultWriter w(root, "s", "v");
  const auto status = [&] { return readText(w.dir() / "status.json"); };
  EXPECT_NE(status().find("\"pid\":" + std::to_string(::getpid())), std::string::npos) << status();
  EXPECT_NE(status().find("\"host\":\"" + hostName() + "\""), std::string::npos) << status();
  EXPECT_NE(status().find("\"boot_id\":\"" + bootId() + "\""), std::string::npos) << status();
  EXPECT_NE(status().find("\"pid_start\":" + std::to_string(*processStartTicks(::getpid()))), std::string::npos)
      << status();
  w.markCompleted();
  EXPECT_EQ(status().find("\"pid\""), std::string::npos) << status();
}

TEST(CompareRobustness, AFolderWithoutResultsIsAWarning) {
  const fs::path root = freshDir("Empty");
  std::vector<std::string> w;
  EXPECT_TRUE(loadRuns({root}, w).empty());
  EXPECT_TRUE(anyContains(w, root.string() + ": no result folders")) << joined(w);
}

// ---- Config mismatches.

TEST(ConfigMismatch, DifferentWorkloadsAndDataAreNamed) {
  const fs::path root = freshDir("Mismatch");
  RunSpec a{"s", "a", "none", false, {{10, 0.5, 10, 1}}};
  RunSpec b = a;
  b.variant = "b";
  RunSpec c = a;
  c.variant = "c";
  c.hidden = "512";
  c.batch_size = "64";
  writeRun(root, a);
  writeRun(root, b);
  writeRun(root, c);
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  const auto m = configMismatchWarnings(runs);
  ASSERT_EQ(m.size(), 2u) << joined(m);
  EXPECT_TRUE(anyContains(m, "different workloads", "s/c: workload.hidden_sizes=512 no workload.hidden_sizes=256"))
      << joined(m);
  EXPECT_TRUE(anyContains(m, "s/a, s/b: workload.name=\"mlp\" workload.hidden_sizes=256")) << joined(m);
  EXPECT_TRUE(anyContains(m, "different data", "data.batch_size=64")) << joined(m);
  // Same workload and data: nothing to say.
  const auto same = std::vector<RunData>(runs.begin(), runs.begin() + 2);
  EXPECT_TRUE(configMismatchWarnings(same).empty());
}

// A plugin file rebuilt between two runs of one study: each run's provenance holds the hash of the file it loaded,
// compare warns, and --provenance shows the short hash.
TEST(PluginHash, RecordedPerRunAndWarnedWhenTheFileChanged) {
  const fs::path root = freshDir("PluginHash");
  const fs::path plugin = root / "plugins" / "terse_compressor_mine.so";
  fs::create_directories(plugin.parent_path());
  fs::copy_file(TERSE_TEST_PLUGIN_FILE, plugin);
  RunSpec first("s", "first", "mine", false, {{100, 0.8, 1000, 1.0}});
  first.plugin_path = plugin.string();
  writeRun(root / "results", first);
  const std::string before = fileSha256Hex(plugin);
  EXPECT_EQ(before, sha256Hex(readText(plugin)));
  appendText(plugin, "rebuilt");
  RunSpec second = first;
  second.variant = "second";
  writeRun(root / "results", second);
  const std::string after = fileSha256Hex(plugin);
  ASSERT_NE(before, after);

  std::vector<std::string> w;
  const auto runs = loadRuns({root / "results"}, w);
  ASSERT_EQ(runs.size(), 2u);
  auto recorded = [](const RunData& r) { return getString(r.provenance->at("plugins").at(0), "sha256"); };
  EXPECT_EQ(recorded(runs[0]), before);
  EXPECT_EQ(recorded(runs[1]), after);

  const auto warnings = pluginHashWarnings(runs);
  ASSERT_EQ(warnings.size(), 1u);
  const std::string& m = warnings[0];
  EXPECT_NE(m.find("study s: compressor mine was loaded from 2 different files"), std::string::npos) << m;
  EXPECT_NE(m.find(before.substr(0, 12) + ": first ("), std::string::npos) << m;
  EXPECT_NE(m.find(after.substr(0, 12) + ": second ("), std::string::npos) << m;

  const std::string md = provenanceTableMarkdown(runs);
  EXPECT_NE(md.find("sha256 " + before.substr(0, 12) + ")"), std::string::npos) << md;
  EXPECT_EQ(md.find(before.substr(0, 13)), std::string::npos) << "shortened to 12 digits: " << md;
  // The file by name and origin, not by this machine's directories: the tables are committed and read elsewhere.
  EXPECT_NE(md.find("terse_compressor_mine.so [build tree], sha256 "), std::string::npos) << md;
  EXPECT_EQ(md.find(root.string()), std::string::npos) << md;
  const std::string csv = provenanceTableCsv(runs);
  EXPECT_NE(csv.find(after), std::string::npos) << csv;  // the full hash in the machine-readable table
  EXPECT_EQ(csv.find(root.string()), std::string::npos) << csv;
}

// The CPU a run measured its computation on is in its provenance and the --provenance table; runs of one study
// measured on different CPUs are warned about (their time columns compare machines), unless the FLOP model set the
// computation's time, or the runs predate the field.
TEST(CpuProvenance, RecordedAndWarnedWhenOneStudyMixesCpus) {
  const fs::path root = freshDir("CpuProvenance");
  RunSpec a("s", "a", "none", false, {{100, 0.8, 1000, 1.0}});
  a.cpu = "AMD EPYC (family 25 model 1, 2 logical CPUs, avx2)";
  RunSpec b = a;
  b.variant = "b";
  RunSpec c = a;
  c.variant = "c";
  c.cpu = "AMD EPYC (family 26 model 2, 2 logical CPUs, avx512f)";
  for (const auto& s : {a, b, c}) writeRun(root / "mixed", s);
  std::vector<std::string> w;
  const auto runs = loadRuns({root / "mixed"}, w);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(getString(*runs[2].provenance, "cpu"), c.cpu);
  const auto warnings = cpuWarnings(runs);
  ASSERT_EQ(warnings.size(), 1u) << joined(warnings);
  const std::string& m = warnings[0];
  for (const char* part : {"study s: computation was measured on 2 different CPUs",
                           "family 25 model 1, 2 logical CPUs, avx2): a (", ") b (", "avx512f): c ("})
    EXPECT_NE(m.find(part), std::string::npos) << part << " in " << m;
  const std::string md = provenanceTableMarkdown(runs);
  EXPECT_NE(md.find("| testhost, " + c.cpu + " |"), std::string::npos) << md;
  EXPECT_NE(provenanceTableCsv(runs).find(c.cpu), std::string::npos);

  // One CPU, or the FLOP model (times from the config alone), or runs from before the field: nothing to say.
  EXPECT_TRUE(cpuWarnings(std::vector<RunData>(runs.begin(), runs.begin() + 2)).empty());
  for (auto* s : {&a, &b, &c}) {
    s->simulated = true;
    s->flop_model = true;
  }
  for (const auto& s : {a, b, c}) writeRun(root / "flop", s);
  EXPECT_TRUE(cpuWarnings(loadRuns({root / "flop"}, w)).empty());
  a.cpu = b.cpu = "";
  for (const auto& s : {a, b}) writeRun(root / "old", s);
  EXPECT_TRUE(cpuWarnings(loadRuns({root / "old"}, w)).empty());
}

// The GEMM kernel of a run's models is in its provenance and the --provenance tables; runs of one study whose kernels
// differ are warned about (the kernel's summation order shows in the accuracies' last digits), unless they predate the
// field.
TEST(GemmProvenance, RecordedAndWarnedWhenOneStudyMixesKernels) {
  const fs::path root = freshDir("GemmProvenance");
  RunSpec a("s", "a", "none", false, {{100, 0.8, 1000, 1.0}});
  a.gemm = "terse-fixed-order-v1";
  RunSpec b = a;
  b.variant = "b";
  RunSpec c = a;
  c.variant = "c";
  c.gemm = "openblas Haswell (OpenBLAS 0.3.21 DYNAMIC_ARCH Haswell MAX_THREADS=64)";
  for (const auto& s : {a, b, c}) writeRun(root / "mixed", s);
  std::vector<std::string> w;
  const auto runs = loadRuns({root / "mixed"}, w);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(getString(*runs[0].provenance, "gemm"), a.gemm);
  EXPECT_EQ(getString(*runs[2].provenance, "gemm"), c.gemm);
  const auto warnings = gemmWarnings(runs);
  ASSERT_EQ(warnings.size(), 1u) << joined(warnings);
  const std::string& m = warnings[0];
  for (const char* part : {"study s: the models' matrix products came from 2 different GEMM kernels",
                           "openblas Haswell (OpenBLAS 0.3.21 DYNAMIC_ARCH Haswell MAX_THREADS=64): c (",
                           "terse-fixed-order-v1: a (", ") b ("})
    EXPECT_NE(m.find(part), std::string::npos) << part << " in " << m;
  // Kernels are not CPUs: the same CPU throughout, so no CPU warning.
  EXPECT_TRUE(cpuWarnings(runs).empty());
  const std::string md = provenanceTableMarkdown(runs);
  EXPECT_NE(md.find("| host, cpu, gemm |"), std::string::npos) << md;
  EXPECT_NE(md.find("| testhost, " + c.cpu + ", gemm " + c.gemm + " |"), std::string::npos) << md;
  EXPECT_NE(provenanceTableCsv(runs).find(c.gemm), std::string::npos);

  // One kernel, or runs from before the field: nothing to say; and the field is left out when empty.
  EXPECT_TRUE(gemmWarnings(std::vector<RunData>(runs.begin(), runs.begin() + 2)).empty());
  a.gemm = b.gemm = "";
  for (const auto& s : {a, b, c}) writeRun(root / "old", s);
  const auto old = loadRuns({root / "old"}, w);
  EXPECT_TRUE(gemmWarnings(old).empty());
  EXPECT_EQ(findMember(*old[0].provenance, "gemm"), nullptr);
  EXPECT_NE(provenanceTableMarkdown(old).find("| testhost, " + a.cpu + " |"), std::string::npos);
}

// Simulated runs of one study charged from tables that give a kernel two times (a rerun after a rebuild measured
// again; a user's study saw 156.0 against 145.8 us of compute a step for one variant's seeds): warned, naming the
// kernel, both times and runs. Tables that share no kernel, or agree on those they share, are fine.
TEST(CalibrationProvenance, WarnedWhenOneStudysTablesDisagree) {
  const fs::path root = freshDir("CalibrationProvenance");
  RunSpec a("s", "a", "none", false, {{100, 0.8, 1000, 1.0}});
  a.simulated = true;
  RunSpec b = a;
  b.variant = "b";
  RunSpec c = a;
  c.variant = "c";
  const auto table = [](const std::string& seconds) {
    return "{\"format\":\"terse-calibration-v1\",\"cpu\":\"x\",\"flags\":\"\",\"commit\":\"c\",\"seconds\":{" +
           seconds + "}}\n";
  };
  const fs::path da = writeRun(root / "mixed", a), db = writeRun(root / "mixed", b), dc = writeRun(root / "mixed", c);
  appendText(da / "calibration.json", table("\"fwd\":1.5e-4,\"enc topk\":2e-5"));
  appendText(db / "calibration.json", table("\"fwd\":1.5e-4,\"enc fp16\":1e-5"));  // agrees on fwd
  appendText(dc / "calibration.json", table("\"fwd\":1.4e-4,\"enc fp16\":1e-5"));
  std::vector<std::string> w;
  const auto runs = loadRuns({root / "mixed"}, w);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_TRUE(w.empty()) << joined(w);
  const auto warnings = calibrationWarnings(runs);
  ASSERT_EQ(warnings.size(), 1u) << joined(warnings);
  for (const char* part : {"study s: its simulated runs were charged from different calibration tables",
                           "kernel 'fwd' costs 0.00015 s in a and 0.00014 s in c", "simulation.calibration: "})
    EXPECT_NE(warnings[0].find(part), std::string::npos) << part << " in " << warnings[0];
  EXPECT_TRUE(calibrationWarnings(std::vector<RunData>(runs.begin(), runs.begin() + 2)).empty());
}

TEST(CpuProvenance, DescriptionFromCpuinfo) {
  // Two blocks of Linux's /proc/cpuinfo as an AMD Zen 5 guest shows them (fields trimmed).
  const std::string zen5 =
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
      "flags\t\t: fpu sse4_2 avx2 avx512f avx512bw\n\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n"
      "model name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx2 avx512f avx512bw\n";
  EXPECT_EQ(cpuDescriptionFrom(zen5), "AMD EPYC (family 26 model 2, 2 logical CPUs, avx512f)");
  // AVX2 without AVX-512; a flag that only starts like a wider one ("avx512_bf16" alone) does not count as avx512f.
  EXPECT_EQ(cpuDescriptionFrom("processor : 0\ncpu family : 6\nmodel : 85\nmodel name : Intel(R) Xeon(R) CPU\n"
                               "flags : sse4_2 avx2 avx512_bf16\n"),
            "Intel(R) Xeon(R) CPU (family 6 model 85, 1 logical CPU, avx2)");
  // No family (e.g. an ARM cpuinfo has none) and no known flag: the name and the count.
  EXPECT_EQ(cpuDescriptionFrom("processor : 0\nmodel name : Some Core\n"), "Some Core (1 logical CPU)");
  EXPECT_EQ(cpuDescriptionFrom(""), "unknown");
  EXPECT_EQ(cpuDescriptionFrom("garbage without colons\n\n::\n"), "unknown");
  EXPECT_NE(cpuDescription(), "");  // this machine's: "unknown" only where /proc/cpuinfo is unreadable
}

// Runs recorded before plugin hashes (or whose plugin file is gone) read as before: no hash, no warning.
TEST(PluginHash, FoldersWithoutHashesStillRead) {
  const fs::path root = freshDir("PluginHashOld");
  for (const auto& s : knownStudy()) writeRun(root, s);
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_FALSE(runs.empty());
  for (const auto& r : runs) {
    const Json& pl = r.provenance->at("plugins").at(0);
    EXPECT_FALSE(getString(pl, "sha256"));
    const std::string error = getString(pl, "sha256_error").value_or("");
    EXPECT_NE(error.find("cannot read /plugins/"), std::string::npos) << error;
  }
  EXPECT_TRUE(pluginHashWarnings(runs).empty());
  const std::string md = provenanceTableMarkdown(runs);
  EXPECT_EQ(md.find(", sha256 "), std::string::npos) << md;
}

}  // namespace
}  // namespace terse::results
