// The inproc transport's waiting (inproc_transport.h, "Waiting"): where its spin budget comes from (option, then
// TERSE_INPROC_SPIN_US, then the default), bad values refused naming themselves, no spin in simulated time or with
// emulated links, and a waiter that is woken whatever the budget -- parked at once, after a short spin, or spinning
// through the whole exchange -- for eager and rendezvous frames alike; when a thread's stalled spins make it park for a
// while (SpinStalls), and when such a thread holds its CPU before it parks; when a spinning thread leaves a CPU it
// shares with its peer (CpuSharing); and an eager send
// complete at once in real time, its receive's copy alone.
#include <gtest/gtest.h>
#include <sched.h>

#include <chrono>
#include <thread>

#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

using testing::envOf;

// A network that is never used: its presence alone makes the fabric a simulated one.
class UnusedNetwork final : public FrameNetwork {
 public:
  std::shared_ptr<Transfer> start(int, int, uint64_t) override { return nullptr; }
  void whenArrived(std::shared_ptr<Transfer>, int, std::function<void()>) override {}
};

InprocOptions withSpin(int us) {
  InprocOptions o;
  o.spin_us = us;
  return o;
}

TEST(InprocSpin, BudgetComesFromTheOptionThenTheEnvironmentThenTheDefault) {
  EXPECT_EQ(resolveInprocSpinUs(withSpin(7), envOf({{"TERSE_INPROC_SPIN_US", "20"}})), 7);
  EXPECT_EQ(resolveInprocSpinUs(withSpin(0), envOf({{"TERSE_INPROC_SPIN_US", "20"}})), 0);
  EXPECT_EQ(resolveInprocSpinUs(withSpin(-1), envOf({{"TERSE_INPROC_SPIN_US", "20"}})), 20);
  EXPECT_EQ(resolveInprocSpinUs(withSpin(-1), envOf({{"TERSE_INPROC_SPIN_US", "0"}})), 0);
  EXPECT_EQ(resolveInprocSpinUs(withSpin(-1), envOf({})), kDefaultInprocSpinUs);
  EXPECT_EQ(resolveInprocSpinUs(withSpin(kMaxSpinUs), envOf({})), kMaxSpinUs);
  // The tcp transport's variable is its own.
  EXPECT_EQ(resolveInprocSpinUs(withSpin(-1), envOf({{"TERSE_TCP_CALLER_SPIN_US", "0"}})), kDefaultInprocSpinUs);
  // What the fabric uses is what the options resolve to.
  EXPECT_EQ(InprocFabric::create(2, withSpin(13))->spinMicroseconds(), 13);
  EXPECT_EQ(InprocFabric::create(2, withSpin(0))->spinMicroseconds(), 0);
}

