// The tcp transport's busy polling (core/comm/tcp/transport.h, "Busy polling"): which of the option and
// TERSE_TCP_BUSY_POLL_US decides (off when neither asks), the variable's bad values, and transports that spin: exact
// data over many round trips, and a spinning wait that still wakes at once for a frame, an abort and a departed peer
// (an event it missed would hold it for the whole, long, budget). The transport's other behaviour tests run once more
// with spinning forced on (ctest's tcp_busy_poll_* entries, tests/comm/tcp/CMakeLists).
#include <algorithm>
#include <thread>

#include "core/comm/tcp/transport_detail.h"
#include "tests/comm/tcp/tcp_test_util.h"

namespace terse::comm {
namespace {

using BusyPollClock = std::chrono::steady_clock;

const FrameMeta kBusyPollP2P{OpKind::kP2P, 9, kNoTensor};

tcp::Clock::duration budgetOf(const Transport& t) {
  return dynamic_cast<const tcp::TcpTransport&>(t).busyPoll();
}

TEST(TcpBusyPoll, OptionThenEnvironmentElseOff) {
  TcpOptions o;
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({})), 0);  // off unless asked for
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({{"TERSE_TCP_BUSY_POLL_US", "0"}})), 0);
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({{"TERSE_TCP_BUSY_POLL_US", "75"}})), 75);
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({{"TERSE_TCP_BUSY_POLL_US", "1000000"}})), 1000000);
  // A value set in the options (a command-line flag, the runner's control transport) wins over the variable.
  o.busy_poll_us = 0;
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({{"TERSE_TCP_BUSY_POLL_US", "75"}})), 0);
  o.busy_poll_us = 12;
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({{"TERSE_TCP_BUSY_POLL_US", "0"}})), 12);
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({})), 12);
  // Emulated links never spin: the pacer sets their times.
  o.emulation.nic_egress_bps = 1e9;
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({})), 0);
  o.busy_poll_us = -1;
  EXPECT_EQ(resolveBusyPollUs(o, testing::envOf({{"TERSE_TCP_BUSY_POLL_US", "75"}})), 0);
}

TEST(TcpBusyPoll, BadValuesNameTheVariableOrTheField) {
  testing::expectBadValuesNamed(resolveBusyPollUs, "TERSE_TCP_BUSY_POLL_US",
                                {"", "fast", "50us", " 50", "-1", "-2", "1000001", "1e3", "99999999999999999999"},
                                [](TcpOptions& o, int v) { o.busy_poll_us = v; }, "busy_poll_us must be",
                                {-2, kMaxBusyPollUs + 1});
  // Checked even where emulation turns spinning off: a typo is not silently ignored.
  TcpOptions o;
  o.emulation.nic_egress_bps = 1e9;
  EXPECT_THROW((void)resolveBusyPollUs(o, testing::envOf({{"TERSE_TCP_BUSY_POLL_US", "x"}})), InvalidArgument);
  MemoryStore store;
  auto bad = testing::tcpOptions(0, 2);
  bad.busy_poll_us = -7;
  EXPECT_THROW(connectTcpTransport(bad, JobToken::generate(), store), InvalidArgument);
}

// The transports use what the resolution gives: under ctest's forced entries (TERSE_TCP_BUSY_POLL_US set) that is
// the variable's budget, so those entries do spin.
TEST(TcpBusyPoll, TransportsUseTheResolvedBudget) {
  MemoryStore store;
  const JobToken token = JobToken::generate();
  const TcpOptions o = testing::tcpOptions(0, 2);
  const auto expected = std::chrono::microseconds(resolveBusyPollUs(o, processEnv()));
  auto t = testing::connectTcpWorld(2, store, token);
  for (auto& x : t) EXPECT_EQ(budgetOf(*x), expected);
  if (const char* v = std::getenv("TERSE_TCP_BUSY_POLL_US"); v != nullptr) {
    EXPECT_EQ(expected, std::chrono::microseconds(std::stoi(v)));
  }
  MemoryStore store2;
  auto e = testing::connectTcpWorld(2, store2, token, [](TcpOptions& x) {
    x.busy_poll_us = 37;
    x.store_prefix = "e/";
  });
  for (auto& x : e) EXPECT_EQ(budgetOf(*x), std::chrono::microseconds(37));
}

