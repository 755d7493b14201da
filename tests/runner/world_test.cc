// The rank as the unit of the runner (experiments/runner/world.h, rank_driver.h): the control channel's gather and
// allgather at odd sizes and with empty records, a record of the wrong size named by its rank, a World whose rank
// throws (every rank stops, the error names the rank, a comm error does not hide the root cause, a rank blocked in
// the evaluation collective is released), ranks' labels, a monitor beside the ranks and one that throws, and sync runs
// through the runner at one and three ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "experiments/runner/rank_driver.h"
#include "experiments/runner/world.h"
#include "tests/runner/runner_test_util.h"

namespace terse::runner {
namespace {

using namespace test_util;
using detail::ControlChannel;
using detail::ThreadWorld;

// A World of `n` threads, each with a control channel over its own in-process fabric; aborting a rank aborts the lot.
struct ControlJob {
  explicit ControlJob(int n) : links(comm::makeInprocTransports(n)), world(n) {
    for (auto& l : links) world.onAbort([t = l.get()](const std::string& reason) { t->abort(reason); });
  }
  std::vector<std::unique_ptr<comm::Transport>> links;
  ThreadWorld world;
};

TEST(ControlChannel, GathersAndAllgathersInRankOrderAtOddSizes) {
  for (const int n : {1, 2, 3, 5}) {
    ControlJob job(n);
    job.world.run([&](int r) {
      ControlChannel control(*job.links[static_cast<std::size_t>(r)]);
      for (int round = 0; round < 3; ++round) {  // each call takes the next tag: rounds never mix
        const std::vector<uint64_t> mine = {static_cast<uint64_t>(r), static_cast<uint64_t>(100 * round + r), 7};
        const auto gathered = control.gather(mine);
        if (r == 0) {
          ASSERT_EQ(gathered.size(), static_cast<std::size_t>(n));
          for (int q = 0; q < n; ++q) {
            EXPECT_EQ(gathered[static_cast<std::size_t>(q)],
                      (std::vector<uint64_t>{static_cast<uint64_t>(q), static_cast<uint64_t>(100 * round + q), 7}));
          }
        } else {
          EXPECT_TRUE(gathered.empty());
        }
        const auto all = control.allgather(mine);
        ASSERT_EQ(all.size(), static_cast<std::size_t>(n)) << "rank " << r;
        for (int q = 0; q < n; ++q)
          EXPECT_EQ(all[static_cast<std::size_t>(q)][1], static_cast<uint64_t>(100 * round + q));
        // Empty records: a barrier.
        const auto none = control.allgather({});
        ASSERT_EQ(none.size(), static_cast<std::size_t>(n));
        for (const auto& v : none) EXPECT_TRUE(v.empty());
        control.barrier();
      }
    });
  }
}

TEST(ControlChannel, ARecordOfAnotherSizeNamesItsRank) {
  ControlJob job(3);
  try {
    job.world.run([&](int r) {
      ControlChannel control(*job.links[static_cast<std::size_t>(r)]);
      const std::vector<uint64_t> mine(r == 2 ? 2 : 3, 1);
      control.gather(mine);
    });
    FAIL() << "a short record was accepted";
  } catch (const std::runtime_error& x) {
    const std::string what = x.what();
    EXPECT_NE(what.find("rank 0: "), std::string::npos) << what;  // rank 0 found it
    EXPECT_NE(what.find("control record from rank 2: 16 bytes, expected 24"), std::string::npos) << what;
  }
}

TEST(EvalSlot, RoundTripsThroughItsWords) {
  detail::EvalSlot s;
  s.wire_bytes = 1;
  s.payload_bytes = 2;
  s.control_bytes = 3;
  s.control_rounds = 4;
  s.checksum = 0xfedcba9876543210ULL;
  s.times = {0.5, 0.25, 0.125, 1.5, 0.75, 2.5};
  const auto words = s.words();
  const detail::EvalSlot t = detail::EvalSlot::fromWords(words);
  EXPECT_EQ(t.wire_bytes, 1u);
  EXPECT_EQ(t.payload_bytes, 2u);
  EXPECT_EQ(t.control_bytes, 3u);
  EXPECT_EQ(t.control_rounds, 4u);
  EXPECT_EQ(t.checksum, s.checksum);
  EXPECT_EQ(t.times.compute_s, s.times.compute_s);
  EXPECT_EQ(t.times.compress_s, s.times.compress_s);
  EXPECT_EQ(t.times.decompress_s, s.times.decompress_s);
  EXPECT_EQ(t.times.comm_s, s.times.comm_s);
  EXPECT_EQ(t.times.exposed_comm_s, s.times.exposed_comm_s);
  EXPECT_EQ(t.times.step_s, s.times.step_s);
  EXPECT_THROW(detail::EvalSlot::fromWords(std::span(words).first(10)), InvalidPayload);
}

// Rank 2 throws while ranks 0 and 1 wait in the evaluation collective for its slot: the World aborts them, every rank
// returns, and the error names rank 2 and says what it threw.
TEST(ThreadWorld, ARankThatThrowsMidCollectiveStopsEveryRankAndIsNamed) {
  for (const int n : {3, 4}) {
    ControlJob job(n);
    std::atomic<int> released{0};
    const auto start = std::chrono::steady_clock::now();
    try {
      job.world.run([&](int r) {
        ControlChannel control(*job.links[static_cast<std::size_t>(r)]);
        if (r == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are waiting by then
          throw std::invalid_argument("the compressor broke");
        }
        try {
          control.allgather(std::vector<uint64_t>(detail::EvalSlot::kWords, 1));
        } catch (const comm::CommError&) {
          ++released;
          throw;
        }
      });
      FAIL() << "the run should have failed";
    } catch (const std::runtime_error& x) {
      EXPECT_EQ(std::string(x.what()), "rank 2: the compressor broke");
    }
    EXPECT_EQ(released.load(), n - 1) << "every other rank's collective failed";
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  }
}

// A rank's comm error (the consequence) reported first does not hide another rank's own error (the cause).
TEST(ThreadWorld, TheRootCauseIsNotACommError) {
  ControlJob job(3);
  try {
    job.world.run([&](int r) {
      ControlChannel control(*job.links[static_cast<std::size_t>(r)]);
      if (r == 1) {
        job.links[1]->abort("rank 1 is going down");  // ranks 0 and 2 fail with a CommError first
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        throw std::invalid_argument("bad gradient");
      }
      control.allgather(std::vector<uint64_t>{1});
    });
    FAIL() << "the run should have failed";
  } catch (const std::runtime_error& x) {
    EXPECT_EQ(std::string(x.what()), "rank 1: bad gradient");
  }
}

TEST(ThreadWorld, RunsEveryRankOnceAndAsksNothingOfTheSimulation) {
  ThreadWorld world(5);
  EXPECT_EQ(world.localRanks(), (std::vector<int>{0, 1, 2, 3, 4}));
  std::vector<std::atomic<int>> ran(5);
  world.run([&](int r) { ++ran[static_cast<std::size_t>(r)]; });
  for (const auto& c : ran) EXPECT_EQ(c.load(), 1);
  int asides = 0;
  world.aside([&] { ++asides; });
  EXPECT_EQ(asides, 1);
  EXPECT_EQ(world.trainerSlowdown(2.5), 2.5);  // real time: the straggler's trainer sleeps
}

// A parameter server's names for its ranks, and the monitor beside them: it runs while the ranks do, and one that
// throws aborts the ranks (here waiting for a record that never comes) and its own error is the run's.
TEST(ThreadWorld, LabelsNameTheFailingRank) {
  ThreadWorld world(
      3, [](int r) { return r == 0 ? std::string("server shard 0 (rank 0)") : "worker " + std::to_string(r - 1); });
  try {
    world.run([](int r) {
      if (r == 2) throw std::invalid_argument("push refused");
    });
    FAIL() << "the run should have failed";
  } catch (const std::runtime_error& x) {
    EXPECT_EQ(std::string(x.what()), "worker 1: push refused");
  }
}

TEST(ThreadWorld, TheMonitorRunsBesideTheRanks) {
  ControlJob job(3);
  std::atomic<int> arrived{0};
  bool saw_all = false;
  job.world.run(
      [&](int r) {
        ++arrived;
        ControlChannel control(*job.links[static_cast<std::size_t>(r)]);
        control.barrier();
      },
      [&] {
        while (arrived.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        saw_all = true;
      });
  EXPECT_TRUE(saw_all);
}

TEST(ThreadWorld, AMonitorThatThrowsAbortsTheRanksAndIsTheError) {
  ControlJob job(3);
  try {
    job.world.run(
        [&](int r) {
          ControlChannel control(*job.links[static_cast<std::size_t>(r)]);
          if (r != 1) control.gather(std::vector<uint64_t>{1});  // rank 1 never sends: rank 0 waits until aborted
        },
        [] { throw std::invalid_argument("disk full"); });
    FAIL() << "the run should have failed";
  } catch (const std::invalid_argument& x) {
    EXPECT_EQ(std::string(x.what()), "disk full");
  }
}

TEST(ProcessWorld, IsOneRankAndTellsTheJobItsFailure) {
  detail::ProcessWorld world(3, 4, "node7");
  EXPECT_EQ(world.localRanks(), (std::vector<int>{3}));
  EXPECT_EQ(world.label(), "rank 3 (node7)");
  std::string told;
  world.onAbort([&](const std::string& reason) { told = reason; });
  int ran = -1;
  world.run([&](int r) { ran = r; });
  EXPECT_EQ(ran, 3);
  EXPECT_EQ(world.failed(std::runtime_error("disk full")), "disk full");
  EXPECT_EQ(told, "rank 3 (node7) failed: disk full");
}

// Sync runs through the runner at one and three ranks: the in-process ranks are SyncRankDrivers over a control channel.
TEST(Runner, SyncRunsAtOneAndThreeRanks) {
  auto loader = testLoader();
  const std::string compressor = "compressor { name: \"topk\" params { key: \"ratio\" value: \"0.25\" } }";
  const auto one = runStudy(loader, studyText(compressor, 1), freshDir("world_one"));
  const auto three = runStudy(loader, studyText(compressor, 3), freshDir("world_three"));
  ASSERT_FALSE(one.empty());
  ASSERT_FALSE(three.empty());
  EXPECT_EQ(getNumber(one.back(), "wire_bytes_per_worker"), 0);  // nobody to talk to
  EXPECT_GT(getNumber(three.back(), "wire_bytes_per_worker"), 0);
  // 480 examples, batch 16: 30 steps per epoch at one rank, 10 at three; records every 5 steps and per epoch.
  EXPECT_EQ(getNumber(one.back(), "step"), 60);
  EXPECT_EQ(getNumber(three.back(), "step"), 20);
  EXPECT_EQ(three.size(), 4u);
}

// A plugin that fails on rank 1 at step 12 of a three-rank run: the records before it stay, the error names rank 1.
TEST(Runner, AFailingRankOfThreeStopsTheRun) {
  auto loader = testLoader();
  std::string text = failAtStep12Study();
  text.replace(text.find("workers: 2"), 10, "workers: 3");
  expectFailsAtStep12(loader, text, freshDir("world_fail3"));
}

}  // namespace
}  // namespace terse::runner