TEST(InprocSpin, BadValuesAreRefusedNamingThem) {
  for (const char* bad : {"5us", "", "-1", "1000001", "1e3", " 5"}) {
    try {
      resolveInprocSpinUs(withSpin(-1), envOf({{"TERSE_INPROC_SPIN_US", bad}}));
      FAIL() << "accepted TERSE_INPROC_SPIN_US='" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(
          std::string(e.what()).find("TERSE_INPROC_SPIN_US='" + std::string(bad) + "': expected 0 (off) or 1..1000000"),
          std::string::npos)
          << e.what();
    }
  }
  for (int bad : {-2, kMaxSpinUs + 1}) {
    try {
      resolveInprocSpinUs(withSpin(bad), envOf({}));
      FAIL() << "accepted spin_us " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("inproc transport: spin_us must be -1 (unset), 0 (off) or 1..1000000 "
                                           "microseconds, got " +
                                           std::to_string(bad)),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(InprocFabric::create(2, withSpin(-5)), InvalidArgument);
}

TEST(InprocSpin, OffInSimulatedTimeAndWithEmulatedLinks) {
  InprocOptions simulated = withSpin(500);
  simulated.network = std::make_shared<UnusedNetwork>();
  EXPECT_EQ(resolveInprocSpinUs(simulated, envOf({})), 0);
  simulated.spin_us = -1;
  EXPECT_EQ(resolveInprocSpinUs(simulated, envOf({{"TERSE_INPROC_SPIN_US", "500"}})), 0);
  EXPECT_EQ(InprocFabric::create(2, simulated)->spinMicroseconds(), 0);
  // A bad value is still refused there: a typo must not wait for a real-time run to show.
  EXPECT_THROW(resolveInprocSpinUs(simulated, envOf({{"TERSE_INPROC_SPIN_US", "fast"}})), InvalidArgument);

  InprocOptions emulated = withSpin(500);
  emulated.emulation = parseEmulation("bandwidth=10Gbps,latency=5us");
  EXPECT_EQ(resolveInprocSpinUs(emulated, envOf({})), 0);
  EXPECT_EQ(InprocFabric::create(2, emulated)->spinMicroseconds(), 0);
}

// Ping-pong between two threads under each budget: 0 parks at every wait (so every notify that matters must reach a
// parked waiter), 1 us spins briefly and then parks, the default, and a budget longer than the test that never parks
// (every wake-up must come through the event counter). Each round also has a late sender, so that the waits outlast
// a short spin. A lost wake-up hangs here (the ctest timeout), a wrong hand-over corrupts the bytes.
TEST(InprocSpin, WaitersAreWokenWhateverTheBudget) {
  const FrameMeta meta{OpKind::kP2P, 9, kNoTensor};
  for (int us : {0, 1, kDefaultInprocSpinUs, kMaxSpinUs}) {
    for (std::size_t size : {std::size_t{64}, std::size_t{256 * 1024}}) {  // eager, rendezvous
      auto fabric = InprocFabric::create(2, withSpin(us));
      ASSERT_EQ(fabric->spinMicroseconds(), us);
      auto a = fabric->endpoint(0);
      auto b = fabric->endpoint(1);
      constexpr int kRounds = 200;
      std::thread echo([&] {
        std::vector<std::byte> buf(size);
        for (int i = 0; i < kRounds; ++i) {
          b->recv(0, meta, buf);
          if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a late reply
          b->send(0, meta, buf);
        }
      });
      std::vector<std::byte> out(size), in(size);
      for (int i = 0; i < kRounds; ++i) {
        for (std::size_t k = 0; k < size; ++k)
          out[k] = static_cast<std::byte>((k * 7 + static_cast<std::size_t>(i)) & 0xFF);
        a->send(1, meta, out);
        a->recv(1, meta, in);
        ASSERT_EQ(in, out) << "budget " << us << " us, " << size << " bytes, round " << i;
      }
      echo.join();
    }
  }
}

// A rank waiting (spinning or parked) on a receive fails when the job is aborted, as it does without the spin.
TEST(InprocSpin, AbortReachesASpinningOrParkedWaiter) {
  for (int us : {0, kMaxSpinUs}) {
    auto fabric = InprocFabric::create(2, withSpin(us));
    auto a = fabric->endpoint(0);
    std::vector<std::byte> buf(16);
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      fabric->abort("stop");
    });
    EXPECT_THROW(a->recv(1, FrameMeta{OpKind::kP2P, 3, kNoTensor}, buf), CommError) << us;
    killer.join();
  }
}