// Ping-pong of small frames between a spinning rank (0) and a sleeping one (1), the receive posted before and after
// the frame arrives: every frame exact, and no wait of rank 0 lasts the budget (a missed event would: the wait then
// spins its whole budget before it looks again). One rank spins, not both: two spinning ranks are four busy threads,
// which on a 2-CPU CI machine under load starve the threads they wait for for longer than half a budget.
TEST(TcpBusyPoll, SpinningRoundTripsAreExactAndWakeOnTheFrame) {
  constexpr int kBudgetUs = kMaxBusyPollUs;  // 1 s: far above any round trip, so a wait that ran it out stands out
  MemoryStore store;
  const JobToken token = JobToken::generate();
  auto t = testing::connectTcpWorld(2, store, token, [](TcpOptions& x) {
    x.busy_poll_us = x.rank == 0 ? kBudgetUs : 0;
    x.caller_reads = 0;  // else rank 0's receives read their connection, asleep in poll(), and never spin
  });
  ASSERT_EQ(budgetOf(*t[0]), std::chrono::microseconds(kBudgetUs));
  ASSERT_EQ(budgetOf(*t[1]), std::chrono::microseconds(0));
  constexpr int kRounds = 20;
  std::vector<BusyPollClock::duration> longest(2);
  const testing::SpawnResult res = testing::spawnRanks(
      2,
      [&](int r) {
        Transport& me = *t[static_cast<std::size_t>(r)];
        const int peer = 1 - r;
        for (int i = 0; i < kRounds; ++i) {
          std::vector<std::byte> out(4096 + static_cast<std::size_t>(i)), in(out.size());
          for (std::size_t k = 0; k < out.size(); ++k) out[k] = static_cast<std::byte>((k * 7 + i + r) & 0xFF);
          // Rank 0 sends first; rank 1 answers. Every other round the receive is posted late (a staged frame).
          const bool early = i % 2 == 0;
          Request rr;
          if (early) rr = me.irecv(peer, kBusyPollP2P, in);
          if (r == 0) me.isend(peer, kBusyPollP2P, out).wait();
          if (!early) rr = me.irecv(peer, kBusyPollP2P, in);
          const auto begin = BusyPollClock::now();
          rr.wait();
          longest[static_cast<std::size_t>(r)] =
              std::max(longest[static_cast<std::size_t>(r)], BusyPollClock::now() - begin);
          if (r == 1) me.isend(peer, kBusyPollP2P, out).wait();
          for (std::size_t k = 0; k < in.size(); ++k)
            if (in[k] != static_cast<std::byte>((k * 7 + i + peer) & 0xFF))
              throw std::runtime_error("round " + std::to_string(i) + ": byte " + std::to_string(k) + " differs");
        }
      },
      nullptr, std::chrono::seconds(60));
  testing::expectNoErrors(res);
  EXPECT_LT(longest[0], std::chrono::microseconds(kBudgetUs / 2)) << "the spinning rank";
}

// A receive spinning for a frame that never comes fails at once when its rank aborts, and when the peer's transport
// is destroyed: the failures, not the budget, end the wait.
TEST(TcpBusyPoll, SpinningWaitFailsAtOnceOnAbortAndOnADepartedPeer) {
  constexpr int kBudgetUs = 1000000;
  // Caller reads off: the receive spins on its link's event counter instead of sleeping in poll() on the socket.
  testing::expectWaitEndsOnAbortAndOnADepartedPeer(
      [](TcpOptions& x) {
        x.busy_poll_us = kBudgetUs;
        x.caller_reads = 0;
      },
      std::chrono::microseconds(kBudgetUs / 2));
}

}  // namespace
}  // namespace terse::comm
