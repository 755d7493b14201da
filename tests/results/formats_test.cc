// The readers compare depends on (JSON, config.textproto through the experiment schema, SHA-256) and its three output
// formats, parsed back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <sstream>

#include "core/common/json.h"
#include "results/compare.h"
#include "tests/results/results_fixture.h"

namespace terse::results {
namespace {

using namespace testing;  // NOLINT: the fixture helpers

TEST(Sha256, KnownVectors) {
  // FIPS 180-4 examples: one block, empty, and a message whose padding needs a second block.
  EXPECT_EQ(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256Hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

class ConfigRead : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("terse-config-read-" + std::to_string(::getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_F(ConfigRead, ReadsWhatTheRunnerWrites) {
  RunSpec spec("s", "topk-ef", "topk", true, {{10, 0.5, 1000, 1.0}});
  spec.hidden = "[256, 128]";
  const fs::path dir = writeRun(root_, spec);
  std::vector<std::string> warnings;
  const RunData run = loadRun(dir, warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  ASSERT_TRUE(run.has_config);
  EXPECT_EQ(run.compressor, "topk");
  EXPECT_TRUE(run.error_feedback);
  EXPECT_EQ(run.workload_fields, (std::vector<std::string>{"workload.name=\"mlp\"", "workload.hidden_sizes=256",
                                                           "workload.hidden_sizes=128"}));
  EXPECT_EQ(run.data_fields,
            (std::vector<std::string>{"data.dataset_dir=\"/usr/share/datasets/fashion-mnist\"", "data.batch_size=32"}));
  EXPECT_EQ(run.config_sha256, sha256Hex(readText(dir / "config.textproto")));
}

TEST_F(ConfigRead, ABrokenOrForeignConfigIsReportedWithItsLineAndNotUsed) {
  const fs::path dir = writeRun(root_, RunSpec("s", "v", "topk", true, {{10, 0.5, 1000, 1.0}}));
  for (const std::string& bad : {std::string("study: \"s\"\nworkload {\n  name: \"mlp\"\n"),  // truncated
                                 std::string("study: \"s\"\nfuture_field: 3\n")}) {           // a newer terse's field
    writeFileAtomic(dir / "config.textproto", bad);
    std::vector<std::string> warnings;
    const RunData run = loadRun(dir, warnings);
    EXPECT_FALSE(run.has_config);
    EXPECT_EQ(run.compressor, "topk");  // provenance still says what loaded
    ASSERT_FALSE(warnings.empty());
    const std::string file_line =
        (dir / "config.textproto").string() + ":" + (bad.find("future") != std::string::npos ? "2" : "4");
    EXPECT_NE(warnings.front().find(file_line), std::string::npos) << warnings.front();
    EXPECT_NE(warnings.front().find("config not used"), std::string::npos) << warnings.front();
  }
}

// A results folder may come from anyone: a config nested thousands of levels deep (which overflowed protobuf's
// recursive parser) is reported and not used, like any unreadable one.
TEST_F(ConfigRead, ADeeplyNestedConfigIsRefusedNotACrash) {
  const fs::path dir = writeRun(root_, RunSpec("s", "v", "topk", true, {{10, 0.5, 1000, 1.0}}));
  std::string deep = "study: \"s\"\n";
  for (int i = 0; i < 5000; ++i) deep += "variants { overrides { ";
  for (int i = 0; i < 5000; ++i) deep += "} } ";
  writeFileAtomic(dir / "config.textproto", deep);
  std::vector<std::string> warnings;
  const RunData run = loadRun(dir, warnings);
  EXPECT_FALSE(run.has_config);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings.front().find("recursion limit of 32"), std::string::npos) << warnings.front();
  EXPECT_NE(warnings.front().find("config not used"), std::string::npos) << warnings.front();
}

// A CSV reader for the round trip: quoted cells with doubled quotes, no newlines inside cells in what we write.
std::vector<std::vector<std::string>> parseCsv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells(1);
    bool quoted = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (quoted) {
        if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
          cells.back() += '"';
          ++i;
        } else if (c == '"') {
          quoted = false;
        } else {
          cells.back() += c;
        }
      } else if (c == '"') {
        quoted = true;
      } else if (c == ',') {
        cells.emplace_back();
      } else {
        cells.back() += c;
      }
    }
    rows.push_back(cells);
  }
  return rows;
}

class Formats : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = freshDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto study = knownStudy();
    study[4].error = "rank 2: \"bad\", payload | truncated";  // quotes, a comma and a pipe to escape
    for (const auto& s : study) writeRun(root_, s);
    runs_ = loadRuns({root_}, warnings_);
    c_ = compare(runs_, {}, warnings_);
  }
  fs::path root_;
  std::vector<std::string> warnings_;
  std::vector<RunData> runs_;
  Comparison c_;
};

