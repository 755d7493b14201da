// The step trace's file (core/train/step_trace.h): a trace written and read back is the same trace, bit for bit in
// its times; every kind of bad input the reader promises to refuse is refused with an InvalidArgument naming the file,
// the line and the field; the recorder files events by step, sorts groups by seq and keeps times relative to their
// step's start.
#include "core/train/step_trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/common/error.h"

namespace terse::train {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / "step_trace_test";
  fs::create_directories(dir);
  return dir / name;
}

// Two ranks, three tensors over two layers (one of them empty), one step with every kind of event: a fused allreduce
// group, a two-round group (PowerSGD's shape) and a variable-size gather with its size exchange.
StepTrace sample() {
  StepTrace t;
  t.header.rank = 1;
  t.header.world = 2;
  t.header.workload = "mlp";
  t.header.compressor = "topk:ratio=0.01";
  t.header.scheduler = "priority";
  t.header.allreduce_algorithm = "auto";
  t.header.allgather_algorithm = "auto";
  t.header.clock = "simulated";
  t.header.compute_model = "calibrated";
  t.header.batch_size = 32;
  t.header.layers = 2;
  t.header.tensors = {{0, "fc0.weight", 1000, 0}, {1, "fc0.bias", 0, 0}, {2, "fc1.weight", 333, 1}};
  for (int64_t s : {0, 3}) {
    TraceStep st;
    st.step = s;
    st.start_s = 0.1 * static_cast<double>(s) + 1.0 / 3.0;  // digits that need the shortest round trip
    st.step_s = 0.0123456789;
    st.compute = {{TraceCompute::Kind::kForward, 0, 0, 1e-3, {}},
                  {TraceCompute::Kind::kForward, 1, 1e-3, 2e-3, {}},
                  {TraceCompute::Kind::kBackward, 1, 3e-3, 4e-3, {2}},
                  {TraceCompute::Kind::kBackward, 0, 7e-3, 4e-3, {0, 1}}};
    TracePhase compress{TracePhase::Kind::kCompress, 7e-3, 1e-4, "", "", "", 0, {}};
    TracePhase reduce{TracePhase::Kind::kCollective, 7.1e-3, 2e-3, "allreduce", "ring", "f32", 4000, {}};
    TracePhase decompress{TracePhase::Kind::kDecompress, 9.1e-3, 1e-4, "", "", "", 0, {}};
    TracePhase sizes{TracePhase::Kind::kCollective, 3e-3, 1e-5, "allgather_sizes", "bruck", "u8", 8, {}};
    TracePhase gather{TracePhase::Kind::kCollective, 3.1e-3, 1e-3, "allgatherv", "ring", "u8", 120, {96, 120}};
    st.groups = {{4, {{2, 0}}, {333}, 3e-3, {compress, sizes, gather, decompress}},
                 {5, {{0, 0}, {1, 0}}, {1000, 0}, 7e-3, {compress, reduce, compress, reduce, decompress}}};
    st.updates = {{2, 4.2e-3, 1e-5}, {0, 9.3e-3, 2e-5}, {1, 9.32e-3, 0}};
    st.negotiations = {{2.9e-3, 1e-4, "bruck"}, {6.9e-3, 1e-4, "bruck"}};
    t.steps.push_back(st);
  }
  return t;
}

std::string linesOf(const StepTrace& t) {
  std::string text = stepTraceHeaderLine(t.header) + '\n';
  for (const TraceStep& s : t.steps) text += stepTraceStepLine(s) + '\n';
  return text;
}

