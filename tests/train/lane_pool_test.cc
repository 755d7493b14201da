// The group scheduler's lanes on their own (core/train/lane_pool.h): one channel and engine per lane, none for one
// group at a time, a communicator without channels refused by name; every job runs once, on one lane, lanes run jobs
// side by side, stop() runs what was submitted before it, and each lane's channel carries its collectives to the same
// lane of the other ranks (3 ranks, jobs on ids chosen out of order).
#include "core/train/lane_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/host_communicator.h"
#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "tests/comm/comm_test_util.h"

namespace terse::train {
namespace {

struct Job {
  int id = 0;
};

// A communicator that runs one collective at a time, as NCCL's does here.
class NoChannels final : public comm::HostCommunicator {
 public:
  using HostCommunicator::HostCommunicator;
  std::unique_ptr<comm::CommChannel> openChannel() override { return nullptr; }
};

TEST(LanePool, OneLaneOrNoneForOneGroupAtATimeAndNoChannelsRefused) {
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  EXPECT_TRUE(openLanes(comm, 1).empty());
  EXPECT_TRUE(openLanes(comm, 0).empty());
  const std::vector<Lane> lanes = openLanes(comm, 3);
  ASSERT_EQ(lanes.size(), 3u);
  for (const Lane& l : lanes) {
    EXPECT_NE(l.channel, nullptr);
    EXPECT_NE(l.engine, nullptr);
  }
  NoChannels one(std::move(comm::makeInprocTransports(1)[0]));
  try {
    openLanes(one, 2);
    FAIL() << "a communicator without channels got lanes";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("max_groups_in_flight 2 needs a communicator that runs collectives side by "
                                         "side; the 'inproc' communicator runs one at a time (use 1)"),
              std::string::npos)
        << e.what();
  }
}

// Every job runs exactly once; three lanes hold three jobs at the same time (each waits until all three have started,
// which one lane at a time could never reach: the test would time out); stop() runs the jobs submitted before it.
TEST(LanePool, EveryJobRunsOnceLanesRunSideBySideStopDrains) {
  auto transports = comm::makeInprocTransports(1);
  comm::HostCommunicator comm(std::move(transports[0]));
  LanePool<Job> pool(comm, 3);
  ASSERT_EQ(pool.size(), 3u);
  std::mutex m;
  std::condition_variable cv;
  int running = 0;
  bool met = false;
  std::vector<int> ran;
  std::set<std::size_t> lanes_used;
  pool.start(
      [&](std::unique_ptr<Job> job, Lane& lane, std::size_t k) {
        std::unique_lock lock(m);
        EXPECT_NE(lane.channel, nullptr);
        if (job->id < 3) {
          ++running;
          cv.notify_all();
          met = cv.wait_for(lock, std::chrono::seconds(20), [&] { return running == 3; }) || met;
        }
        ran.push_back(job->id);
        lanes_used.insert(k);
      },
      0);
  for (int i = 0; i < 3; ++i) pool.submit(std::make_unique<Job>(Job{i}));
  for (int i = 3; i < 40; ++i) pool.submit(std::make_unique<Job>(Job{i}));
  pool.stop();
  EXPECT_TRUE(met) << "three jobs never ran at the same time";
  std::sort(ran.begin(), ran.end());
  std::vector<int> want(40);
  for (int i = 0; i < 40; ++i) want[static_cast<std::size_t>(i)] = i;
  EXPECT_EQ(ran, want);
  EXPECT_EQ(lanes_used, (std::set<std::size_t>{0, 1, 2}));
  pool.stop();  // idempotent
}

// 3 ranks, 2 lanes each: every job is an allreduce on the channel id it selects. The jobs go out in the same order on
// every rank (as the negotiation makes them), but which lane takes which is up to timing, so lane 0 of one rank may
// serve a job that lane 1 serves on another: the sums come out right only if the channels of one id meet.
TEST(LanePool, ChannelsCarryEachJobsCollectivesAcrossRanks) {
  constexpr int kJobs = 8;
  comm::testing::World world(3);
  world.runOk([&](int r, comm::HostCommunicator& comm) {
    LanePool<Job> pool(comm, 2);
    std::mutex m;
    std::vector<float> sums(kJobs, 0);
    pool.start(
        [&](std::unique_ptr<Job> job, Lane& lane, std::size_t) {
          lane.channel->select(static_cast<uint64_t>(job->id));
          std::vector<float> v(5 + static_cast<std::size_t>(job->id), static_cast<float>((r + 1) * job->id));
          lane.channel->allreduce(v.data(), v.size(), DType::kF32);
          std::lock_guard lock(m);
          sums[static_cast<std::size_t>(job->id)] = v.back();
        },
        r);
    for (int i = 0; i < kJobs; ++i) pool.submit(std::make_unique<Job>(Job{(i * 3 + 1) % kJobs}));
    pool.stop();
    for (int id = 0; id < kJobs; ++id)
      if (sums[static_cast<std::size_t>(id)] != 6.0f * static_cast<float>(id))
        throw std::runtime_error("job " + std::to_string(id) + " summed " +
                                 std::to_string(sums[static_cast<std::size_t>(id)]));
  });
}

}  // namespace
}  // namespace terse::train