// Short stalls (a yield that ran something else for longer than the budget) end the spin but do not make the thread
// park for a while, as a burst of them at a run's start must not; stalls adding up to 2 ms within the window do, for
// 10 ms, doubled each time up to 1 s and halved by progress. Stalls spread wider than the window never back off.
TEST(InprocSpin, StallsBackOffOnceTheyAddUpInAWindow) {
  using namespace std::chrono_literals;
  using C = SpinStalls::Clock;
  const C::duration budget = 50us;
  const C::time_point t0 = C::now();
  SpinStalls s;
  EXPECT_TRUE(s.maySpin(t0));
  EXPECT_FALSE(s.step(budget, budget, t0)) << "a step within the budget is no stall";
  // The start-of-run burst measured: 217, 50+, 50+, 54, 110 us.
  C::time_point t = t0;
  for (C::duration d : {217us, 51us, 51us, 54us, 110us}) {
    t += d;
    EXPECT_TRUE(s.step(d, budget, t));
    EXPECT_TRUE(s.maySpin(t)) << "a burst of short stalls backed off";
  }
  // Two time slices of a CPU hog: 1.3 ms each.
  t += 1300us;
  EXPECT_TRUE(s.step(1300us, budget, t));
  EXPECT_TRUE(s.maySpin(t));
  t += 1300us;
  EXPECT_TRUE(s.step(1300us, budget, t));
  EXPECT_FALSE(s.maySpin(t)) << "2.8 ms stalled within the window did not back off";
  EXPECT_EQ(s.backoff(), SpinStalls::kMinBackoff);
  EXPECT_TRUE(s.maySpin(t + SpinStalls::kMinBackoff));
  // Again at once: the next back-off doubles.
  const C::time_point t1 = t + 20ms;
  s.step(3ms, budget, t1);
  EXPECT_EQ(s.backoff(), 2 * SpinStalls::kMinBackoff);
  EXPECT_FALSE(s.maySpin(t1 + SpinStalls::kMinBackoff));
  s.progressed();
  EXPECT_EQ(s.backoff(), SpinStalls::kMinBackoff);
  // Stalls of 1 ms further apart than the window: each starts a new sum.
  SpinStalls spread;
  for (int i = 0; i < 10; ++i) {
    const C::time_point at = t0 + i * (SpinStalls::kStallWindow + 1ms);
    EXPECT_TRUE(spread.step(1ms, budget, at));
    EXPECT_TRUE(spread.maySpin(at)) << "stall " << i;
  }
  // Back-offs keep doubling to the cap.
  SpinStalls capped;
  for (int round = 0; round < 20; ++round) capped.step(5ms, budget, t0 + round * 2s);
  EXPECT_EQ(capped.backoff(), SpinStalls::kMaxBackoff);
}

// A spin step watches for its change between its pause hints: a change that came after the third look ends the step
// there, before the rest of the pauses and the yield; one that never comes is looked for after every pause and once
// more after the yield.
TEST(InprocSpin, ASpinStepSeesItsChangeBetweenPauseHints) {
  int looks = 0;
  EXPECT_TRUE(spinStepUntil([&] { return ++looks == 3; }));
  EXPECT_EQ(looks, 3) << "the step did not end at the look that found the change";
  looks = 0;
  EXPECT_FALSE(spinStepUntil([&] {
    ++looks;
    return false;
  }));
  EXPECT_EQ(looks, 9);
}

// A spin that keeps finding the thread it waits for on its own CPU moves, once the second time in a row and then at
// most every 100 ms; only the higher rank of the pair moves, and a peer on another CPU (or not known yet) resets the
// count.
TEST(InprocSpin, ASharedCpuIsLeftByTheHigherRankAtMostEvery100Ms) {
  using namespace std::chrono_literals;
  const auto t0 = CpuSharing::Clock::now();
  CpuSharing s;
  EXPECT_FALSE(s.spinEnded(1, 0, 3, 3, t0));
  EXPECT_TRUE(s.spinEnded(1, 0, 3, 3, t0)) << "the second shared spin in a row did not move";
  EXPECT_FALSE(s.spinEnded(1, 0, 5, 5, t0 + 1ms));
  EXPECT_FALSE(s.spinEnded(1, 0, 5, 5, t0 + 2ms)) << "moved again within 100 ms";
  EXPECT_TRUE(s.spinEnded(1, 0, 5, 5, t0 + 101ms));
  CpuSharing apart;
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(apart.spinEnded(1, 0, 3, 3, t0));
    EXPECT_FALSE(apart.spinEnded(1, 0, 2, 3, t0)) << "a peer on another CPU kept the count";
    EXPECT_FALSE(apart.spinEnded(1, 0, -1, 3, t0)) << "an unknown CPU counted as shared";
  }
  CpuSharing lower;
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(lower.spinEnded(0, 1, 3, 3, t0)) << "the lower rank moved";
}