TEST_F(Formats, CsvParsesBack) {
  const auto rows = parseCsv(toCsv(c_));
  ASSERT_EQ(rows.size(), 6u);
  const auto& h = rows[0];
  auto col = [&](const std::string& name) {
    const auto it = std::find(h.begin(), h.end(), name);
    EXPECT_NE(it, h.end()) << name;
    return static_cast<std::size_t>(it - h.begin());
  };
  for (const auto& r : rows) ASSERT_EQ(r.size(), h.size());
  EXPECT_EQ(rows[1][col("variant")], "topk");
  EXPECT_NEAR(std::stod(rows[1][col("bytes_to_target")]), 100 + 100 * (0.25 / 0.26), 1e-6);
  EXPECT_EQ(rows[1][col("ratio_vs_baseline")], "10");
  EXPECT_EQ(rows[3][col("variant")], "dense");
  EXPECT_EQ(rows[3][col("baseline")], "true");
  EXPECT_EQ(rows[3][col("bytes_to_target")], "2500");
  EXPECT_EQ(rows[4][col("reached_target")], "false");
  EXPECT_EQ(rows[4][col("bytes_to_target")], "");
  EXPECT_EQ(rows[5][col("state")], "failed");
  EXPECT_EQ(rows[5][col("error")], "rank 2: \"bad\", payload | truncated");
}

TEST_F(Formats, JsonParsesBack) {
  std::string error;
  auto j = parseJson(toJson(c_, {"w1"}), &error);
  ASSERT_TRUE(j) << error;
  EXPECT_DOUBLE_EQ(*getNumber(*j, "target"), 0.85);
  ASSERT_EQ(j->at("warnings").size(), 1u);
  const Json& study = j->at("studies").at(0);
  EXPECT_EQ(getString(study, "baseline"), "dense");
  const Json& rows = study.at("rows");
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(getString(rows[0], "variant"), "topk");
  EXPECT_DOUBLE_EQ(*getNumber(rows[0], "ratio_vs_baseline"), 10);
  EXPECT_DOUBLE_EQ(*getNumber(rows[2], "bytes_to_target"), 2500);
  EXPECT_TRUE(rows[2].at("baseline").get<bool>());
  EXPECT_TRUE(rows[3].at("bytes_to_target").is_null());  // not reached
  EXPECT_FALSE(rows[3].at("reached_target").get<bool>());
  EXPECT_EQ(getString(rows[4], "state"), "failed");
  EXPECT_EQ(getString(rows[4], "error"), "rank 2: \"bad\", payload | truncated");
}

