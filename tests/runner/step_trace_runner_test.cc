// step_trace: true end to end (core/train/step_trace.h, DESIGN.md section 7): a simulated in-process run of three
// ranks writes steps.rank<R>.jsonl per rank into each variant's folder (top-k and PowerSGD), the files read back
// through the strict reader, every rank has the same groups, the header says what the variant ran, and the compute
// segments add up to the metrics' compute; a two-rank `terse launch` over tcp writes them too; the field is refused
// where it cannot be honoured, naming it.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/common/json.h"
#include "core/train/step_trace.h"
#include "experiments/config/config.h"
#include "experiments/runner/runner.h"
#include "runner_test_util.h"

namespace terse::runner {
namespace {
using namespace test_util;

// Every rank's groups, step by step: seq, chunks and the collectives' ops (and allreduce bytes, the same everywhere).
std::string groupsOf(const train::TraceStep& s) {
  std::string out;
  for (const train::TraceGroup& g : s.groups) {
    out += std::to_string(g.seq) + ":";
    for (const auto& [t, c] : g.chunks) out += " t" + std::to_string(t) + "." + std::to_string(c);
    for (const train::TracePhase& p : g.phases) {
      if (p.kind != train::TracePhase::Kind::kCollective) continue;
      out += " " + p.op + "/" + p.algorithm;
      if (p.op == "allreduce") out += "=" + std::to_string(p.bytes);
    }
    out += "\n";
  }
  return out;
}

// Reads the `world` files of a variant's folder, checks what every configuration must hold, and returns them.
std::vector<train::StepTrace> readRanks(const fs::path& dir, int world, int64_t steps) {
  std::vector<train::StepTrace> traces;
  for (int r = 0; r < world; ++r) {
    const fs::path file = dir / ("steps.rank" + std::to_string(r) + ".jsonl");
    EXPECT_TRUE(fs::exists(file)) << file;
    if (!fs::exists(file)) return {};
    traces.push_back(train::readStepTrace(file));
    const train::StepTrace& t = traces.back();
    EXPECT_EQ(t.header.rank, r);
    EXPECT_EQ(t.header.world, world);
    EXPECT_EQ(t.header.source, "terse");
    EXPECT_EQ(static_cast<int64_t>(t.steps.size()), steps) << file;
  }
  for (int r = 1; r < world; ++r) {
    for (std::size_t s = 0; s < traces[0].steps.size() && s < traces[r].steps.size(); ++s)
      EXPECT_EQ(groupsOf(traces[r].steps[s]), groupsOf(traces[0].steps[s])) << "rank " << r << ", step " << s;
  }
  return traces;
}

// Three simulated ranks of the quickstart's MLP (smaller), a top-k and a PowerSGD variant.
std::string simulatedStudy(bool step_trace) {
  return std::string(
             "study: \"steps\"\n"
             "workload { name: \"mlp\" hidden_sizes: [32] }\n"
             "data { batch_size: 16 train_subset: 192 test_subset: 64 }\n"
             "optimizer { lr: 0.05 momentum: 0.9 }\n"
             "workers: 3\n"
             "epochs: 1\n"
             "eval { per_epoch: true }\n"
             "seed: 3\n") +
         (step_trace ? "step_trace: true\n" : "") +
         "clock: SIMULATED\n"
         "simulation { compute: FLOP_MODEL flops_per_second: 1e11 }\n"
         "link { bandwidth: \"10Gbps\" latency: \"50us\" }\n"
         "compressor { name: \"none\" }\n"
         "variants { name: \"topk\" overrides {\n"
         "  compressor { name: \"topk\" params { key: \"ratio\" value: \"0.01\" } }\n"
         "  error_feedback: true } }\n"
         "variants { name: \"powersgd\" overrides {\n"
         "  compressor { name: \"powersgd\" params { key: \"rank\" value: \"2\" } } } }\n";
}

TEST(StepTraceRun, SimulatedThreeRanksWriteOneTracePerRankPerVariant) {
  auto loader = testLoader();
  const std::string text = simulatedStudy(true);
  const fs::path root = freshDir("step_trace_sim");
  const auto study = experiments::loadStudyText(text, "unit.textproto", runnerConfigOptions(&loader));
  ASSERT_EQ(study.experiments.size(), 2u);
  for (const auto& e : study.experiments) {
    Runner runner(quietOptions(loader, root));
    const fs::path dir = runner.run(e).dir;
    const auto records = readMetrics(dir);
    ASSERT_EQ(records.size(), 1u);  // 192 examples over 3 workers of 16: 4 steps, one epoch
    const int64_t steps = 4;
    ASSERT_EQ(getNumber(records.back(), "step"), steps);
    const auto traces = readRanks(dir, 3, steps);
    ASSERT_EQ(traces.size(), 3u) << e.variant();
    const train::TraceHeader& h = traces[0].header;
    EXPECT_EQ(h.clock, "simulated");
    EXPECT_EQ(h.compute_model, "flops");
    EXPECT_EQ(h.workload, "mlp");
    EXPECT_EQ(h.scheduler, "fifo");
    EXPECT_EQ(h.allreduce_algorithm, "auto");
    EXPECT_EQ(h.compressor, e.variant() == "topk" ? "topk:ratio=0.01" : "powersgd:rank=2");
    EXPECT_EQ(h.layers, 2);
    EXPECT_EQ(h.tensors.size(), 4u);
    EXPECT_EQ(h.batch_size, 16);
    // The metrics' compute is the mean over ranks and steps of what the trainer measured; the segments tile it.
    double compute = 0;
    bool rounds = false, gathers = false;
    for (const auto& t : traces) {
      double previous_start = -1;
      for (const auto& s : t.steps) {
        EXPECT_GT(s.start_s, previous_start);
        previous_start = s.start_s;
        EXPECT_GT(s.step_s, 0);
        for (const auto& c : s.compute) compute += c.dur_s;
        for (const auto& g : s.groups) {
          int collectives = 0;
          for (const auto& p : g.phases) {
            collectives += p.kind == train::TracePhase::Kind::kCollective;
            gathers = gathers || p.op == "allgatherv";
          }
          rounds = rounds || collectives >= 2;
        }
      }
    }
    const double per_step = getNumber(records.back(), "compute_s_per_step").value_or(-1);
    ASSERT_GT(per_step, 0);
    EXPECT_NEAR(compute / (3.0 * steps), per_step, 1e-6 * per_step) << e.variant();
    // top-k gathers its pairs after a size exchange; PowerSGD's matrices go in two allreduce rounds.
    if (e.variant() == "topk") {
      EXPECT_TRUE(gathers);
    } else {
      EXPECT_TRUE(rounds);
    }
  }
}

TEST(StepTraceRun, RecordingChangesNothingTheRunReports) {
  // Under the FLOP model a simulated run's records are exact: the trace's extra clock readings must not move a thing.
  auto loader = testLoader();
  std::vector<std::vector<Json>> records;
  for (bool traced : {false, true}) {
    const auto study =
        experiments::loadStudyText(simulatedStudy(traced), "unit.textproto", runnerConfigOptions(&loader));
    Runner runner(quietOptions(loader, freshDir(traced ? "step_trace_on" : "step_trace_off")));
    records.push_back(readMetrics(runner.run(study.experiments.at(0)).dir));
  }
  ASSERT_EQ(records[0].size(), records[1].size());
  for (std::size_t i = 0; i < records[0].size(); ++i)
    for (const auto& [key, value] : records[0][i].items())
      EXPECT_EQ(records[1][i].at(key), value) << "record " << i << ", field " << key;
}

// Runs `terse ARGS` through the shell.
int runTerseCommand(const std::string& args, std::string& output) {
  const std::string cmd = std::string("'") + TERSE_TEST_TERSE_BIN + "' " + args + " 2>&1";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(StepTraceRun, TwoRanksOverTcpWriteOneTraceEach) {
  const fs::path dir = freshDir("step_trace_tcp");
  const fs::path config = dir / "tcp.textproto";
  std::ofstream(config) << studyText(
      "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.1\" } }\n"
      "error_feedback: true\ntransport: TCP\ntcp { timeout: \"5s\" }\nstep_trace: true\n");
  std::string out;
  const int rc = runTerseCommand("launch -n 2 -- '" + std::string(TERSE_TEST_TERSE_BIN) + "' run '" + config.string() +
                                     "' --out '" + (dir / "results").string() + "' --plugin-path '" +
                                     TERSE_TEST_BUILD_PLUGIN_DIR + "'",
                                 out);
  ASSERT_EQ(rc, 0) << out;
  const fs::path variant = dir / "results" / "unit" / "base";
  const auto records = readMetrics(variant);
  ASSERT_FALSE(records.empty());
  const auto steps = static_cast<int64_t>(getNumber(records.back(), "step").value_or(0));
  const auto traces = readRanks(variant, 2, steps);
  ASSERT_EQ(traces.size(), 2u);
  EXPECT_EQ(traces[0].header.clock, "real_time");
  EXPECT_EQ(traces[0].header.compute_model, "");
  EXPECT_EQ(traces[0].header.compressor, "topk:ratio=0.1");
  EXPECT_EQ(traces[0].header.workload, "linear_regression");
}

TEST(StepTraceRun, RefusedWhereItCannotBeHonouredNamingTheField) {
  const std::string base = studyText("compressor { name: \"none\" }");
  expectConfigError(base + "mode: ASYNC\nstep_trace: true\n",
                    "step_trace: step traces are recorded in mode SYNC only, got mode ASYNC");
  expectConfigError(base + "mode: SSP\nstep_trace: true\n", "step_trace: step traces are recorded in mode SYNC only");
}

}  // namespace
}  // namespace terse::runner
