// `terse compare` as a user runs it: exit codes, warnings on stderr, and each --format parsed back.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "core/common/json.h"
#include "tests/results/results_fixture.h"

namespace terse::results {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

struct Result {
  int rc = -1;
  std::string out, err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `terse compare <args>` (optionally under `env ENV`), stdout captured, stderr into a file.
Result compareCli(const std::string& args, const fs::path& scratch, const std::string& env = "") {
  const fs::path err = scratch / "stderr.txt";
  const std::string cmd = (env.empty() ? "" : "/usr/bin/env " + env + " ") + quote(TERSE_TEST_TERSE_BIN) + " compare " +
                          args + " 2>" + quote(err.string());
  Result r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = readText(err);
  return r;
}

class CompareCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshDir(std::string("Cli") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    for (const auto& s : knownStudy()) writeRun(dir_ / "results", s);
  }
  std::string results() const { return quote((dir_ / "results").string()); }
  fs::path dir_;
};

TEST_F(CompareCli, MarkdownByDefault) {
  const Result r = compareCli(results(), dir_);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("### s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| topk |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("**dense** (baseline)"), std::string::npos) << r.out;
  EXPECT_LT(r.out.find("| topk |"), r.out.find("**dense**"));
  EXPECT_NE(r.err.find("terse compare: warning: "), std::string::npos);
  EXPECT_NE(r.err.find("the run failed: rank 2: qsgd: compress failed"), std::string::npos) << r.err;
}

TEST_F(CompareCli, JsonParsesBackWithTargetAndBaseline) {
  const Result r = compareCli(results() + " --format json --target 0.75 --baseline fp16", dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string error;
  auto j = parseJson(r.out, &error);
  ASSERT_TRUE(j) << error << "\n" << r.out;
  EXPECT_DOUBLE_EQ(*getNumber(*j, "target"), 0.75);
  const Json& study = j->at("studies").at(0);
  EXPECT_EQ(getString(study, "baseline"), "fp16");
  const Json& rows = study.at("rows");
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(getString(rows[0], "variant"), "signsgd");
  EXPECT_NEAR(*getNumber(rows[0], "bytes_to_target"), 20, 1e-9);
  EXPECT_FALSE(j->at("warnings").empty());
}

// A --baseline that names no variant is refused with the names it could have been: before, the table came out without
// ratios and the command exited 0, so a script kept it.
TEST_F(CompareCli, AMisspeltBaselineIsRefused) {
  const fs::path out = dir_ / "out";
  const Result r = compareCli(results() + " --baseline topkk --out " + quote(out.string()), dir_);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("terse compare: --baseline topkk: no variant of that name in the folders given; did you mean "
                       "topk? (variants: "),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CompareCli, CsvHasOneLinePerVariant) {
  const Result r = compareCli(results() + " --format csv", dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  int lines = 0;
  for (char c : r.out) lines += c == '\n';
  EXPECT_EQ(lines, 6) << r.out;
  EXPECT_EQ(r.out.rfind("study,variant,baseline,state,", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\ns,dense,true,completed,none,"), std::string::npos) << r.out;
}

TEST_F(CompareCli, OutWithoutGnuplotWritesTablesAndWarns) {
  const fs::path out = dir_ / "out";
  const Result r = compareCli(results() + " --out " + quote(out.string()), dir_, "PATH=" + (dir_ / "nobin").string());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("gnuplot not found in PATH"), std::string::npos) << r.err;
  for (const char* f : {"compare.md", "compare.csv", "compare.json", "s.gp", "s.dat"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  EXPECT_EQ(readText(out / "compare.md"), r.out);
  EXPECT_TRUE(parseJson(readText(out / "compare.json")));
}

TEST_F(CompareCli, ProvenanceWarnsAboutDifferentWorkloads) {
  RunSpec other{"s", "bigger", "none", false, {{100, 0.5, 10, 1}}};
  other.hidden = "1024";
  writeRun(dir_ / "results", other);
  const Result r = compareCli("--provenance " + results(), dir_);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("(provenance)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| bigger | completed |"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("different workloads"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("s/bigger: workload.hidden_sizes=1024"), std::string::npos) << r.err;
  const Result j = compareCli("--provenance --format json " + results(), dir_);
  auto doc = parseJson(j.out);
  ASSERT_TRUE(doc) << j.out;
  EXPECT_EQ(doc->at("runs").size(), 6u);
}

TEST_F(CompareCli, UsageAndNothingToCompare) {
  Result r = compareCli(results() + " --format xml", dir_);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--format must be md, csv or json, got 'xml'"), std::string::npos) << r.err;
  r = compareCli(results() + " --target 1.5", dir_);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--target must be in (0, 1]"), std::string::npos) << r.err;
  r = compareCli("", dir_);
  EXPECT_EQ(r.rc, 2);
  r = compareCli(quote((dir_ / "missing").string()), dir_);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no such directory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no result folders to compare"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace terse::results