TEST_F(Formats, MarkdownTableIsWellFormed) {
  const std::string md = toMarkdown(c_);
  std::istringstream in(md);
  std::string line;
  std::vector<std::string> table;
  while (std::getline(in, line))
    if (line.rfind("|", 0) == 0) table.push_back(line);
  ASSERT_EQ(table.size(), 7u) << md;  // header, rule, five rows
  auto cells = [](const std::string& l) {
    int n = 0;
    for (std::size_t i = 0; i < l.size(); ++i)
      if (l[i] == '|' && (i == 0 || l[i - 1] != '\\')) ++n;
    return n;
  };
  for (const auto& l : table) EXPECT_EQ(cells(l), cells(table[0])) << l;
  EXPECT_EQ(table[2].rfind("| topk |", 0), 0u) << table[2];
  EXPECT_NE(table[4].find("**dense** (baseline)"), std::string::npos);
  EXPECT_NE(table[4].find("| 1.00× |"), std::string::npos) << table[4];
  EXPECT_NE(table[4].find("| 0.0025 |"), std::string::npos) << table[4];  // 2500 B to target, in MB
  EXPECT_NE(table[5].find("not reached"), std::string::npos);
  EXPECT_NE(table[6].find("**failed**"), std::string::npos);
  EXPECT_NE(md.find("Baseline: `dense` (compressor none). Target accuracy 0.850."), std::string::npos) << md;
  EXPECT_NE(md.find("- `qsgd` failed: rank 2: \"bad\", payload \\| truncated"), std::string::npos) << md;
}

TEST_F(Formats, ProvenanceTables) {
  const std::string md = provenanceTableMarkdown(runs_);
  const std::string hash = sha256Hex(readText(root_ / "s" / "dense" / "config.textproto"));
  EXPECT_NE(md.find("| dense | completed | " + hash.substr(0, 12) + " | 0123456789ab |"), std::string::npos) << md;
  EXPECT_NE(md.find("none 1.0.0 (ABI v1, terse_compressor_none.so [build tree])"), std::string::npos) << md;
  // An allgather plugin's payloads have no wire dtype (core/plugin/compressor.h, wireDtypeText).
  EXPECT_NE(md.find("aggregation=allgather wire_dtype=- fixed_size=false stateful=false shared_seed=false "
                    "num_rounds=1 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("inproc, sync, 4 workers"), std::string::npos) << md;
  EXPECT_NE(md.find("bandwidth=1Gbps latency=50us"), std::string::npos) << md;
  std::string error;
  auto j = parseJson(provenanceTableJson(runs_, {}), &error);
  ASSERT_TRUE(j) << error;
  const Json& rows = j->at("runs");
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(getString(rows[0], "config_sha256"), hash);
  EXPECT_EQ(getString(rows[0], "host"), "testhost");
  const auto csv = parseCsv(provenanceTableCsv(runs_));
  ASSERT_EQ(csv.size(), 6u);
  for (const auto& r : csv) EXPECT_EQ(r.size(), csv[0].size());
}

}  // namespace
}  // namespace terse::results

namespace terse::results {
namespace {

namespace fs = std::filesystem;

// results/reference holds files written before JSON went through nlohmann-json (numbers as printf's %.17g): every
// one still parses, and its run folders load without a warning, their numbers to the same bits as strtod reads them.
TEST(ReferenceFolders, CommittedFilesStillRead) {
  const fs::path ref = fs::path(TERSE_TEST_SOURCE_DIR) / "results" / "reference";
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(ref)) {
    if (e.path().extension() != ".json") continue;
    ++files;
    std::string error;
    const auto doc = parseJson(readText(e.path()), &error);
    EXPECT_TRUE(doc) << e.path() << ": " << error;
    // Braced: gtest's EXPECT_* expand to an if/else, which an unbraced if around them makes ambiguous.
    if (doc && e.path().filename() == "compare.json") {
      EXPECT_FALSE(doc->at("studies").empty()) << e.path();
    }
    if (doc && e.path().parent_path() == ref / e.path().parent_path().filename() &&
        e.path().filename() == "provenance.json") {
      EXPECT_FALSE(doc->at("runs").empty()) << e.path();
    }
  }
  EXPECT_GE(files, 20);

  std::vector<std::string> w;
  const auto runs = loadRuns({ref / "simulation" / "runs"}, w);
  // Six results folders of one study and variant (quickstart/base): the one warning is that their rows are labelled
  // by the folder.
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("study 'quickstart', variant 'base': runs of that name from several results folders"),
            std::string::npos)
      << w[0];
  ASSERT_EQ(runs.size(), 6u);
  for (const auto& r : runs) {
    EXPECT_EQ(r.variant, "base (" + r.dir.parent_path().parent_path().filename().string() + ")") << r.dir;
    EXPECT_EQ(r.state, "completed") << r.dir;
    EXPECT_EQ(r.compressor, "none") << r.dir;
    ASSERT_TRUE(r.provenance) << r.dir;
    ASSERT_FALSE(r.points.empty()) << r.dir;
    const std::string first = readText(r.dir / "metrics.jsonl").substr(0, 2000);
    const auto at = first.find("\"test_accuracy\":");
    ASSERT_NE(at, std::string::npos);
    EXPECT_EQ(r.points.front().accuracy, std::strtod(first.c_str() + at + 16, nullptr)) << r.dir;
  }
}