// The move itself: the calling thread ends up on another allowed CPU and keeps the affinity it had. Where only one CPU
// is allowed it refuses and stays.
TEST(InprocSpin, MovingToAnotherCpuKeepsTheAffinity) {
  cpu_set_t before;
  CPU_ZERO(&before);
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  const int from = currentCpu();
  ASSERT_GE(from, 0);
  std::thread([&] {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
    const int start = currentCpu();
    if (CPU_COUNT(&mask) < 2) {
      EXPECT_FALSE(moveToAnotherCpu(start));
      return;
    }
    ASSERT_TRUE(moveToAnotherCpu(start));
    EXPECT_NE(currentCpu(), start) << "still on the CPU it left";
    cpu_set_t after;
    CPU_ZERO(&after);
    ASSERT_EQ(sched_getaffinity(0, sizeof after, &after), 0);
    EXPECT_TRUE(CPU_EQUAL(&after, &mask)) << "the affinity was not restored";
    // One CPU allowed: nowhere to go.
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(currentCpu(), &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    EXPECT_FALSE(moveToAnotherCpu(currentCpu()));
  }).join();
  EXPECT_FALSE(moveToAnotherCpu(-1));
  cpu_set_t now;
  CPU_ZERO(&now);
  ASSERT_EQ(sched_getaffinity(0, sizeof now, &now), 0);
  EXPECT_TRUE(CPU_EQUAL(&now, &before)) << "the test thread's affinity changed";
}

// A backed-off wait holds its CPU (a short spin without yielding) only where every rank has a CPU of its own: ranks
// no more than the creating thread's allowed CPUs, and the spin on.
TEST(InprocSpin, BackedOffWaitsHoldTheirCpuOnlyWhereEveryRankHasOne) {
  const int cpus = allowedCpus();
  ASSERT_GE(cpus, 1);
  EXPECT_EQ(InprocFabric::create(2, withSpin(kDefaultInprocSpinUs))->holdsWhenBackedOff(), cpus >= 2);
  EXPECT_EQ(InprocFabric::create(cpus, withSpin(kDefaultInprocSpinUs))->holdsWhenBackedOff(), true);
  EXPECT_FALSE(InprocFabric::create(cpus + 1, withSpin(kDefaultInprocSpinUs))->holdsWhenBackedOff());
  EXPECT_FALSE(InprocFabric::create(2, withSpin(0))->holdsWhenBackedOff()) << "held with the spin off";
  InprocOptions simulated = withSpin(kDefaultInprocSpinUs);
  simulated.network = std::make_shared<UnusedNetwork>();
  EXPECT_FALSE(InprocFabric::create(2, simulated)->holdsWhenBackedOff()) << "held in simulated time";
  // A thread bound to one CPU: two ranks would share it.
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(currentCpu(), &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    EXPECT_EQ(allowedCpus(), 1);
    EXPECT_FALSE(InprocFabric::create(2, withSpin(kDefaultInprocSpinUs))->holdsWhenBackedOff());
    EXPECT_TRUE(InprocFabric::create(1, withSpin(kDefaultInprocSpinUs))->holdsWhenBackedOff());
  }).join();
}

