// Repeated seeds in `terse compare` (compute.h "Repeats", stats.h): the t quantiles, interval, Welch and paired
// p-values against values worked out by hand from the closed forms of Student's t for 1, 2 and 4 degrees of freedom,
// seed-<N> folders read back as one row, the "within noise" marks with the test behind them (paired when a row ran the
// baseline's seeds, else Welch's), and the plot's mean line with its band.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "results/compare.h"
#include "results/compare/plot.h"
#include "results/compare/stats.h"
#include "tests/results/results_fixture.h"

namespace terse::results {
namespace {

using testing::freshDir;
using testing::RunSpec;
using testing::writeRun;

// F(t) for 4 degrees of freedom: 1/2 + (3/8) u (1 - t^2 / (12 (1 + t^2 / 4))), u = t / sqrt(1 + t^2 / 4).
double cdf4(double t) {
  const double q = 1 + t * t / 4;
  return 0.5 + 0.375 * (t / std::sqrt(q)) * (1 - t * t / (12 * q));
}

TEST(Stats, StudentTAgainstClosedForms) {
  // 1 df (Cauchy): t = tan(pi (p - 1/2)); 2 df: t = a sqrt(2 / (1 - a^2)), a = 2p - 1.
  EXPECT_NEAR(studentTQuantile(0.975, 1), std::tan(std::numbers::pi * 0.475), 1e-9);
  EXPECT_NEAR(studentTQuantile(0.975, 2), 0.95 * std::sqrt(2 / (1 - 0.95 * 0.95)), 1e-9);
  EXPECT_NEAR(studentTQuantile(0.975, 2), 4.302652729749463, 1e-9);
  EXPECT_NEAR(cdf4(studentTQuantile(0.975, 4)), 0.975, 1e-12);
  EXPECT_NEAR(studentTQuantile(0.975, 4), 2.7764451051977934, 1e-9);
  for (double t : {-3.0, -0.5, 0.0, 0.7, 2.0, 10.0}) {
    EXPECT_NEAR(studentTCdf(t, 1), 0.5 + std::atan(t) / std::numbers::pi, 1e-12) << t;
    EXPECT_NEAR(studentTCdf(t, 2), 0.5 + t / (2 * std::sqrt(2 + t * t)), 1e-12) << t;
    EXPECT_NEAR(studentTCdf(t, 4), cdf4(t), 1e-12) << t;
  }
  // Large df approaches the normal's 1.959964.
  EXPECT_NEAR(studentTQuantile(0.975, 1e6), 1.959964, 1e-5);
  EXPECT_EQ(studentTQuantile(0.5, 3), 0);
  EXPECT_TRUE(std::isnan(studentTQuantile(1, 3)));
  EXPECT_TRUE(std::isnan(studentTCdf(1, 0)));
}

TEST(Stats, MeanIntervalByHand) {
  // The zoo's dense accuracies at seeds 1-3: mean 0.872167, s = 6.5064e-4, half-width t(0.975, 2) s / sqrt(3).
  const std::vector<double> dense = {0.8728, 0.8722, 0.8715};
  const MeanInterval m = meanInterval(dense);
  EXPECT_EQ(m.n, 3);
  EXPECT_NEAR(m.mean, 0.8721666666666668, 1e-15);
  const double s =
      std::sqrt((std::pow(0.8728 - m.mean, 2) + std::pow(0.8722 - m.mean, 2) + std::pow(0.8715 - m.mean, 2)) / 2);
  ASSERT_TRUE(m.half_width);
  EXPECT_NEAR(*m.half_width, 4.302652729749463 * s / std::sqrt(3.0), 1e-12);
  EXPECT_NEAR(*m.half_width, 0.0016162811241750396, 1e-12);
  EXPECT_FALSE(meanInterval(std::vector<double>{0.5}).half_width) << "one seed has no interval";
  EXPECT_EQ(meanInterval(std::vector<double>{}).n, 0);
}

TEST(Stats, WelchByHand) {
  // {1, 2, 3} vs {4, 5, 6}: s^2 = 1 on both sides, t = -3 / sqrt(2/3) = -3.674, df = (2/3)^2 / (2 (1/3)^2 / 2) = 4,
  // p = 2 (1 - F_4(3.674)) = 0.02131.
  const std::vector<double> a = {1, 2, 3}, b = {4, 5, 6};
  const auto p = welchP(a, b);
  ASSERT_TRUE(p);
  EXPECT_NEAR(*p, 2 * (1 - cdf4(3 / std::sqrt(2.0 / 3))), 1e-12);
  EXPECT_NEAR(*p, 0.02131164112875661, 1e-9);
  EXPECT_EQ(*welchP(b, a), *p);
  // No spread on either side (deterministic bytes): equal or not.
  EXPECT_EQ(*welchP(std::vector<double>{7, 7}, std::vector<double>{7, 7, 7}), 1.0);
  EXPECT_EQ(*welchP(std::vector<double>{7, 7}, std::vector<double>{8, 8}), 0.0);
  EXPECT_FALSE(welchP(std::vector<double>{1}, b)) << "one seed cannot be tested";
}

// For 2 degrees of freedom the two-sided p is closed: 2 (1 - F_2(|t|)) = 1 - |t| / sqrt(2 + t^2).
double twoSidedP2(double t) {
  return 1 - std::fabs(t) / std::sqrt(2 + t * t);
}

// A user's trial: dense-fusion's and dense-fifo's seconds to target at seeds 1, 2, 3. Fusion is 8.8% faster at every
// seed, but the seeds' times differ by 7.7% (standard deviation over mean), shared by both variants.
const std::vector<double> kFusion = {0.6861, 0.7995, 0.7577}, kFifo = {0.7519, 0.8763, 0.8304};

TEST(Stats, PairedByHand) {
  // d = {1, 2, 3} - {0, 0, 0}: mean 2, s_d = 1, t = 2 / (1 / sqrt(3)) = 3.464, df 2.
  const auto p = pairedP(std::vector<double>{1, 2, 3}, std::vector<double>{0, 0, 0});
  ASSERT_TRUE(p);
  EXPECT_NEAR(*p, twoSidedP2(2 * std::sqrt(3.0)), 1e-12);
  EXPECT_NEAR(*p, 0.07417990022744853, 1e-9);
  // Symmetric in the sides; only the differences count, not where the pairs sit.
  EXPECT_EQ(*pairedP(std::vector<double>{0, 0, 0}, std::vector<double>{1, 2, 3}), *p);
  EXPECT_NEAR(*pairedP(std::vector<double>{11, 102, 1003}, std::vector<double>{10, 100, 1000}), *p, 1e-12);
  EXPECT_FALSE(pairedP(std::vector<double>{1}, std::vector<double>{2})) << "one pair cannot be tested";
  EXPECT_FALSE(pairedP(std::vector<double>{1, 2, 3}, std::vector<double>{1, 2})) << "pairs need equal sizes";
}

// The trial's numbers: Welch's test calls the 8.8% noise, the paired test does not, and the sign of the mean
// difference says fusion is the faster.
TEST(Stats, PairedSeesWhatWelchCannot) {
  const auto welch = welchP(kFusion, kFifo);
  ASSERT_TRUE(welch);
  EXPECT_GT(*welch, kNoiseAlpha) << "unpaired: within the seed-to-seed noise";
  EXPECT_NEAR(*welch, 0.218, 0.005);
  const auto paired = pairedP(kFusion, kFifo);
  ASSERT_TRUE(paired);
  EXPECT_LT(*paired, kNoiseAlpha) << "paired: a difference";
  std::vector<double> d;
  for (std::size_t i = 0; i < kFusion.size(); ++i) d.push_back(kFusion[i] - kFifo[i]);
  const MeanInterval md = meanInterval(d);
  EXPECT_LT(md.mean, 0) << "fusion takes less time";
  // t = mean(d) / (s_d / sqrt(3)), s_d = half-width / t(0.975, 2) * sqrt(3).
  const double s_d = *md.half_width / studentTQuantile(0.975, 2) * std::sqrt(3.0);
  EXPECT_NEAR(*paired, twoSidedP2(md.mean / (s_d / std::sqrt(3.0))), 1e-12);
  EXPECT_NEAR(*paired, 0.00199, 0.00001);
}

// Every per-seed difference the same (deterministic bytes, or a fixed offset): the differences have no spread, so t
// is 0 / 0 or infinite. The answer is p = 1 for no difference and 0 for any other, never NaN.
TEST(Stats, PairedWithoutSpreadInTheDifferences) {
  // Exact in binary: every difference is 0.5 to the last bit.
  const auto offset = pairedP(std::vector<double>{1.5, 2.5, 3.75}, std::vector<double>{1.0, 2.0, 3.25});
  ASSERT_TRUE(offset);
  EXPECT_EQ(*offset, 0.0);
  const auto same = pairedP(std::vector<double>{7, 8, 9}, std::vector<double>{7, 8, 9});
  ASSERT_TRUE(same);
  EXPECT_EQ(*same, 1.0);
  // An offset of 0.1 differs by rounding in the last bits from seed to seed: a finite, tiny p rather than NaN.
  const std::vector<double> base = {0.7, 0.8, 0.9};
  std::vector<double> shifted;
  for (double b : base) shifted.push_back(b + 0.1);
  const auto rounded = pairedP(shifted, base);
  ASSERT_TRUE(rounded);
  EXPECT_FALSE(std::isnan(*rounded));
  EXPECT_LT(*rounded, 1e-6);
}

// The baseline's samples are matched to the row's by seed, whatever order the folders were read in.
TEST(Stats, PairsBySeedNotByOrder) {
  SeedStats base, row;
  base.samples = {kFifo[2], kFifo[0], kFifo[1]};
  base.seeds = {3, 1, 2};
  row.samples = kFusion;
  row.seeds = {1, 2, 3};
  testAgainstBaseline(row, base);
  ASSERT_TRUE(row.p_vs_baseline);
  EXPECT_EQ(row.test, NoiseTest::kPaired);
  EXPECT_EQ(*row.p_vs_baseline, *pairedP(kFusion, kFifo));
  // A seed on one side only, a run that is not a repeat (no seed), or a seed twice: Welch's test on what each has.
  for (const auto& seeds : std::vector<std::vector<std::optional<uint64_t>>>{
           {1, 2, 4}, {1, 2, std::nullopt}, {1, 1, 2}, {std::nullopt, std::nullopt, std::nullopt}}) {
    row.seeds = seeds;
    testAgainstBaseline(row, base);
    EXPECT_EQ(row.test, NoiseTest::kWelch) << ::testing::PrintToString(seeds);
    EXPECT_EQ(row.p_vs_baseline, welchP(kFusion, base.samples)) << ::testing::PrintToString(seeds);
  }
  // Two of the baseline's three seeds: the sets differ, so Welch's test.
  row.samples = {kFusion[0], kFusion[1]};
  row.seeds = {1, 2};
  testAgainstBaseline(row, base);
  EXPECT_EQ(row.test, NoiseTest::kWelch);
  // One seed: no test at all.
  row.samples = {kFusion[0]};
  row.seeds = {1};
  testAgainstBaseline(row, base);
  EXPECT_FALSE(row.p_vs_baseline);
  EXPECT_FALSE(row.test);
}

// Three variants at seeds 1-3, written where the runner writes repeats: one row each, means and intervals as by hand,
// fp16 (inside dense's spread) marked within noise, topk (well below) not.
TEST(Repeats, CompareAveragesSeedsAndMarksNoise) {
  const auto root = freshDir("Repeats") / "results";
  const std::vector<double> dense = {0.8728, 0.8722, 0.8715}, fp16 = {0.8731, 0.8712, 0.8720},
                            topk = {0.8610, 0.8625, 0.8601};
  for (int k = 0; k < 3; ++k) {
    const auto seed = static_cast<uint64_t>(k + 1);
    auto spec = [&](const std::string& variant, const std::string& compressor, double acc, uint64_t wire) {
      RunSpec s("s", variant, compressor, false, {{100, acc - 0.1, wire / 2, 1.0 + k}, {200, acc, wire, 2.0 + k}});
      s.seeds = "[1, 2, 3]";
      s.seed = seed;
      return s;
    };
    writeRun(root, spec("dense", "none", dense[static_cast<std::size_t>(k)], 1000));
    writeRun(root, spec("fp16", "fp16", fp16[static_cast<std::size_t>(k)], 500));
    writeRun(root, spec("topk", "topk", topk[static_cast<std::size_t>(k)], 100));
  }
  // A variant that happens to be named like a seed folder, without seeds in its config, stays a variant.
  writeRun(root, RunSpec("s", "seed-9", "topk", false, {{200, 0.5, 100, 1.0}}));

  for (const auto& path : {root, root / "s", root / "s" / "dense"}) {
    std::vector<std::string> w;
    const auto runs = loadRuns({path}, w);
    EXPECT_TRUE(w.empty()) << ::testing::PrintToString(w);
    for (const auto& r : runs) {
      EXPECT_EQ(r.study, "s") << r.dir;
      EXPECT_EQ(r.repeat_seed.has_value(), r.variant != "seed-9") << r.dir;
    }
  }
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 10u);
  CompareOptions o;
  o.target = 0.8;
  const Comparison c = compare(runs, o, w);
  ASSERT_EQ(c.studies.size(), 1u);
  const auto& rows = c.studies[0].rows;
  ASSERT_EQ(rows.size(), 4u);
  auto row = [&](const std::string& v) {
    for (const auto& r : rows)
      if (r.variant == v) return r;
    ADD_FAILURE() << "no row " << v;
    return CompareRow{};
  };
  const CompareRow d = row("dense"), f = row("fp16"), t = row("topk"), lone = row("seed-9");
  EXPECT_TRUE(d.baseline);
  EXPECT_EQ(d.seeds, 3);
  EXPECT_EQ(lone.seeds, 1);
  EXPECT_NEAR(*d.final_accuracy, 0.8721666666666668, 1e-12);
  EXPECT_NEAR(*d.final_stats.ci95, 0.0016162811241750396, 1e-12);
  EXPECT_EQ(d.dir, root / "s" / "dense");
  EXPECT_EQ(d.run_dirs.size(), 3u);
  // Wire bytes are the same at every seed: no spread, and a ratio of exactly 2 and 10.
  EXPECT_EQ(*d.wire_stats.ci95, 0);
  EXPECT_DOUBLE_EQ(*f.ratio, 2);
  EXPECT_DOUBLE_EQ(*t.ratio, 10);
  EXPECT_FALSE(f.wire_stats.withinNoise()) << "half the bytes, at every seed, is a difference";
  EXPECT_EQ(f.wire_stats.test, NoiseTest::kPaired);
  EXPECT_EQ(f.wire_stats.p_vs_baseline, 0.0) << "every per-seed difference is -500: no spread to weigh it against";
  // Accuracy: fp16 inside dense's noise, topk not (the paired p on the values above: both ran seeds 1-3).
  ASSERT_TRUE(f.final_stats.p_vs_baseline);
  EXPECT_EQ(f.final_stats.test, NoiseTest::kPaired);
  EXPECT_NEAR(*f.final_stats.p_vs_baseline, *pairedP(fp16, dense), 1e-15);
  EXPECT_TRUE(f.final_stats.withinNoise());
  EXPECT_FALSE(t.final_stats.withinNoise());
  EXPECT_LT(*t.final_stats.p_vs_baseline, 0.05);
  EXPECT_FALSE(lone.final_stats.p_vs_baseline) << "one seed is not tested";
  // Bytes to 0.8: interpolated per seed, then averaged; seconds likewise (the seeds' walls differ by 1 s each).
  ASSERT_TRUE(d.to_target);
  std::vector<double> s_to_target;
  for (int k = 0; k < 3; ++k) {
    const double acc = dense[static_cast<std::size_t>(k)];
    s_to_target.push_back(1.0 + k + (0.8 - (acc - 0.1)) / 0.1);
  }
  EXPECT_NEAR(d.to_target->wall_s, meanInterval(s_to_target).mean, 1e-9);
  EXPECT_NEAR(*d.s_to_target_stats.ci95, *meanInterval(s_to_target).half_width, 1e-9);

  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("| seeds |"), std::string::npos) << md;
  EXPECT_NE(md.find("95% Student t-interval"), std::string::npos) << md;
  EXPECT_NE(md.find("p >= 0.05 by a paired t-test on the per-seed differences from the baseline (same seeds)."),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| **dense** (baseline) | completed | 3 | 0.8722 ± 0.0016 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| fp16 | completed | 3 | 0.8721 ± 0.0024 ≈ |"), std::string::npos) << md;
  EXPECT_NE(md.find("| topk | completed | 3 | 0.8612 ± 0.0030 |"), std::string::npos) << md;
  const std::string csv = toCsv(c);
  EXPECT_NE(csv.find(",3,3,0.001616281124,"), std::string::npos) << csv;
  const auto json = parseJson(toJson(c, w));
  ASSERT_TRUE(json);
  const Json& json_rows = json->at("studies").at(0).at("rows");
  const auto dense_row =
      std::find_if(json_rows.begin(), json_rows.end(), [](const Json& r) { return r.at("variant") == "dense"; });
  ASSERT_NE(dense_row, json_rows.end()) << dumpJson(*json);
  // The seeds' values themselves, bit for bit, with their seeds; the baseline is not tested against itself.
  EXPECT_EQ(dense_row->at("over_seeds").at("final_accuracy").at("samples"), Json(d.final_stats.samples));
  EXPECT_EQ(dense_row->at("over_seeds").at("final_accuracy").at("sample_seeds"), Json::parse("[1, 2, 3]"));
  EXPECT_TRUE(dense_row->at("over_seeds").at("final_accuracy").at("test").is_null());

  // The plot's line is the mean at each evaluation point, the band its interval.
  std::vector<const RunData*> dense_runs;
  for (const auto& r : runs)
    if (r.variant == "dense") dense_runs.push_back(&r);
  const std::vector<BandPoint> band = meanLine(dense_runs);
  ASSERT_EQ(band.size(), 2u);
  EXPECT_NEAR(band[1].mean.accuracy, 0.8721666666666668, 1e-12);
  EXPECT_NEAR(band[1].hi - band[1].mean.accuracy, 0.0016162811241750396, 1e-12);
  EXPECT_NEAR(band[1].mean.wall_s, 3.0, 1e-12);
}

// A seed that never reaches the target makes the row "not reached", with a note of how many did.
TEST(Repeats, TargetReachedBySomeSeedsOnly) {
  const auto root = freshDir("RepeatsTarget") / "results";
  for (uint64_t seed : {1, 2}) {
    RunSpec s("s", "dense", "none", false, {{100, seed == 1 ? 0.9 : 0.7, 100, 1.0}});
    s.seeds = "[1, 2]";
    s.seed = seed;
    writeRun(root, s);
  }
  std::vector<std::string> w;
  CompareOptions o;
  o.target = 0.85;
  const Comparison c = compare(loadRuns({root}, w), o, w);
  ASSERT_EQ(c.studies[0].rows.size(), 1u);
  EXPECT_FALSE(c.studies[0].rows[0].to_target);
  EXPECT_EQ(c.studies[0].rows[0].reached_target, 1);
  EXPECT_NE(toMarkdown(c).find("`dense` reached the target in 1 of 2 seeds; shown as not reached"), std::string::npos);
}

// The trial end to end: two dense variants at seeds 1, 2, 3 whose seconds to target are the trial's (each run's first
// record is at the target, so its time is the record's). The table marks fusion's time as a difference, by the
// paired test, and the legend and the JSON say so.
TEST(Repeats, PairedWhenTheSeedsMatch) {
  const auto root = freshDir("RepeatsPaired") / "results";
  for (std::size_t k = 0; k < 3; ++k) {
    for (const auto& [variant, wall] : {std::pair{"dense-fifo", kFifo[k]}, std::pair{"dense-fusion", kFusion[k]}}) {
      RunSpec s("s", variant, "none", false, {{100, 0.9, 1000, wall}});
      s.seeds = "[1, 2, 3]";
      s.seed = k + 1;
      writeRun(root, s);
    }
  }
  std::vector<std::string> w;
  CompareOptions o;
  o.target = 0.85;
  o.baseline = "dense-fifo";
  const Comparison c = compare(loadRuns({root}, w), o, w);
  ASSERT_EQ(c.studies.size(), 1u);
  ASSERT_EQ(c.studies[0].rows.size(), 2u);
  const CompareRow& fusion =
      c.studies[0].rows[0].variant == "dense-fusion" ? c.studies[0].rows[0] : c.studies[0].rows[1];
  ASSERT_EQ(fusion.variant, "dense-fusion");
  EXPECT_EQ(fusion.s_to_target_stats.test, NoiseTest::kPaired);
  ASSERT_TRUE(fusion.s_to_target_stats.p_vs_baseline);
  EXPECT_EQ(*fusion.s_to_target_stats.p_vs_baseline, *pairedP(kFusion, kFifo));
  EXPECT_FALSE(fusion.s_to_target_stats.withinNoise());
  ASSERT_TRUE(fusion.to_target);
  EXPECT_LT(fusion.to_target->wall_s, meanInterval(kFifo).mean) << "fusion is the faster";
  // Same bytes and accuracy at every seed: no difference, by the paired test's p = 1.
  EXPECT_TRUE(fusion.wire_stats.withinNoise());
  EXPECT_EQ(fusion.wire_stats.p_vs_baseline, 1.0);

  const std::string md = toMarkdown(c);
  // Was "0.748 ± 0.142 ≈" under Welch's test.
  EXPECT_NE(md.find(" | 0.748 ± 0.142 | "), std::string::npos) << md;
  EXPECT_EQ(md.find("0.748 ± 0.142 ≈"), std::string::npos) << md;
  EXPECT_NE(md.find("p >= 0.05 by a paired t-test on the per-seed differences from the baseline (same seeds)."),
            std::string::npos)
      << md;
  const auto json = parseJson(toJson(c, w));
  ASSERT_TRUE(json);
  for (const Json& r : json->at("studies").at(0).at("rows")) {
    const Json& st = r.at("over_seeds").at("seconds_to_target");
    EXPECT_EQ(st.at("sample_seeds"), Json::parse("[1, 2, 3]")) << dumpJson(r);
    if (r.at("variant") == "dense-fusion") {
      EXPECT_EQ(st.at("test"), "paired") << dumpJson(r);
      EXPECT_EQ(st.at("within_noise"), false) << dumpJson(r);
    } else {
      EXPECT_TRUE(st.at("test").is_null()) << "the baseline is not tested: " << dumpJson(r);
    }
  }
}

// A row whose seeds are not the baseline's (4, 5, 6 against 1, 2, 3) is tested by Welch's test, and the legend names
// it, beside a row at the baseline's seeds tested paired.
TEST(Repeats, MismatchedSeedsFallBackToWelch) {
  const auto root = freshDir("RepeatsWelch") / "results";
  auto write = [&](const std::string& variant, const std::string& compressor, const std::vector<double>& acc,
                   uint64_t first_seed) {
    for (uint64_t k = 0; k < 3; ++k) {
      RunSpec s("s", variant, compressor, false, {{100, acc[k], 1000, 1.0}});
      s.seeds = "[" + std::to_string(first_seed) + ", " + std::to_string(first_seed + 1) + ", " +
                std::to_string(first_seed + 2) + "]";
      s.seed = first_seed + k;
      writeRun(root, s);
    }
  };
  write("dense", "none", {0.8728, 0.8722, 0.8715}, 1);
  write("same-seeds", "fp16", {0.8731, 0.8712, 0.8720}, 1);
  write("other-seeds", "topk", {0.8610, 0.8625, 0.8601}, 4);
  std::vector<std::string> w;
  CompareOptions o;
  o.target = 0.99;
  const Comparison c = compare(loadRuns({root}, w), o, w);
  ASSERT_EQ(c.studies.size(), 1u);
  for (const CompareRow& r : c.studies[0].rows) {
    if (r.variant == "dense") continue;
    const NoiseTest expected = r.variant == "same-seeds" ? NoiseTest::kPaired : NoiseTest::kWelch;
    EXPECT_EQ(r.final_stats.test, expected) << r.variant;
    EXPECT_EQ(r.wire_stats.test, expected) << r.variant;
  }
  const auto other = std::find_if(c.studies[0].rows.begin(), c.studies[0].rows.end(),
                                  [](const CompareRow& r) { return r.variant == "other-seeds"; });
  ASSERT_NE(other, c.studies[0].rows.end());
  EXPECT_EQ(other->final_stats.p_vs_baseline,
            welchP(other->final_stats.samples, std::vector<double>{0.8728, 0.8722, 0.8715}));
  EXPECT_EQ(other->final_stats.seeds, (std::vector<std::optional<uint64_t>>{4, 5, 6}));
  const std::string md = toMarkdown(c);
  EXPECT_NE(md.find("p >= 0.05 by a paired t-test on the per-seed differences from the baseline (same seeds), or "
                    "Welch's t-test (unpaired: the seeds differ from the baseline's) for `other-seeds` (final acc, "
                    "best acc, wire MB)."),
            std::string::npos)
      << md;
  const auto json = parseJson(toJson(c, w));
  ASSERT_TRUE(json);
  for (const Json& r : json->at("studies").at(0).at("rows"))
    if (r.at("variant") == "other-seeds") {
      EXPECT_EQ(r.at("over_seeds").at("final_accuracy").at("test"), "welch") << dumpJson(r);
      EXPECT_EQ(r.at("over_seeds").at("final_accuracy").at("sample_seeds"), Json::parse("[4, 5, 6]")) << dumpJson(r);
    }
}

// A row's repeats must differ in their seed alone: seeds run with other settings (--set epochs=1 on one seed) are said
// under the table, the odd group named against the largest, rather than averaged in unseen. A map's entries in another
// order and a defaulted field an older build did not write are the same settings.
TEST(Repeats, SeedsRunWithOtherSettingsAreSaidSo) {
  const auto root = freshDir("RepeatsMixed") / "results";
  std::vector<fs::path> dirs;
  for (uint64_t seed : {1, 2, 3}) {
    RunSpec s("s", "v", "none", false, {{100, 0.8, 1000, 1.0}});
    s.seeds = "[1, 2, 3]";
    s.seed = seed;
    if (seed == 1) s.batch_size = "64";  // the odd one is the first
    dirs.push_back(writeRun(root, s));
  }
  // Seeds 2 and 3 agree, though their params come in another order and seed 3 spells out a default.
  auto setCompressor = [](const fs::path& dir, const std::string& block) {
    std::string text = readText(dir / "config.textproto");
    const std::string from = "compressor {\n  name: \"none\"\n}\n";
    ASSERT_NE(text.find(from), std::string::npos) << text;
    text.replace(text.find(from), from.size(), block);
    writeFileAtomic(dir / "config.textproto", text);
  };
  setCompressor(dirs[1],
                "compressor {\n  name: \"none\"\n  params { key: \"a\" value: \"1\" }\n  params { key: \"b\" "
                "value: \"2\" }\n}\n");
  setCompressor(dirs[2],
                "compressor {\n  name: \"none\"\n  params { key: \"b\" value: \"2\" }\n  params { key: \"a\" "
                "value: \"1\" }\n}\nplugin_timeout: \"60s\"\n");
  setCompressor(dirs[0],
                "compressor {\n  name: \"none\"\n  params { key: \"a\" value: \"1\" }\n  params { key: \"b\" "
                "value: \"2\" }\n}\n");
  std::vector<std::string> w;
  const Comparison c = compare(loadRuns({root}, w), {}, w);
  ASSERT_EQ(c.studies.size(), 1u);
  ASSERT_EQ(c.studies[0].rows.size(), 1u);
  EXPECT_EQ(c.studies[0].rows[0].seeds, 3);
  const auto& notes = c.studies[0].notes;
  const auto mixed = std::count_if(notes.begin(), notes.end(), [](const std::string& n) {
    return n.find("ran with other settings") != std::string::npos;
  });
  EXPECT_EQ(mixed, 1) << testing::joined(notes);
  EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n ==
           "`v`: seed 1 ran with other settings than seeds 2, 3: data.batch_size 64 (32); the row's means and "
           "intervals mix settings, not only seeds (run its seeds alike)";
  })) << testing::joined(notes);
}

