// Plots: the data and script are always written; gnuplot draws them when it is on the search path, and a missing or
// failing gnuplot is a message, never an exception.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>

#include "results/compare/plot.h"
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
  EXPECT_NE(dat.find("# variant topk\n100 1 0.6 100\n200 2 0.86 200\n300 3 0.88 300\n\n\n# variant fp16"),
            std::string::npos)
      << dat;
  const std::string gp = readText(root / "out" / "s.gp");
  EXPECT_NE(gp.find("names[3] = 'dense (baseline)'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("names[5] = 'qsgd (failed)'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set logscale x"), std::string::npos);
  EXPECT_FALSE(fs::exists(root / "out" / "s_acc_vs_bytes.png"));
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

}  // namespace
}  // namespace terse::results