// `terse compare --provenance` shows the parameters a plugin resolved, defaults included, and says when a plugin did
// not report them; folders from before the field existed show nothing there.
TEST(ProvenanceTable, ShowsResolvedParameters) {
  const fs::path root = freshDir("ProvenanceResolved");
  RunSpec reported("s", "reported", "qsgd", false, {{100, 0.5, 1000, 1.0}});
  reported.resolved = Params{{"levels", "15"}, {"bucket_size", "512"}};
  writeRun(root, reported);
  writeRun(root, RunSpec("s", "silent", "none", false, {{100, 0.5, 1000, 1.0}}));
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 2u) << joined(w);
  const std::string md = provenanceTableMarkdown(runs);
  EXPECT_NE(md.find("| resolved params |"), std::string::npos) << md;
  EXPECT_NE(md.find("| levels=15 bucket_size=512 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| defaults not reported |"), std::string::npos) << md;
  const auto j = parseJson(provenanceTableJson(runs, {}));
  ASSERT_TRUE(j);
  std::set<std::string> cells;
  for (const auto& r : j->at("runs")) cells.insert(getString(r, "resolved_params").value_or("?"));
  EXPECT_EQ(cells, (std::set<std::string>{"levels=15 bucket_size=512", "defaults not reported"}));
}

// A PyTorch hook's granularity (provenance.json's "hook", which the experiment schema has no field for) shows beside
// the transport and in its own column; a native run's provenance.json has no "hook" and no "module_files".
TEST(ProvenanceTable, ShowsTheHooksSettings) {
  const fs::path root = freshDir("ProvenanceHook");
  RunSpec hooked("s", "hooked", "topk", false, {{100, 0.5, 1000, 1.0}});
  hooked.hook = {{"granularity", "bucket"}};
  // A module workload's files are provenance.json's own object; the table shows the hook's digest over them.
  hooked.module_files = {{"model.py", "aa"}, {"pkg/layers.py", "bb"}};
  const fs::path hooked_dir = writeRun(root, hooked);
  const auto written = parseJson(readText(hooked_dir / "provenance.json"));
  ASSERT_TRUE(written);
  EXPECT_EQ(written->at("module_files").dump(), R"({"model.py":"aa","pkg/layers.py":"bb"})");
  const fs::path native = writeRun(root, RunSpec("s", "native", "none", false, {{100, 0.5, 1000, 1.0}}));
  EXPECT_EQ(readText(native / "provenance.json").find("\"hook\""), std::string::npos);
  EXPECT_EQ(readText(native / "provenance.json").find("\"module_files\""), std::string::npos);
  std::vector<std::string> w;
  const auto runs = loadRuns({root}, w);
  ASSERT_EQ(runs.size(), 2u) << joined(w);
  const std::string md = provenanceTableMarkdown(runs);
  EXPECT_NE(md.find("inproc, sync, 4 workers, hook granularity=bucket |"), std::string::npos) << md;
  EXPECT_NE(md.find("inproc, sync, 4 workers |"), std::string::npos) << md;
  const auto j = parseJson(provenanceTableJson(runs, {}));
  ASSERT_TRUE(j);
  std::set<std::string> cells;
  for (const auto& r : j->at("runs")) cells.insert(getString(r, "hook").value_or("?"));
  EXPECT_EQ(cells, (std::set<std::string>{"granularity=bucket", ""}));
  const auto csv = parseCsv(provenanceTableCsv(runs));
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[0].back(), "hook");
}

}  // namespace
}  // namespace terse::results
