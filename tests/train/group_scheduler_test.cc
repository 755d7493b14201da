// The group scheduler (core/train/group_scheduler.h) on its own, without a trainer: ranks feed it gradients by hand in
// an order that is not the layers', in uneven batches (empty ones included) and at different paces, and a recording
// sink checks that every tensor of every step arrives once, averaged over the ranks, from the same groups on every
// rank (and in the same order with one group at a time), with 1 and 3 ranks, odd tensor sizes cut into odd chunks, and
// one or two groups in flight. A rank that gives up in the middle of a negotiation round, or a sink that throws, fails
// every rank's wait instead of hanging it; bad construction arguments are refused by name.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "core/compress/make_codec.h"
#include "core/plugin/loader.h"
#include "core/train/group_scheduler.h"

namespace terse::train {
namespace {

PluginLoader buildTreeLoader() {
  return PluginLoader::withSearchDirs({{TERSE_TEST_BUILD_PLUGIN_DIR, "build tree", true}});
}

// Tensors of 7, 1, 301, 13 and 1000 elements in layers 0, 0, 1, 2, 2: odd sizes, a layer of one, a tensor of one.
// Nothing runs forward or backward here: the test writes the gradients itself.
class HandFedWorkload final : public Workload {
 public:
  HandFedWorkload() {
    addParam("a", {7}, 0);
    addParam("b", {1}, 0);
    addParam("c", {7, 43}, 1);
    addParam("d", {13}, 2);
    addParam("e", {10, 100}, 2);
  }
  std::string_view name() const override { return "hand-fed"; }
  int64_t numTrainExamples() const override { return 0; }
  double forwardBackward(std::span<const int64_t>, const LayerReadyFn&) override {
    throw std::logic_error("the group scheduler test feeds gradients by hand");
  }
  EvalResult evaluate(int64_t) override { return {}; }
};

// What rank r puts into tensor t at step s: distinct per rank, step, tensor and element, exact in f32.
float gradientOf(int r, int64_t s, std::size_t t, std::size_t i) {
  return static_cast<float>(r * 4 + s * 2) + static_cast<float>(t) * 0.25f + static_cast<float>(i % 17) * 0.125f;
}

// Records what arrives; `fail_on` (step, tensor) throws there instead.
class RecordingSink final : public GradientSink {
 public:
  explicit RecordingSink(Workload& w) : workload_(w) {}
  std::vector<std::size_t> aggregated(int64_t step, double lr, std::vector<std::size_t> tensors) override {
    for (std::size_t t : tensors) {
      if (step == fail_step && t == fail_tensor) throw std::runtime_error("sink refused tensor " + std::to_string(t));
      arrivals.emplace_back(step, t);
      lrs.push_back(lr);
      values.push_back(workload_.params()[t].grad);
    }
    return tensors;
  }
  void aggregatedRows(int64_t, double, std::size_t, std::span<const int64_t>) override {
    ADD_FAILURE() << "no tensor here is row-sparse";
  }

  std::vector<std::pair<int64_t, std::size_t>> arrivals;
  std::vector<double> lrs;
  std::vector<std::vector<float>> values;
  int64_t fail_step = -1;
  std::size_t fail_tensor = 0;

