// Plots: the data and script are always written; gnuplot draws them when it is on the search path, and a missing or
// failing gnuplot is a message, never an exception.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <functional>
#include <set>

#include "results/compare/plot.h"
#include "results/compare/text.h"
#include "tests/results/results_fixture.h"

namespace terse::results {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

struct Plotted {
  std::vector<RunData> runs;
  Comparison c;
};

Plotted knownComparison(const fs::path& root) {
  for (const auto& s : knownStudy()) writeRun(root, s);
  Plotted p;
  std::vector<std::string> w;
  p.runs = loadRuns({root}, w);
  p.c = compare(p.runs, {}, w);
  return p;
}

void writeScript(const fs::path& path, const std::string& body) {
  writeFileAtomic(path, "#!/bin/sh\n" + body + "\n");
  ::chmod(path.c_str(), 0755);
}

TEST(FindExecutable, SearchesEachEntryInOrder) {
  const fs::path dir = freshDir("FindExecutable");
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  writeFileAtomic(dir / "a" / "tool", "not executable");
  writeScript(dir / "b" / "tool", "exit 0");
  const std::string path = (dir / "a").string() + ":" + (dir / "b").string();
  EXPECT_EQ(findExecutable("tool", path), dir / "b" / "tool");
  EXPECT_FALSE(findExecutable("tool", (dir / "a").string()));
  EXPECT_FALSE(findExecutable("tool", ""));
  EXPECT_FALSE(findExecutable("b", dir.string()));  // a directory is not an executable
}

TEST(Plot, WithoutGnuplotWritesDataAndScriptAndSaysWhy) {
  const fs::path root = freshDir("PlotNoGnuplot");
  const auto p = knownComparison(root / "results");
  const fs::path empty = root / "empty-bin";
  fs::create_directories(empty);
  const PlotOutcome o = writePlots(p.c, p.runs, root / "out", empty.string());
  EXPECT_FALSE(o.plotted);
  EXPECT_NE(o.message.find("gnuplot not found in PATH"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("gnuplot <study>.gp"), std::string::npos) << o.message;
  ASSERT_TRUE(fs::exists(root / "out" / "s.gp"));
  const std::string dat = readText(root / "out" / "s.dat");
  // Blocks in table order (topk first), separated by two blank lines so gnuplot's `index` finds them.
  EXPECT_NE(dat.find("# variant topk\n100 1 0.6 100 0.6 0.6\n200 2 0.86 200 0.86 0.86\n300 3 0.88 300 0.88 0.88\n\n\n# "
                     "variant fp16"),
            std::string::npos)
      << dat;
  const std::string gp = readText(root / "out" / "s.gp");
  EXPECT_NE(gp.find("names[3] = 'dense (baseline)'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("names[5] = 'qsgd (failed)'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set logscale x"), std::string::npos);
  EXPECT_FALSE(fs::exists(root / "out" / "s_acc_vs_bytes.png"));
}

// A grid study plots each point apart, files named by the study and the point; points whose names make one file name
// (the point comes from untrusted config.textproto) and a name too long for a file still get files of their own.
TEST(Plot, EachGridPointHasFilesOfItsOwn) {
  const fs::path root = freshDir("PlotGrid");
  const std::string long_value(400, 'x');
  for (const std::string& value : {std::string("1Gbps"), std::string("a/b"), std::string("a_b"), long_value}) {
    RunSpec s{"s", "dense." + std::to_string(std::hash<std::string>{}(value)), "none", false, {{10, 0.5, 100, 1}}};
    s.grid_variant = "dense";
    s.grid = {{"link.bandwidth", value}};
    writeRun(root / "results", s);
  }
  std::vector<std::string> w;
  const auto runs = loadRuns({root / "results"}, w);
  ASSERT_EQ(runs.size(), 4u) << joined(w);
  const Comparison c = compare(runs, {}, w);
  ASSERT_EQ(c.studies.size(), 4u);
  const fs::path empty = root / "empty-bin";
  fs::create_directories(empty);
  const PlotOutcome o = writePlots(c, runs, root / "out", empty.string());
  EXPECT_FALSE(o.plotted);  // no gnuplot on this search path: the data and scripts alone
  std::set<std::string> dats;
  for (const auto& e : fs::directory_iterator(root / "out"))
    if (e.path().extension() == ".dat") {
      dats.insert(e.path().filename().string());
      EXPECT_LE(e.path().filename().string().size(), 170u);
    }
  EXPECT_EQ(dats.size(), 5u) << ::testing::PrintToString(dats);  // and the points side by side
  EXPECT_TRUE(dats.contains("s_across_grid.dat")) << ::testing::PrintToString(dats);
  EXPECT_TRUE(dats.contains("s.bandwidth-1Gbps.dat")) << ::testing::PrintToString(dats);
  EXPECT_TRUE(dats.contains("s.bandwidth-a_b.dat")) << ::testing::PrintToString(dats);
  EXPECT_TRUE(dats.contains("s.bandwidth-a_b-2.dat")) << ::testing::PrintToString(dats);
}

// A grid study's points side by side: along the first axis, a line per variant and value of the other axes, with each
// point's speedup over its own baseline, the final accuracy and the wire ratio.
TEST(Plot, AGridStudyIsDrawnAcrossItsPoints) {
  const fs::path root = freshDir("PlotAcrossGrid");
  // bandwidth x workers; dense takes 2 s to 0.8 everywhere, topk 1 s at 1Gbps and 4 s at 10Gbps.
  for (const std::string workers : {"2", "4"})
    for (const auto& [bandwidth, topk_s] : {std::pair{"1Gbps", 1.0}, std::pair{"10Gbps", 4.0}})
      for (const auto& [variant, compressor, wall, wire] :
           {std::tuple{"dense", "none", 2.0, uint64_t{400}}, std::tuple{"topk", "topk", topk_s, uint64_t{100}}}) {
        RunSpec s{"s",
                  std::string(variant) + ".bandwidth-" + bandwidth + ".workers-" + workers,
                  compressor,
                  false,
                  {{10, 0.5, wire / 2, wall / 2}, {20, 0.85, wire, wall}}};
        s.grid_variant = variant;
        s.grid = {{"link.bandwidth", bandwidth}, {"workers", workers}};
        writeRun(root / "results", s);
      }
  std::vector<std::string> w;
  const auto runs = loadRuns({root / "results"}, w);
  ASSERT_EQ(runs.size(), 8u) << joined(w);
  CompareOptions options;
  options.target = 0.8;
  const Comparison c = compare(runs, options, w);
  const fs::path empty = root / "empty-bin";
  fs::create_directories(empty);
  writePlots(c, runs, root / "out", empty.string());
  const std::string dat = readText(root / "out" / "s_across_grid.dat");
  // A line per variant and workers value, x along the bandwidth in its natural order (1Gbps before 10Gbps), columns x,
  // speedup, final accuracy, wire ratio.
  for (const std::string workers : {"2", "4"}) {
    const auto dense = dat.find("# line dense (workers=" + workers + ")\n0 1 0.85 1\n1 1 0.85 1\n");
    EXPECT_NE(dense, std::string::npos) << dat;
    const auto topk = dat.find("# line topk (workers=" + workers + ")\n0 2 0.85 4\n1 0.5 0.85 4\n");
    EXPECT_NE(topk, std::string::npos) << dat;
  }
  const std::string gp = readText(root / "out" / "s_across_grid.gp");
  EXPECT_NE(gp.find("set xtics ('1Gbps' 0, '10Gbps' 1)"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set xlabel 'link.bandwidth'"), std::string::npos) << gp;
  for (const char* kind : {"'_speedup.'", "'_final_accuracy.'", "'_wire_ratio.'"})
    EXPECT_NE(gp.find(kind), std::string::npos) << kind;

  const char* path = std::getenv("PATH");
  if (!findExecutable("gnuplot", path ? path : "")) GTEST_SKIP() << "gnuplot is not installed (scripts/bootstrap)";
  const PlotOutcome o = writePlots(c, runs, root / "drawn", path);
  ASSERT_TRUE(o.plotted) << o.message;
  for (const char* name :
       {"s_across_grid_speedup.png", "s_across_grid_final_accuracy.svg", "s_across_grid_wire_ratio.png"}) {
    EXPECT_TRUE(std::find(o.written.begin(), o.written.end(), root / "drawn" / name) != o.written.end()) << name;
    EXPECT_GT(fs::file_size(root / "drawn" / name), 1000u) << name;
  }
}

// Runs of one study made with other axes share no x axis: a drawing each. Text from the folders (an axis path is a
// run's config, untrusted) stays inside the scripts' comments and strings: gnuplot runs the script.
TEST(Plot, AcrossGridDrawingsKeepToOneSetOfAxesAndToTheirComments) {
  const fs::path root = freshDir("PlotAcrossGridAxes");
  const std::string hostile = "link.bandwidth\\nsystem('touch PWNED')\\n#\\\\";
  for (const std::string value : {"1", "2"}) {
    RunSpec a{"s", "dense.workers-" + value, "none", false, {{10, 0.5, 100, 1}}};
    a.grid_variant = "dense";
    a.grid = {{"workers", value}};
    writeRun(root / "results", a);
    RunSpec b{"s", "dense.bandwidth-" + value, "none", false, {{10, 0.6, 100, 1}}};
    b.grid_variant = "dense";
    b.grid = {{hostile, value + "Gbps"}};
    writeRun(root / "results", b);
  }
  std::vector<std::string> w;
  const auto runs = loadRuns({root / "results"}, w);
  ASSERT_EQ(runs.size(), 4u) << joined(w);
  const Comparison c = compare(runs, {}, w);
  const char* path = std::getenv("PATH");
  const bool gnuplot = findExecutable("gnuplot", path ? path : "").has_value();
  writePlots(c, runs, root / "out", gnuplot ? path : "");
  std::vector<std::string> across;
  for (const auto& e : fs::directory_iterator(root / "out")) {
    const std::string name = e.path().filename().string();
    if (name.find("_across_grid") != std::string::npos && e.path().extension() == ".gp") across.push_back(name);
    if (e.path().extension() != ".gp" && e.path().extension() != ".dat") continue;
    std::istringstream lines(readText(e.path()));
    for (std::string line; std::getline(lines, line);)
      EXPECT_FALSE(line.starts_with("system(")) << name << ": " << line;
  }
  std::sort(across.begin(), across.end());
  ASSERT_EQ(across.size(), 2u) << ::testing::PrintToString(across);
  EXPECT_EQ(across[1], "s_across_grid-workers.gp");
  EXPECT_NE(readText(root / "out" / "s_across_grid-workers.gp").find("set xtics ('1' 0, '2' 1)"), std::string::npos);
  EXPECT_FALSE(fs::exists(root / "out" / "PWNED"));
}

TEST(Plot, AFailingGnuplotIsReportedWithItsOutput) {
  const fs::path root = freshDir("PlotFailing");
  const auto p = knownComparison(root / "results");
  const fs::path bin = root / "bin";
  fs::create_directories(bin);
  writeScript(bin / "gnuplot", "echo \"line 7: unknown terminal in $1\" >&2; exit 3");
  const PlotOutcome o = writePlots(p.c, p.runs, root / "out", bin.string());
  EXPECT_FALSE(o.plotted);
  EXPECT_NE(o.message.find("gnuplot exited with 3: line 7: unknown terminal in s.gp"), std::string::npos) << o.message;
}

TEST(Plot, GnuplotDrawsPngAndSvg) {
  const char* path = std::getenv("PATH");
  if (!findExecutable("gnuplot", path ? path : "")) GTEST_SKIP() << "gnuplot is not installed (scripts/bootstrap)";
  const fs::path root = freshDir("PlotGnuplot");
  const auto p = knownComparison(root / "results");
  const PlotOutcome o = writePlots(p.c, p.runs, root / "out", path);
  ASSERT_TRUE(o.plotted) << o.message;
  for (const char* name : {"s_acc_vs_bytes.png", "s_acc_vs_bytes.svg", "s_acc_vs_time.png", "s_acc_vs_time.svg"}) {
    ASSERT_TRUE(fs::exists(root / "out" / name)) << name;
    EXPECT_GT(fs::file_size(root / "out" / name), 1000u) << name;
  }
  EXPECT_EQ(readText(root / "out" / "s_acc_vs_bytes.png").substr(1, 3), "PNG");
  const std::string svg = readText(root / "out" / "s_acc_vs_bytes.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("dense (baseline)"), std::string::npos);
  EXPECT_FALSE(fs::exists(root / "out" / "s.gnuplot.log"));
}

EvalPoint at(int64_t step, double epoch_progress, double accuracy) {
  EvalPoint p;
  p.step = step;
  p.epoch_progress = epoch_progress;
  p.accuracy = accuracy;
  return p;
}

std::vector<int64_t> steps(const std::vector<EvalPoint>& points) {
  std::vector<int64_t> out;
  for (const auto& p : points) out.push_back(p.step);
  return out;
}

// The quickstart's cadence: every 235 steps and at the ends of 469-step epochs, so 469/470 and 938/940 are both
// evaluated; the line keeps the epoch ends.
TEST(PlotPoints, NearDuplicatesOfAnEpochEndCollapseOntoIt) {
  const std::vector<EvalPoint> quickstart = {at(235, 0.501, 0.80), at(469, 1.0, 0.83), at(470, 1.002, 0.83),
                                             at(705, 1.503, 0.84), at(938, 2.0, 0.85), at(940, 2.004, 0.85),
                                             at(1175, 2.505, 0.86)};
  EXPECT_EQ(steps(plotPoints(quickstart)), (std::vector<int64_t>{235, 469, 705, 938, 1175}));
  // The epoch end after the other cadence's point replaces it.
  const std::vector<EvalPoint> before = {at(100, 0.2, 0.5), at(200, 0.4, 0.6),   at(300, 0.6, 0.7),
                                         at(400, 0.8, 0.8), at(499, 0.998, 0.8), at(500, 1.0, 0.81)};
  EXPECT_EQ(steps(plotPoints(before)), (std::vector<int64_t>{100, 200, 300, 400, 500}));
  // Evenly spaced points all stay.
  const std::vector<EvalPoint> even = {at(67, 0.14, 0.7), at(134, 0.29, 0.75), at(201, 0.43, 0.8)};
  EXPECT_EQ(steps(plotPoints(even)), (std::vector<int64_t>{67, 134, 201}));
}

TEST(AccuracyRange, FollowsTheData) {
  // A study whose accuracies sit around 0.3 is drawn there, not in a fixed 0.6-0.9 window.
  const AccuracyRange low = accuracyRange({{at(1, 0, 0.30), at(2, 0, 0.36)}, {at(1, 0, 0.32), at(2, 0, 0.40)}});
  EXPECT_NEAR(low.lo, 0.30 - 0.005, 1e-12);
  EXPECT_NEAR(low.hi, 0.40 + 0.005, 1e-12);
  // A high study stays zoomed in.
  const AccuracyRange high = accuracyRange({{at(1, 0, 0.85), at(2, 0, 0.90)}});
  EXPECT_NEAR(high.lo, 0.8475, 1e-12);
  EXPECT_NEAR(high.hi, 0.9025, 1e-12);
  // The floor: a diverged line's collapse (0.1) leaves the plot below 0.25 under the weakest line's best (0.5).
  const AccuracyRange diverged = accuracyRange({{at(1, 0, 0.5), at(2, 0, 0.1)}, {at(1, 0, 0.8), at(2, 0, 0.9)}});
  EXPECT_NEAR(diverged.lo, 0.25 - 0.05 * 0.65, 1e-12);
  EXPECT_NEAR(diverged.hi, 0.9 + 0.05 * 0.65, 1e-12);
  // A flat line gets a readable height; the range stays within [0, 1].
  const AccuracyRange flat = accuracyRange({{at(1, 0, 0.99), at(2, 0, 0.99)}});
  EXPECT_NEAR(flat.lo, 0.965, 1e-12);
  EXPECT_EQ(flat.hi, 1.0);
  const AccuracyRange none = accuracyRange({});
  EXPECT_EQ(none.lo, 0.0);
  EXPECT_EQ(none.hi, 1.0);
}

TEST(Plot, ScriptDrawsTheBaselineBlackAndThickWithTheDataRange) {
  const fs::path root = freshDir("PlotStyle");
  const auto p = knownComparison(root / "results");
  const fs::path empty = root / "empty-bin";
  fs::create_directories(empty);
  writePlots(p.c, p.runs, root / "out", empty.string());
  const std::string gp = readText(root / "out" / "s.gp");
  EXPECT_NE(gp.find("names[3] = 'dense (baseline)'; colors[3] = 'black'; widths[3] = 3; dashes[3] = 1"),
            std::string::npos)
      << gp;
  EXPECT_NE(gp.find("names[1] = 'topk'; colors[1] = '#9400d3'; widths[1] = 1.5"), std::string::npos) << gp;
  // Only the baseline is black.
  std::size_t blacks = 0;
  for (auto at = gp.find("= 'black'"); at != std::string::npos; at = gp.find("= 'black'", at + 1)) ++blacks;
  EXPECT_EQ(blacks, 1u);
  EXPECT_NE(gp.find("lw widths[i] lc rgb colors[i] dt dashes[i]"), std::string::npos) << gp;
  std::vector<std::vector<EvalPoint>> lines;
  for (const auto& run : p.runs)
    if (!run.points.empty()) lines.push_back(plotPoints(run.points));
  const AccuracyRange r = accuracyRange(lines);
  EXPECT_NE(gp.find("set yrange [" + detail::fullPrecision(r.lo) + ":" + detail::fullPrecision(r.hi) + "]"),
            std::string::npos)
      << gp;
}

}  // namespace
}  // namespace terse::results
