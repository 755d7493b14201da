// The inproc transport's waiting (inproc_transport.h, "Waiting"): where its spin budget comes from (option, then
// TERSE_INPROC_SPIN_US, then the default), bad values refused naming themselves, no spin in simulated time or with
// emulated links, and a waiter that is woken whatever the budget -- parked at once, after a short spin, or spinning
// through the whole exchange -- for eager and rendezvous frames alike.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace terse::comm