 private:
  Workload& workload_;
};

struct Spec {
  int world = 3;
  int in_flight = 1;
  std::string scheduler = "priority";
  Params scheduler_params = {{"partition_bytes", "204"}, {"credit_bytes", "600"}};  // 51-element chunks
  int steps = 3;
};

struct RankRun {
  std::vector<std::pair<int64_t, std::size_t>> arrivals;
  std::vector<double> lrs;
  std::vector<std::vector<float>> values;
  std::vector<std::vector<IssuedGroup>> groups;  // per step
  std::vector<std::vector<std::size_t>> issue_orders;
  uint64_t negotiation_rounds = 0;
  std::string error;
};

// Ready order, the same on every rank as backward's is, but not the layers': batches of uneven size, an empty one.
const std::vector<std::vector<std::size_t>> kFeeds = {{4}, {}, {1, 3}, {2}, {}, {0}};

std::vector<RankRun> runRanks(const Spec& spec) {
  auto loader = buildTreeLoader();
  auto compressor = loader.loadCompressor("none")->instantiate({});
  auto scheduler = loader.loadScheduler(spec.scheduler);
  auto transports = comm::makeInprocTransports(spec.world);
  std::vector<RankRun> out(static_cast<std::size_t>(spec.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < spec.world; ++r) {
    threads.emplace_back([&, r] {
      RankRun& res = out[static_cast<std::size_t>(r)];
      try {
        comm::HostCommunicator comm(std::move(transports[static_cast<std::size_t>(r)]));
        HandFedWorkload w;
        RecordingSink sink(w);
        GroupSchedulerOptions o;
        o.max_groups_in_flight = spec.in_flight;
        GroupScheduler groups(
            w, comm,
            [&](const TensorInfo& info) {
              return std::make_unique<CompressionPipeline>(makeCodec(compressor, info, 7, {}), comm);
            },
            scheduler->instantiate(spec.scheduler_params), o, sink);
        groups.start();
        for (int64_t s = 0; s < spec.steps; ++s) {
          for (std::size_t t = 0; t < w.params().size(); ++t) {
            auto& g = w.params()[t].grad;
            for (std::size_t i = 0; i < g.size(); ++i) g[i] = gradientOf(r, s, t, i);
          }
          for (const auto& batch : kFeeds) {
            // Different paces per rank: the negotiation, not the timing, decides what every scheduler sees.
            std::this_thread::sleep_for(std::chrono::milliseconds((r * 3 + s) % 4));
            groups.feed(s, batch, 0.5 + static_cast<double>(s));
          }
          groups.awaitApplied(s);
          res.groups.push_back(groups.groups());
          res.issue_orders.push_back(groups.issueOrder());
        }
        res.negotiation_rounds = groups.counters().negotiation.rounds;
        res.arrivals = sink.arrivals;
        res.lrs = sink.lrs;
        res.values = sink.values;
      } catch (const std::exception& e) {
        res.error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void expectAveragedOnceInOneOrder(const Spec& spec) {
  const auto runs = runRanks(spec);
  const std::size_t tensors = HandFedWorkload().params().size();
  for (int r = 0; r < spec.world; ++r) {
    const RankRun& run = runs[static_cast<std::size_t>(r)];
    ASSERT_EQ(run.error, "") << "rank " << r;
    ASSERT_EQ(run.arrivals.size(), tensors * static_cast<std::size_t>(spec.steps)) << "rank " << r;
    for (int64_t s = 0; s < spec.steps; ++s) {
      std::vector<int> seen(tensors, 0);
      for (std::size_t k = 0; k < run.arrivals.size(); ++k) {
        const auto [step, t] = run.arrivals[k];
        if (step != s) continue;
        ++seen[t];
        EXPECT_EQ(run.lrs[k], 0.5 + static_cast<double>(s));
        const auto& v = run.values[k];
        for (std::size_t i = 0; i < v.size(); ++i) {
          double mean = 0;
          for (int q = 0; q < spec.world; ++q) mean += gradientOf(q, s, t, i);
          mean /= spec.world;
          ASSERT_NEAR(v[i], mean, 1e-5) << "rank " << r << " step " << s << " tensor " << t << " element " << i;
        }
      }
      for (std::size_t t = 0; t < tensors; ++t) EXPECT_EQ(seen[t], 1) << "rank " << r << " step " << s << " t" << t;
      // Every tensor started once.
      EXPECT_EQ(run.issue_orders[static_cast<std::size_t>(s)].size(), tensors);
    }
    // The same groups on every rank, and with one group at a time the same updates in the same order. With lanes a
    // group is applied as soon as it finishes here, which is a race between the lanes of each rank (sync_trainer.h,
    // "Groups in flight"): the order may differ, what each update is may not.
    if (spec.in_flight == 1) {
      EXPECT_EQ(run.arrivals, runs[0].arrivals) << "rank " << r;
    }
    ASSERT_EQ(run.groups.size(), runs[0].groups.size());
    for (std::size_t s = 0; s < run.groups.size(); ++s) {
      ASSERT_EQ(run.groups[s].size(), runs[0].groups[s].size()) << "rank " << r << " step " << s;
      for (std::size_t g = 0; g < run.groups[s].size(); ++g)
        EXPECT_EQ(run.groups[s][g].chunks, runs[0].groups[s][g].chunks) << "rank " << r << " step " << s;
    }
    if (spec.world == 1) {
      EXPECT_EQ(run.negotiation_rounds, 0u);
    } else {
      EXPECT_GT(run.negotiation_rounds, 0u);
    }
  }
  // The 10x100 tensor's rows are longer than the 51-element chunks: cut as asked, 20 chunks.
  std::size_t chunks_of_e = 0;
  for (const IssuedGroup& g : runs[0].groups[0])
    for (const auto& [t, c] : g.chunks) chunks_of_e += t == 4 ? 1 : 0;
  EXPECT_EQ(chunks_of_e, 20u);
}

TEST(GroupScheduler, ThreeRanksAverageEveryTensorOnceInOneOrder) {
  expectAveragedOnceInOneOrder(Spec{});
}

TEST(GroupScheduler, TwoGroupsInFlight) {
  Spec spec;
  spec.in_flight = 2;
  expectAveragedOnceInOneOrder(spec);
}

TEST(GroupScheduler, OneRankAndFifo) {
  Spec spec;
  spec.world = 1;
  spec.scheduler = "fifo";
  spec.scheduler_params = {};
  const auto runs = runRanks(spec);
  ASSERT_EQ(runs[0].error, "");
  // fifo sends whole tensors in ready order: the feed order, empty batches skipped.
  const std::vector<std::size_t> fed = {4, 1, 3, 2, 0};
  for (const auto& order : runs[0].issue_orders) EXPECT_EQ(order, fed);
  EXPECT_EQ(runs[0].negotiation_rounds, 0u);
}

// Runs body(rank, comm) on `world` ranks of in-process transports, each on a thread of its own; returns each rank's
// error message ("" when its body returned).
std::vector<std::string> onRanks(int world, const std::function<void(int, comm::HostCommunicator&)>& body) {
  auto transports = comm::makeInprocTransports(world);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::HostCommunicator comm(std::move(transports[static_cast<std::size_t>(r)]));
        body(r, comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Rank 2 feeds part of step 0 and then fails (as a forwardBackward that throws does): ranks 0 and 1, whose
// communication threads are in a negotiation round or a collective waiting for rank 2, must fail too, not hang.
TEST(GroupScheduler, ARankFailingMidRoundFailsEveryRank) {
  constexpr int kWorld = 3;
  auto loader = buildTreeLoader();
  auto compressor = loader.loadCompressor("none")->instantiate({});
  auto scheduler = loader.loadScheduler("priority");
  const auto errors = onRanks(kWorld, [&](int r, comm::HostCommunicator& comm) {
    HandFedWorkload w;
    RecordingSink sink(w);
    GroupScheduler groups(
        w, comm,
        [&](const TensorInfo& info) {
          return std::make_unique<CompressionPipeline>(makeCodec(compressor, info, 7, {}), comm);
        },
        scheduler->instantiate({{"partition_bytes", "204"}}), {}, sink);
    groups.start();
    if (r == 2) {
      const std::size_t first[] = {4};
      groups.feed(0, first, 0.1);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      groups.failFrom(std::make_exception_ptr(std::runtime_error("injected backward failure")),
                      "forwardBackward failed at step 0");
      EXPECT_TRUE(groups.failed());
    } else {
      for (const auto& batch : kFeeds) groups.feed(0, batch, 0.1);
    }
    groups.awaitApplied(0);
  });
  EXPECT_NE(errors[2].find("injected backward failure"), std::string::npos) << errors[2];
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[static_cast<std::size_t>(r)], "") << "rank " << r << " did not fail";
}

// A sink that throws (an optimizer's error) on one rank fails that rank by the sink's message and every other rank's
// wait, with one and with two groups in flight.
TEST(GroupScheduler, ASinkErrorFailsEveryRank) {
  for (const int in_flight : {1, 2}) {
    constexpr int kWorld = 3;
    auto loader = buildTreeLoader();
    auto compressor = loader.loadCompressor("none")->instantiate({});
    auto scheduler = loader.loadScheduler("fifo");
    const auto errors = onRanks(kWorld, [&](int r, comm::HostCommunicator& comm) {
      HandFedWorkload w;
      RecordingSink sink(w);
      if (r == 1) {
        sink.fail_step = 1;
        sink.fail_tensor = 2;
      }
      GroupSchedulerOptions o;
      o.max_groups_in_flight = in_flight;
      GroupScheduler groups(
          w, comm,
          [&](const TensorInfo& info) {
            return std::make_unique<CompressionPipeline>(makeCodec(compressor, info, 7, {}), comm);
          },
          scheduler->instantiate({}), o, sink);
      groups.start();
      for (int64_t s = 0; s < 3; ++s) {
        for (const auto& batch : kFeeds) groups.feed(s, batch, 0.1);
        groups.awaitApplied(s);
      }
    });
    EXPECT_NE(errors[1].find("sink refused tensor 2"), std::string::npos) << errors[1];
    EXPECT_NE(errors[0], "") << "in flight " << in_flight;
    EXPECT_NE(errors[2], "") << "in flight " << in_flight;
  }
}

TEST(GroupScheduler, RefusesBadArgumentsByName) {
  auto loader = buildTreeLoader();
  auto compressor = loader.loadCompressor("none")->instantiate({});
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  HandFedWorkload w;
  RecordingSink sink(w);
  const PipelineFactory none = [&](const TensorInfo& info) {
    return std::make_unique<CompressionPipeline>(makeCodec(compressor, info, 7, {}), comm);
  };
  const auto fifo = [&] { return loader.loadScheduler("fifo")->instantiate({}); };
  const auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgument");
  };
  EXPECT_NE(message([&] { GroupScheduler g(w, comm, none, nullptr, {}, sink); }).find("needs a scheduler"),
            std::string::npos);
  EXPECT_NE(message([&] { GroupScheduler g(w, comm, nullptr, fifo(), {}, sink); }).find("pipeline factory"),
            std::string::npos);
  GroupSchedulerOptions zero;
  zero.max_groups_in_flight = 0;
  EXPECT_NE(message([&] { GroupScheduler g(w, comm, none, fifo(), zero, sink); }).find("max_groups_in_flight"),
            std::string::npos);
  // A factory that answers for another tensor: the engine trusts the sizes, so this is caught here.
  const PipelineFactory wrong = [&](const TensorInfo& info) {
    TensorInfo other = info;
    other.tensor_id = info.tensor_id + 1;
    return std::make_unique<CompressionPipeline>(makeCodec(compressor, other, 7, {}), comm);
  };
  EXPECT_NE(message([&] { GroupScheduler g(w, comm, wrong, fifo(), {}, sink); }).find("was asked for tensor id 0"),
            std::string::npos);
  GroupScheduler g(w, comm, none, fifo(), {}, sink);
  g.start();
  EXPECT_NE(message([&] { g.awaitLayer(3, 0); }).find("awaited layer 3 of 3"), std::string::npos);
}

}  // namespace
}  // namespace terse::train
