// Repeated seeds in `terse compare` (compute.h "Repeats", stats.h): the t quantiles, interval and Welch p-value against
// values worked out by hand from the closed forms of Student's t for 1, 2 and 4 degrees of freedom, seed-<N> folders
// read back as one row, the "within noise" marks, and the plot's mean line with its band.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
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
  // Accuracy: fp16 inside dense's noise, topk not (Welch p on the values above).
  ASSERT_TRUE(f.final_stats.p_vs_baseline);
  EXPECT_NEAR(*f.final_stats.p_vs_baseline, *welchP(fp16, dense), 1e-15);
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
  EXPECT_NE(md.find("Welch's t-test, p >= 0.05"), std::string::npos) << md;
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
  // The seeds' values themselves, bit for bit.
  EXPECT_EQ(dense_row->at("over_seeds").at("final_accuracy").at("samples"), Json(d.final_stats.samples));

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

}  // namespace
}  // namespace terse::results