std::string readAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(StepTrace, WrittenAndReadBackIsTheSameTrace) {
  const StepTrace t = sample();
  const fs::path p = scratch("roundtrip.jsonl");
  writeStepTrace(p, t);
  EXPECT_EQ(readAll(p), linesOf(t));
  const StepTrace back = readStepTrace(p);
  // The same lines again: every field, every time to the last bit (the writer's shortest round-trip digits).
  EXPECT_EQ(linesOf(back), linesOf(t));
  ASSERT_EQ(back.steps.size(), 2u);
  EXPECT_EQ(back.header.tensors.at(1).elements, 0u);
  EXPECT_EQ(back.steps[1].step, 3);
  EXPECT_EQ(back.steps[1].start_s, t.steps[1].start_s);
  const TraceGroup& g = back.steps[0].groups.at(0);
  EXPECT_EQ(g.chunks, (std::vector<std::pair<uint64_t, int>>{{2, 0}}));
  ASSERT_EQ(g.phases.size(), 4u);
  EXPECT_EQ(g.phases[2].op, "allgatherv");
  EXPECT_EQ(g.phases[2].rank_bytes, (std::vector<uint64_t>{96, 120}));
  EXPECT_EQ(back.steps[0].groups.at(1).phases.size(), 5u);
  EXPECT_EQ(back.steps[0].compute.at(3).ready, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(back.steps[0].updates.at(1).dur_s, 2e-5);
  ASSERT_EQ(back.steps[1].negotiations.size(), 2u);
  EXPECT_EQ(back.steps[1].negotiations[1].start_s, 6.9e-3);
  EXPECT_EQ(back.steps[1].negotiations[1].algorithm, "bruck");
}

// The file name and its inverse, which terse whatif and the results writer read folders with.
TEST(StepTrace, TheFileNameAndItsRank) {
  EXPECT_EQ(stepTraceFileName(7), "steps.rank7.jsonl");
  for (int rank : {0, 7, 1023, 999999999}) EXPECT_EQ(stepTraceFileRank(stepTraceFileName(rank)), rank);
  for (const char* name : {"steps.rank.jsonl", "steps.rankX.jsonl", "steps.rank-1.jsonl", "steps.rank1.json",
                           "trace.rank1.jsonl", "steps.rank1234567890.jsonl", "steps.rank1.jsonl.tmp", ""})
    EXPECT_FALSE(stepTraceFileRank(name)) << name;
}

TEST(StepTrace, TheHeaderLineIsTheDocumentedOne) {
  // DESIGN.md section 7 shows these lines: keep the example and the writer in step.
  const std::string h = stepTraceHeaderLine(sample().header);
  EXPECT_EQ(h.rfind("{\"format\":\"terse-step-trace\",\"version\":2,\"rank\":1,\"world\":2,\"mode\":\"sync\"", 0), 0u)
      << h;
}

// Writes the sample, lets `edit` change its text, and expects the reader to refuse it naming the file, the line (when
// > 0) and `what`.
void expectRefused(const std::string& name, const std::function<void(std::string&)>& edit, int line,
                   const std::string& what) {
  std::string text = linesOf(sample());
  edit(text);
  const fs::path p = scratch(name + ".jsonl");
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
  try {
    readStepTrace(p);
    ADD_FAILURE() << name << ": accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << name << ": " << msg;
    if (line > 0) {
      EXPECT_NE(msg.find("line " + std::to_string(line)), std::string::npos) << name << ": " << msg;
    }
    EXPECT_NE(msg.find(what), std::string::npos) << name << ": " << msg;
  }
}

// Replaces the first occurrence of `from` after the start of line `line` (1-based).
std::function<void(std::string&)> replaceOn(int line, const std::string& from, const std::string& to) {
  return [=](std::string& text) {
    std::size_t at = 0;
    for (int l = 1; l < line; ++l) at = text.find('\n', at) + 1;
    const std::size_t pos = text.find(from, at);
    ASSERT_NE(pos, std::string::npos) << from;
    text.replace(pos, from.size(), to);
  };
}

TEST(StepTrace, BadInputIsRefusedNamingFileLineAndField) {
  expectRefused("format", replaceOn(1, "terse-step-trace", "chrome-trace"), 1, "field 'format'");
  expectRefused("version", replaceOn(1, "\"version\":2", "\"version\":3"), 1,
                "field 'version' is 3; this build reads version 2 only");
  expectRefused(
      "truncated", [](std::string& t) { t.resize(t.size() - 20); }, 3, "truncated");
  expectRefused("not_json", replaceOn(2, "{\"step\":0", "{\"step\":0,,"), 2, "not a JSON object");
  expectRefused("missing", replaceOn(3, "\"step_s\":", "\"step_z\":"), 3, "field 'step_s' is missing");
  expectRefused("mistyped", replaceOn(2, "\"bytes\":4000", "\"bytes\":\"4000\""), 2,
                "field 'groups[1].phases[1].bytes' must be an unsigned integer");
  expectRefused("float_count", replaceOn(2, "\"bytes\":4000", "\"bytes\":4000.5"), 2,
                "field 'groups[1].phases[1].bytes' must be an unsigned integer");
  expectRefused("unknown_tensor", replaceOn(2, "\"chunks\":[[2,0]]", "\"chunks\":[[3,0]]"), 2,
                "field 'groups[0].chunks[0][0]' names tensor 3, not in the header (3 tensors)");
  expectRefused("unknown_ready", replaceOn(2, "\"ready\":[2]", "\"ready\":[7]"), 2,
                "field 'compute[2].ready[0]' names tensor 7");
  expectRefused("unknown_update", replaceOn(3, "{\"tensor\":2", "{\"tensor\":9"), 3, "field 'updates[0].tensor'");
  expectRefused("chunk_lengths", replaceOn(2, "\"chunk_elements\":[1000,0]", "\"chunk_elements\":[1000]"), 2,
                "field 'groups[1].chunk_elements' has 1 entries for 2 chunks");
  expectRefused("negative_time", replaceOn(2, "\"dur_s\":0.001", "\"dur_s\":-0.001"), 2,
                "field 'compute[0].dur_s' must be finite and >= 0");
  // Beyond a double: the parser's refusal (a non-finite time cannot be spelled in JSON otherwise).
  expectRefused("infinite_time", replaceOn(3, "\"issue_s\":0.003", "\"issue_s\":1e999"), 3, "number overflow");
  expectRefused("backwards", replaceOn(3, "{\"step\":3", "{\"step\":0"), 3,
                "field 'step' is 0, not after the previous line's 0");
  expectRefused("rank_bytes", replaceOn(2, "\"rank_bytes\":[96,120]", "\"rank_bytes\":[96,120,7]"), 2,
                "field 'groups[0].phases[2].rank_bytes' has 3 entries; an allgatherv needs one per rank (world 2)");
  expectRefused("rank_bytes_not_mine", replaceOn(2, "\"rank_bytes\":[96,120]", "\"rank_bytes\":[96,121]"), 2,
                "gives rank 1 121 bytes, but bytes is 120");
  expectRefused("op", replaceOn(2, "\"op\":\"allreduce\"", "\"op\":\"alltoall\""), 2,
                "field 'groups[1].phases[1].op' must be allreduce, allgatherv or allgather_sizes");
  expectRefused("negotiation_order", replaceOn(2, "{\"start_s\":0.0069", "{\"start_s\":0.0028"), 2,
                "field 'negotiations[1].start_s' is before the previous round's");
  expectRefused("negotiation_missing", replaceOn(3, "\"negotiations\":", "\"negotiationz\":"), 3,
                "field 'negotiations' is missing");
  expectRefused("groups_order", replaceOn(2, "{\"seq\":5", "{\"seq\":4"), 2, "field 'groups[1].seq' is 4");
  expectRefused("rank", replaceOn(1, "\"rank\":1", "\"rank\":2"), 1, "field 'rank' must be in [0, 1], got 2");
  expectRefused("tensor_ids", replaceOn(1, "{\"id\":1", "{\"id\":5"), 1, "field 'tensors[1].id' must be 1");
  expectRefused("layer", replaceOn(2, "\"kind\":\"forward\",\"layer\":1", "\"kind\":\"forward\",\"layer\":2"), 2,
                "field 'compute[1].layer' must be in [0, 1], got 2");
  expectRefused(
      "empty_line", [](std::string& t) { t += "\n"; }, 4, "not a JSON object");
  expectRefused(
      "empty_file", [](std::string& t) { t.clear(); }, 0, "the file is empty");
}

TEST(StepTrace, AMissingFileIsAClearError) {
  EXPECT_THROW(readStepTrace(scratch("absent.jsonl")), InvalidArgument);
  EXPECT_THROW(writeStepTrace(scratch("no/such/dir/x.jsonl"), sample()), InvalidArgument);
}

TEST(StepTraceRecorder, FilesEventsByStepInSeqOrderRelativeToTheirStep) {
  using Clock = StepTraceRecorder::Clock;
  const Clock::time_point origin{};
  const auto at = [&](double s) {
    return origin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  TraceHeader h;
  h.clock = "real_time";
  StepTraceRecorder r(h, origin);
  r.describe(0, 1, 8, 1, {{0, "w", 4, 0}});
  r.beginStep(0, at(1.0));
  r.compute(0, TraceCompute::Kind::kForward, 0, {at(1.0), at(1.5)});
  r.compute(0, TraceCompute::Kind::kBackward, 0, {at(1.5), at(2.0)}, {0});
  r.extendLastCompute(0, at(2.25));
  r.endStep(0, 1.5);
  r.beginStep(1, at(3.0));
  // Step 0's groups finish after step 1 began, and a lane finished seq 2 before seq 1.
  TraceGroup g2;
  g2.seq = 2;
  g2.chunks = {{0, 0}};
  g2.chunk_elements = {4};
  g2.phases.resize(1);
  TraceGroup g1 = g2;
  g1.seq = 1;
  r.group(0, g2, at(2.5), {{at(2.5), at(3.25)}});
  r.group(0, g1, at(2.0), {{at(2.0), at(2.5)}});
  r.update(0, 0, {at(3.25), at(3.5)});
  const StepTrace t = r.snapshot();
  EXPECT_EQ(t.header.batch_size, 8);
  ASSERT_EQ(t.steps.size(), 2u);
  const TraceStep& s = t.steps[0];
  EXPECT_DOUBLE_EQ(s.start_s, 1.0);
  EXPECT_DOUBLE_EQ(s.step_s, 1.5);
  ASSERT_EQ(s.compute.size(), 2u);
  EXPECT_DOUBLE_EQ(s.compute[1].start_s, 0.5);
  EXPECT_DOUBLE_EQ(s.compute[1].dur_s, 0.75);
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.groups[0].seq, 1u);
  EXPECT_DOUBLE_EQ(s.groups[0].issue_s, 1.0);
  EXPECT_DOUBLE_EQ(s.groups[1].phases[0].start_s, 1.5);
  EXPECT_DOUBLE_EQ(s.groups[1].phases[0].dur_s, 0.75);
  ASSERT_EQ(s.updates.size(), 1u);
  EXPECT_DOUBLE_EQ(s.updates[0].start_s, 2.25);
  EXPECT_DOUBLE_EQ(t.steps[1].start_s, 3.0);
  // What it records reads back.
  const fs::path p = scratch("recorded.jsonl");
  writeStepTrace(p, t);
  EXPECT_EQ(readStepTrace(p).steps.size(), 2u);
}

}  // namespace
}  // namespace terse::train