// Ping-pong with both threads backed off (as a CPU hog puts them): waits hold their CPU where the fabric says so and
// park otherwise, and every wake-up still arrives -- late replies outlast the held spin, so those waits end parked.
TEST(InprocSpin, BackedOffWaitersHoldThenParkAndAreWoken) {
  const FrameMeta meta{OpKind::kP2P, 11, kNoTensor};
  // Each thread on a CPU of its own where there are two (a held spin never waits for a peer on its own CPU), and
  // backed off.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const auto backOff = [&](int which) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[static_cast<std::size_t>(which) % cpus.size()], &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    SpinStalls& stalls = threadSpinStalls();
    while (stalls.backoff() < SpinStalls::kMaxBackoff) stalls.backOff(SpinStalls::Clock::now());
    ASSERT_FALSE(stalls.maySpin(SpinStalls::Clock::now()));
  };
  for (int ranks : {2, allowedCpus() + 1}) {
    for (std::size_t size : {std::size_t{64}, std::size_t{256 * 1024}}) {  // eager, rendezvous
      auto fabric = InprocFabric::create(ranks, withSpin(kDefaultInprocSpinUs));
      auto a = fabric->endpoint(0);
      auto b = fabric->endpoint(1);
      constexpr int kRounds = 200;
      std::thread echo([&] {
        backOff(1);
        std::vector<std::byte> buf(size);
        for (int i = 0; i < kRounds; ++i) {
          b->recv(0, meta, buf);
          if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a late reply
          b->send(0, meta, buf);
        }
      });
      std::thread main([&] {
        backOff(0);
        std::vector<std::byte> out(size), in(size);
        for (int i = 0; i < kRounds; ++i) {
          for (std::size_t k = 0; k < size; ++k)
            out[k] = static_cast<std::byte>((k * 5 + static_cast<std::size_t>(i)) & 0xFF);
          a->send(1, meta, out);
          a->recv(1, meta, in);
          ASSERT_EQ(in, out) << ranks << " ranks, " << size << " bytes, round " << i;
        }
        // The late replies alone make this thread wait past any spin's end.
        if (fabric->holdsWhenBackedOff())
          EXPECT_GT(threadSpinStalls().heldSpins(), 0u) << ranks << " ranks: no wait held its CPU";
        else
          EXPECT_EQ(threadSpinStalls().heldSpins(), 0u) << ranks << " ranks: a wait held a CPU another rank needs";
      });
      main.join();
      echo.join();
    }
  }
}

// In real time an eager frame's send is complete as isend returns, before any receive exists, and its bytes stay the
// frame's own: the sender may overwrite its buffer and drop the request at once, and the receive, posted later or
// already waiting, gets the bytes sent (copied alone, without telling a sender that no longer waits). A rendezvous
// frame's send is not complete until a receive has its bytes; with emulated links, not before its time.
TEST(InprocSpin, AnEagerSendIsCompleteAtOnceInRealTime) {
  const FrameMeta meta{OpKind::kP2P, 4, kNoTensor};
  for (int us : {0, kDefaultInprocSpinUs}) {
    auto fabric = InprocFabric::create(2, withSpin(us));
    auto a = fabric->endpoint(0);
    auto b = fabric->endpoint(1);
    std::vector<std::byte> out(1000, std::byte{7});
    {
      Request s = a->isend(1, meta, out);
      EXPECT_TRUE(s.test()) << "budget " << us;
    }
    std::fill(out.begin(), out.end(), std::byte{9});
    std::vector<float> sum(250, 1.0f);
    const std::vector<float> two(250, 2.0f);
    Request late = a->isend(1, meta, std::as_bytes(std::span(two)));
    EXPECT_TRUE(late.test());
    std::vector<std::byte> in(1000);
    EXPECT_EQ(b->recv(0, meta, in), 1000u);
    EXPECT_EQ(in, std::vector<std::byte>(1000, std::byte{7}));
    Request r = b->irecvReduce(0, meta, std::as_writable_bytes(std::span(sum)), DType::kF32);
    r.wait();
    EXPECT_EQ(r.bytes(), 1000u);
    EXPECT_EQ(sum, std::vector<float>(250, 3.0f));
    // Rendezvous: the sender's bytes are copied straight into the receive, so its send waits for one.
    std::vector<std::byte> big(fabric->options().eager_bytes + 1, std::byte{3});
    Request rs = a->isend(1, meta, big);
    EXPECT_FALSE(rs.test());
    std::vector<std::byte> got(big.size());
    b->recv(0, meta, got);
    rs.wait();
    EXPECT_EQ(got, big);
  }
  // Emulated links time every frame: an eager send of 1 MB/s completes after its bytes have been on the wire.
  InprocOptions slow;
  slow.emulation.link.bandwidth_bps = 8e6;
  auto fabric = InprocFabric::create(2, slow);
  auto a = fabric->endpoint(0);
  std::vector<std::byte> out(10000);
  Request s = a->isend(1, meta, out);
  EXPECT_FALSE(s.test()) << "an emulated 10 ms frame was sent at once";
  s.wait();
}

}  // namespace
}  // namespace terse::comm
