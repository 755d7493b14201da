// The sync trainer's step trace (SyncTrainerOptions::step_trace, core/train/step_trace.h) over several in-process
// ranks: every rank records the same groups (seq, chunks, collectives, allreduce bytes, every rank's gather sizes),
// a step's compute segments add up to the compute the trainer reports, the collectives' bytes are what the
// communicator counted, PowerSGD's rounds show as compress / allreduce pairs, top-k's gathers carry their size
// exchange, and odd world sizes, a one-element tensor, row-sparse tensors and groups in flight change none of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/common/runtime.h"
#include "core/compress/make_codec.h"
#include "core/plugin/loader.h"
#include "core/train/step_trace.h"
#include "core/train/sync_trainer.h"

namespace terse::train {
namespace {

PluginLoader traceLoader() {
  return PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
}

// Two layers with odd sizes and a one-element tensor: 37 x 3 and 1 in layer 0, 3 x 5 and 5 in layer 1. (A 0-element
// tensor cannot be had: Workload::addParam refuses a dimension of 0, so no trainer ever sees one; the file's empty
// tensor is step_trace_test.cc's.)
// Gradients depend on the rank's batch, so ranks disagree until averaged.
// With `sparse`, w0 is row-sparse (an embedding's shape): two rows of it per batch, the rank's own.
class OddWithEmpty : public Workload {
 public:
  explicit OddWithEmpty(bool sparse = false) {
    addParam("w0", {37, 3}, 0);
    addParam("b0", {1}, 0);
    addParam("w1", {3, 5}, 1);
    addParam("b1", {5}, 1);
    params()[0].row_sparse = sparse;
  }
  std::string_view name() const override { return "odd_with_empty"; }
  int64_t numTrainExamples() const override { return 120; }
  double forwardBackward(std::span<const int64_t> batch, const LayerReadyFn& ready) override {
    double first = batch.empty() ? 0.0 : static_cast<double>(batch[0]);
    for (int l = 0; l < numLayers(); ++l) awaitLayer(l);
    for (int l = numLayers() - 1; l >= 0; --l) {
      for (std::size_t t : layerTensors(l)) {
        auto& p = params()[t];
        for (std::size_t i = 0; i < p.numel(); ++i)
          p.grad[i] = static_cast<float>(std::sin(first + static_cast<double>(i)) * 0.1);
        if (p.row_sparse) {
          const auto a = static_cast<int64_t>(batch.empty() ? 0 : batch[0] % 37);
          p.grad_rows = {std::min(a, (a + 5) % 37), std::max(a, (a + 5) % 37)};
          for (int64_t row = 0; row < 37; ++row)
            if (row != p.grad_rows[0] && row != p.grad_rows[1]) std::fill_n(p.grad.begin() + row * 3, 3, 0.0f);
        }
      }
      reportLayer(ready, l);
    }
    return 1.0;
  }
  EvalResult evaluate(int64_t) override { return {}; }
  bool gatesLayers() const override { return true; }
};

struct TraceSpec {
  int world = 3;
  std::string compressor = "none";
  Params params;
  std::string scheduler = "fifo";
  Params scheduler_params;
  int max_in_flight = 1;
  bool sparse = false;  // w0 row-sparse, aggregated by RowSparseAllgather (SyncTrainerOptions::sparse_rows)
};

struct TraceOutcome {
  StepTrace trace;
  std::vector<StepRecord> records;
  comm::CommStats stats;
  std::string error;
};

std::vector<TraceOutcome> runTraced(const TraceSpec& spec) {
  auto l = traceLoader();
  auto compressor = l.loadCompressor(spec.compressor);
  auto scheduler = l.loadScheduler(spec.scheduler);
  auto transports = comm::makeInprocTransports(spec.world);
  std::vector<TraceOutcome> out(static_cast<std::size_t>(spec.world));
  const auto origin = rt::now();
  std::vector<rt::Thread> threads;
  for (int r = 0; r < spec.world; ++r) {
    threads.emplace_back(
        "rank " + std::to_string(r),
        [&, r] {
          TraceOutcome& res = out[static_cast<std::size_t>(r)];
          try {
            comm::HostCommunicator comm(std::move(transports[static_cast<std::size_t>(r)]));
            OddWithEmpty w(spec.sparse);
            auto instance = compressor->instantiate(spec.params);
            TraceHeader header;
            header.clock = "real_time";
            StepTraceRecorder recorder(header, origin);
            SyncTrainerOptions o;
            o.batch_size = 8;
            o.epochs = 1;
            o.seed = 3;
            o.lr.lr = 0.05;
            o.max_groups_in_flight = spec.max_in_flight;
            o.sparse_rows = spec.sparse;
            o.step_trace = &recorder;
            {
              SyncTrainer trainer(
                  w, comm,
                  [&](const TensorInfo& info) {
                    return std::make_unique<CompressionPipeline>(makeCodec(instance, info, 7, {}), comm);
                  },
                  o, scheduler->instantiate(spec.scheduler_params));
              while (!trainer.finished()) res.records.push_back(trainer.step());
            }
            // The trainer is gone: its threads are joined, every collective it ran is counted.
            res.trace = recorder.snapshot();
            res.stats = comm.stats();
          } catch (const std::exception& e) {
            res.error = e.what();
          }
        },
        r);
  }
  for (auto& t : threads) t.join();
  return out;
}

// The collective phases of a group, as (op, bytes) -- bytes left out for gathers, whose blocks differ by rank.
std::string shapeOf(const TraceGroup& g) {
  std::string s;
  for (const TracePhase& p : g.phases) {
    if (p.kind == TracePhase::Kind::kCompress) s += "c ";
    if (p.kind == TracePhase::Kind::kDecompress) s += "d ";
    if (p.kind == TracePhase::Kind::kCollective)
      s += p.op + "/" + p.algorithm + "/" + p.dtype + (p.op == "allreduce" ? ":" + std::to_string(p.bytes) : "") + " ";
  }
  return s;
}

// The checks every configuration must pass; `shapes`: the groups' shapes of rank 0, step 0, for further checks.
void checkTraces(const TraceSpec& spec, const std::vector<TraceOutcome>& out, std::vector<std::string>& shapes) {
  for (std::size_t r = 0; r < out.size(); ++r) ASSERT_EQ(out[r].error, "") << "rank " << r;
  const StepTrace& t0 = out[0].trace;
  const auto world = static_cast<std::size_t>(spec.world);
  for (std::size_t r = 0; r < world; ++r) {
    const StepTrace& t = out[r].trace;
    EXPECT_EQ(t.header.rank, static_cast<int>(r));
    EXPECT_EQ(t.header.world, spec.world);
    EXPECT_EQ(t.header.layers, 2);
    ASSERT_EQ(t.header.tensors.size(), 4u);
    EXPECT_EQ(t.header.tensors[1].elements, 1u);
    ASSERT_EQ(t.steps.size(), out[r].records.size()) << "rank " << r;
    ASSERT_EQ(t.steps.size(), t0.steps.size());
    uint64_t allreduce_bytes = 0, allreduce_ops = 0, gather_bytes = 0, gather_ops = 0;
    for (std::size_t s = 0; s < t.steps.size(); ++s) {
      const TraceStep& st = t.steps[s];
      const StepRecord& rec = out[r].records[s];
      EXPECT_EQ(st.step, rec.step);
      EXPECT_DOUBLE_EQ(st.step_s, rec.times.step_s);
      // The segments tile the step's compute: forward and backward of every layer, gate waits left out.
      double compute = 0;
      int forwards = 0, backwards = 0;
      std::vector<uint64_t> ready;
      for (const TraceCompute& c : st.compute) {
        compute += c.dur_s;
        (c.kind == TraceCompute::Kind::kForward ? forwards : backwards)++;
        ready.insert(ready.end(), c.ready.begin(), c.ready.end());
      }
      EXPECT_NEAR(compute, rec.times.compute_s, 1e-6) << "rank " << r << " step " << s;
      EXPECT_GE(forwards, 2);
      EXPECT_EQ(backwards, 2);
      std::sort(ready.begin(), ready.end());
      EXPECT_EQ(ready, (std::vector<uint64_t>{0, 1, 2, 3})) << "every tensor is made ready once";
      // The same groups on every rank: seq, chunks, elements, collectives and allreduce bytes; gathers agree on
      // every rank's block, and this rank's block is its own entry.
      const TraceStep& ref = t0.steps[s];
      ASSERT_EQ(st.groups.size(), ref.groups.size()) << "rank " << r << " step " << s;
      std::vector<uint64_t> updated;
      for (const TraceUpdate& u : st.updates) updated.push_back(u.tensor);
      std::sort(updated.begin(), updated.end());
      EXPECT_EQ(updated, (std::vector<uint64_t>{0, 1, 2, 3})) << "every tensor is updated once";
      for (std::size_t g = 0; g < st.groups.size(); ++g) {
        const TraceGroup& a = st.groups[g];
        const TraceGroup& b = ref.groups[g];
        EXPECT_EQ(a.seq, b.seq);
        EXPECT_EQ(a.chunks, b.chunks);
        EXPECT_EQ(a.chunk_elements, b.chunk_elements);
        EXPECT_EQ(shapeOf(a), shapeOf(b)) << "rank " << r << " step " << s << " group " << g;
        ASSERT_EQ(a.phases.size(), b.phases.size());
        for (std::size_t p = 0; p < a.phases.size(); ++p) {
          const TracePhase& ph = a.phases[p];
          if (ph.kind != TracePhase::Kind::kCollective) continue;
          EXPECT_FALSE(ph.algorithm.empty());
          EXPECT_NE(ph.algorithm, "auto") << "the algorithm as run, not as configured";
          if (ph.op == "allreduce") {
            allreduce_bytes += ph.bytes;
            ++allreduce_ops;
          } else if (ph.op == "allgatherv") {
            EXPECT_EQ(ph.rank_bytes, b.phases[p].rank_bytes);
            ASSERT_EQ(ph.rank_bytes.size(), world);
            EXPECT_EQ(ph.rank_bytes[r], ph.bytes);
            for (uint64_t x : ph.rank_bytes) gather_bytes += x;
            ++gather_ops;
          } else {
            EXPECT_EQ(ph.op, "allgather_sizes");
            EXPECT_EQ(ph.bytes, 8u);
            gather_bytes += 8 * world;
            ++gather_ops;
          }
        }
      }
    }
    // The negotiation's rounds, each by the algorithm that ran: as many on every rank (each is a collective of all;
    // a rank files a round under the step it last received a tensor of, which may differ between ranks at a step's
    // edge).
    const auto roundsOf = [](const StepTrace& x) {
      uint64_t n = 0;
      for (const TraceStep& st : x.steps) n += st.negotiations.size();
      return n;
    };
    const uint64_t rounds = roundsOf(t);
    for (const TraceStep& st : t.steps)
      for (const TraceNegotiation& n : st.negotiations) EXPECT_EQ(n.algorithm, "bruck");
    EXPECT_EQ(rounds, roundsOf(t0)) << "rank " << r;
    if (world > 1) {
      EXPECT_GT(rounds, 0u) << "rank " << r;
    }
    // The communicator's own count of what the callers asked for: the allreduces are the trace's, to the byte; the
    // gathers are the trace's and the negotiation's 8-byte words, to the op.
    const comm::OpStats& ar = out[r].stats.kind(comm::OpKind::kAllreduce);
    EXPECT_EQ(ar.bytes, allreduce_bytes) << "rank " << r;
    EXPECT_EQ(ar.ops, allreduce_ops) << "rank " << r;
    const comm::OpStats& ag = out[r].stats.kind(comm::OpKind::kAllgather);
    EXPECT_EQ(ag.ops, gather_ops + rounds) << "rank " << r;
    EXPECT_EQ(ag.bytes - gather_bytes, rounds * 8 * world) << "rank " << r;
  }
  for (const TraceGroup& g : t0.steps.at(0).groups) shapes.push_back(shapeOf(g));
}

TEST(SyncTrainerStepTrace, DenseAtThreeAndFiveRanksWithAOneElementTensor) {
  for (int world : {3, 5}) {
    TraceSpec spec;
    spec.world = world;
    std::vector<std::string> shapes;
    checkTraces(spec, runTraced(spec), shapes);
    ASSERT_FALSE(shapes.empty()) << world;
    // none sums f32 through one allreduce per group: compress, allreduce, decompress.
    for (const std::string& s : shapes) EXPECT_EQ(s.rfind("c allreduce/", 0), 0u) << s;
  }
}

TEST(SyncTrainerStepTrace, TopkGathersWithTheirSizeExchange) {
  TraceSpec spec;
  spec.world = 3;
  spec.compressor = "topk";
  spec.params = {{"ratio", "0.1"}};
  std::vector<std::string> shapes;
  checkTraces(spec, runTraced(spec), shapes);
  ASSERT_FALSE(shapes.empty());
  bool gathered = false;
  for (const std::string& s : shapes) gathered = gathered || s.find("allgatherv/") != std::string::npos;
  EXPECT_TRUE(gathered) << ::testing::PrintToString(shapes);
}

TEST(SyncTrainerStepTrace, PowerSgdShowsOneCompressAndAllreducePerRound) {
  TraceSpec spec;
  spec.world = 3;
  spec.compressor = "powersgd";
  spec.params = {{"rank", "2"}};
  std::vector<std::string> shapes;
  checkTraces(spec, runTraced(spec), shapes);
  ASSERT_FALSE(shapes.empty());
  // The 37 x 3 matrix goes in two rounds (P, then Q): compress and allreduce twice before the decompress.
  int two_rounds = 0;
  for (const std::string& s : shapes) {
    std::size_t pairs = 0, at = 0;
    while ((at = s.find("c allreduce/", at)) != std::string::npos) {
      ++pairs;
      ++at;
    }
    if (pairs >= 2) ++two_rounds;
  }
  EXPECT_GE(two_rounds, 1) << ::testing::PrintToString(shapes);
}

TEST(SyncTrainerStepTrace, GroupsInFlightKeepSeqOrderAndTheSameGroups) {
  TraceSpec spec;
  spec.world = 3;
  spec.scheduler = "fusion";
  spec.max_in_flight = 3;
  std::vector<std::string> shapes;
  checkTraces(spec, runTraced(spec), shapes);
  EXPECT_FALSE(shapes.empty());
}

TEST(SyncTrainerStepTrace, RowSparseTensorsAreAGroupWithTheirSizeExchangeAndGather) {
  for (int world : {3, 5}) {
    TraceSpec spec;
    spec.world = world;
    spec.sparse = true;
    std::vector<std::string> shapes;
    checkTraces(spec, runTraced(spec), shapes);
    ASSERT_FALSE(shapes.empty()) << world;
    // w0 (tensor 0) is aggregated outside the scheduler: its rows' encoding, the size exchange, then the gather of
    // every rank's rows, or, when the rows together outweigh the dense tensor twice, the dense f32 allreduce.
    int sparse_groups = 0;
    for (const std::string& s : shapes) {
      if (s.find("allgather_sizes/") == std::string::npos) continue;
      ++sparse_groups;
      EXPECT_TRUE(s.find("allgatherv/") != std::string::npos || s.find("allreduce/") != std::string::npos) << s;
    }
    EXPECT_EQ(sparse_groups, 1) << ::testing::PrintToString(shapes);
  }
}

}  // namespace
}  // namespace terse::train