// A variant's folder holding a run of its own and repeats (a quick run, then --seeds; or the reverse) shows the later
// of the two by status.json's times, which a copy keeps (a copy resets the files' times), never a mix, and a warning
// names both.
TEST(Repeats, ARunOfItsOwnBesideRepeatsShowsTheLater) {
  const auto root = freshDir("RepeatsBesideOwn") / "results";
  const fs::path own = writeRun(root, RunSpec("s", "v", "none", false, {{100, 0.5, 1000, 1.0}}));
  std::vector<fs::path> seeds;
  for (uint64_t seed : {1, 2}) {
    RunSpec s("s", "v", "none", false, {{100, 0.8 + 0.01 * static_cast<double>(seed), 1000, 1.0}});
    s.seeds = "[1, 2]";
    s.seed = seed;
    seeds.push_back(writeRun(root, s));
  }
  auto written = [](const fs::path& dir, const std::string& at) {
    writeFileAtomic(dir / "status.json",
                    "{\"state\":\"completed\",\"records\":1,\"started\":\"" + at + "\",\"updated\":\"" + at + "\"}\n");
  };
  written(own, "2026-12-06T10:00:00Z");  // the run of its own first, the repeats later
  written(seeds[0], "2026-12-06T11:00:00Z");
  written(seeds[1], "2026-12-06T11:05:00Z");
  // The files' times say the opposite (a copy in another order): status.json's decide.
  for (const auto& e : fs::directory_iterator(own))
    fs::last_write_time(e.path(), fs::file_time_type::clock::now() + std::chrono::minutes(5));
  std::vector<std::string> w;
  Comparison c = compare(loadRuns({root}, w), {}, w);
  ASSERT_EQ(c.studies[0].rows.size(), 1u);
  EXPECT_EQ(c.studies[0].rows[0].seeds, 2);
  EXPECT_NEAR(*c.studies[0].rows[0].final_accuracy, 0.815, 1e-12);
  EXPECT_TRUE(std::any_of(w.begin(), w.end(), [&](const std::string& x) {
    return x == own.string() +
                    ": holds a run of its own (written 2026-12-06 10:00:00 UTC) and repeats (seed-1/, "
                    "seed-2/ written 2026-12-06 11:05:00 UTC), two runs of one variant; shown: the repeats, "
                    "the later; the run of its own is left out (move one away to keep both)";
  })) << testing::joined(w);
  written(own, "2026-12-06T11:05:00Z");  // written alike: the repeats, more runs
  w.clear();
  c = compare(loadRuns({root}, w), {}, w);
  EXPECT_EQ(c.studies[0].rows[0].seeds, 2);
  EXPECT_TRUE(std::any_of(w.begin(), w.end(), [](const std::string& x) {
    return x.find("shown: the repeats (written alike); the run of its own is left out") != std::string::npos;
  })) << testing::joined(w);
  written(own, "2026-12-06T12:00:00Z");  // now the run of its own is the later
  w.clear();
  c = compare(loadRuns({root}, w), {}, w);
  ASSERT_EQ(c.studies[0].rows.size(), 1u);
  EXPECT_EQ(c.studies[0].rows[0].seeds, 1);
  EXPECT_NEAR(*c.studies[0].rows[0].final_accuracy, 0.5, 1e-12);
  EXPECT_TRUE(std::any_of(w.begin(), w.end(), [](const std::string& x) {
    return x.find("shown: the run of its own, the later; the repeats are left out") != std::string::npos;
  })) << testing::joined(w);
}

}  // namespace
}  // namespace terse::results
