// The tcp transport's busy polling (core/comm/tcp/transport.h, "Busy polling"): the automatic rule as a function of
// CPUs and local ranks, which of option, TERSE_TCP_BUSY_POLL_US and the rule decides, the variable's bad values, and
// transports that spin: exact data over many round trips, and a spinning wait that still wakes at once for a frame,
// an abort and a departed peer (an event it missed would hold it for the whole, long, budget). The transport's other
// behaviour tests run once more with spinning forced on (ctest's tcp_busy_poll_* entries, tests/comm/tcp/CMakeLists).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "core/comm/tcp/transport_detail.h"
#include "tests/comm/tcp/tcp_test_util.h"

namespace terse::comm {
namespace {

using BusyPollClock = std::chrono::steady_clock;

const FrameMeta kBusyPollP2P{OpKind::kP2P, 9, kNoTensor};

EnvLookup busyPollEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Clock::duration budgetOf(const Transport& t) {
  return dynamic_cast<const tcp::TcpTransport&>(t).busyPoll();
}

TEST(TcpBusyPoll, AutomaticRuleWantsFourCpusPerLocalRank) {
  EXPECT_EQ(autoBusyPollUs(2, 1), 0);  // this CI machine: two vCPUs
  EXPECT_EQ(autoBusyPollUs(3, 1), 0);
  EXPECT_EQ(autoBusyPollUs(4, 1), kAutoBusyPollUs);
  EXPECT_EQ(autoBusyPollUs(16, 2), kAutoBusyPollUs);
  EXPECT_EQ(autoBusyPollUs(16, 4), kAutoBusyPollUs);  // issue 22's machine at 4 ranks
  EXPECT_EQ(autoBusyPollUs(15, 4), 0);
  EXPECT_EQ(autoBusyPollUs(16, 5), 0);
  EXPECT_EQ(autoBusyPollUs(8, 3), 0);
  EXPECT_EQ(autoBusyPollUs(4, 0), kAutoBusyPollUs);  // unknown local ranks count as one
}

// A container's CPU quota caps the CPUs the rule sees: quota / period, rounded up; none for "max" (-1 in cgroup v1).
TEST(TcpBusyPoll, CgroupQuotaInWholeCpus) {
  EXPECT_EQ(quotaCpus(-1, 100000), 0);
  EXPECT_EQ(quotaCpus(0, 100000), 0);
  EXPECT_EQ(quotaCpus(200000, 100000), 2);
  EXPECT_EQ(quotaCpus(150000, 100000), 2);
  EXPECT_EQ(quotaCpus(50000, 100000), 1);
  EXPECT_EQ(quotaCpus(1600000, 100000), 16);
  EXPECT_EQ(quotaCpus(100000, 0), 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int usable = usableCpuCount();
  EXPECT_GE(usable, 1);
  EXPECT_LE(usable, CPU_COUNT(&set));
}

// The quota read from a cgroup tree (a fake one in a temporary folder): v2's cpu.max on the process's cgroup or an
// ancestor, v1's cfs files in the cpu controller's hierarchy, the tightest one winning, and none where none is set.
TEST(TcpBusyPoll, CgroupQuotaFromTheProcessesCgroupAndItsAncestors) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("terse_busy_poll_cgroup_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  const auto put = [&](const std::filesystem::path& file, const std::string& text) {
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
  };
  const std::string fs = (root / "fs").string(), self = (root / "self").string();
  put(root / "self", "0::/job/rank");
  EXPECT_EQ(cgroupCpuQuota(self, fs), 0);  // no files at all
  put(root / "fs/job/rank/cpu.max", "max 100000");
  EXPECT_EQ(cgroupCpuQuota(self, fs), 0);
  put(root / "fs/job/cpu.max", "250000 100000");  // the parent's limit holds for the child
  EXPECT_EQ(cgroupCpuQuota(self, fs), 3);
  put(root / "fs/job/rank/cpu.max", "100000 100000");
  EXPECT_EQ(cgroupCpuQuota(self, fs), 1);
  put(root / "self", "12:cpu,cpuacct:/pod\n4:memory:/pod\n0::/other");
  EXPECT_EQ(cgroupCpuQuota(self, fs), 0);
  put(root / "fs/cpu,cpuacct/pod/cpu.cfs_quota_us", "-1");
  put(root / "fs/cpu,cpuacct/pod/cpu.cfs_period_us", "100000");
  EXPECT_EQ(cgroupCpuQuota(self, fs), 0);
  put(root / "fs/cpu,cpuacct/cpu.cfs_quota_us", "400000");  // the hierarchy's root (a container's own cgroup)
  put(root / "fs/cpu,cpuacct/cpu.cfs_period_us", "100000");
  EXPECT_EQ(cgroupCpuQuota(self, fs), 4);
  put(root / "fs/cpu,cpuacct/pod/cpu.cfs_quota_us", "garbage");
  EXPECT_EQ(cgroupCpuQuota(self, fs), 4);
  EXPECT_EQ(cgroupCpuQuota((root / "missing").string(), fs), 0);
  std::filesystem::remove_all(root);
}

TEST(TcpBusyPoll, OptionThenEnvironmentThenTheRule) {
  TcpOptions o;
  o.local_ranks = 2;
  const EnvLookup none = busyPollEnv({});
  EXPECT_EQ(resolveBusyPollUs(o, none, 8), kAutoBusyPollUs);
  EXPECT_EQ(resolveBusyPollUs(o, none, 7), 0);
  // The variable replaces the automatic choice, in both directions; -1 there is the rule again.
  EXPECT_EQ(resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", "0"}}), 64), 0);
  EXPECT_EQ(resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", "75"}}), 2), 75);
  EXPECT_EQ(resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", "-1"}}), 8), kAutoBusyPollUs);
  EXPECT_EQ(resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", "1000000"}}), 2), 1000000);
  // A value set in the options (a command-line flag, the runner's control transport) wins over the variable.
  o.busy_poll_us = 0;
  EXPECT_EQ(resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", "75"}}), 64), 0);
  o.busy_poll_us = 12;
  EXPECT_EQ(resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", "0"}}), 2), 12);
  // Emulated links never spin: the pacer sets their times.
  o.emulation.nic_egress_bps = 1e9;
  EXPECT_EQ(resolveBusyPollUs(o, none, 64), 0);
  o.busy_poll_us = -1;
  EXPECT_EQ(resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", "75"}}), 64), 0);
}

TEST(TcpBusyPoll, LocalRanksComeFromTheJobWhenNotGiven) {
  TcpOptions o;  // local_ranks 0
  const auto job = [](const char* local) {
    return busyPollEnv({{"TERSE_RANK", "0"},
                        {"TERSE_WORLD_SIZE", "8"},
                        {"TERSE_LOCAL_WORLD_SIZE", local},
                        {"TERSE_MASTER_PORT", "29500"}});
  };
  EXPECT_EQ(resolveBusyPollUs(o, job("4"), 16), kAutoBusyPollUs);
  EXPECT_EQ(resolveBusyPollUs(o, job("4"), 15), 0);
  EXPECT_EQ(resolveBusyPollUs(o, job("2"), 8), kAutoBusyPollUs);
  EXPECT_EQ(resolveBusyPollUs(o, busyPollEnv({}), 4), kAutoBusyPollUs);  // no launcher: one rank
  o.local_ranks = 4;                                                     // given: the environment is not asked
  EXPECT_EQ(resolveBusyPollUs(o, job("1"), 8), 0);
}

TEST(TcpBusyPoll, BadValuesNameTheVariableOrTheField) {
  TcpOptions o;
  o.local_ranks = 1;
  for (const char* bad : {"", "fast", "50us", " 50", "-2", "1000001", "1e3", "99999999999999999999"}) {
    try {
      (void)resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", bad}}), 64);
      ADD_FAILURE() << "accepted TERSE_TCP_BUSY_POLL_US='" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("TERSE_TCP_BUSY_POLL_US='" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
  // Checked even where emulation turns spinning off: a typo is not silently ignored.
  o.emulation.nic_egress_bps = 1e9;
  EXPECT_THROW((void)resolveBusyPollUs(o, busyPollEnv({{"TERSE_TCP_BUSY_POLL_US", "x"}}), 64), InvalidArgument);
  o.emulation = {};
  for (int bad : {-2, kMaxBusyPollUs + 1}) {
    o.busy_poll_us = bad;
    try {
      (void)resolveBusyPollUs(o, busyPollEnv({}), 64);
      ADD_FAILURE() << "accepted busy_poll_us " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("busy_poll_us must be"), std::string::npos) << e.what();
    }
  }
  o.busy_poll_us = -1;
  o.local_ranks = -1;
  EXPECT_THROW((void)resolveBusyPollUs(o, busyPollEnv({}), 64), InvalidArgument);
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
  const auto expected = std::chrono::microseconds(resolveBusyPollUs(o, processEnv(), usableCpuCount()));
  auto t = testing::connectTcpWorld(2, store, token);
  for (auto& x : t) EXPECT_EQ(budgetOf(*x), expected);
  if (const char* v = std::getenv("TERSE_TCP_BUSY_POLL_US"); v != nullptr && std::string(v) != "-1") {
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
  auto t =
      testing::connectTcpWorld(2, store, token, [](TcpOptions& x) { x.busy_poll_us = x.rank == 0 ? kBudgetUs : 0; });
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
  for (bool abort_it : {true, false}) {
    MemoryStore store;
    const JobToken token = JobToken::generate();
    auto t = testing::connectTcpWorld(2, store, token, [](TcpOptions& x) { x.busy_poll_us = kBudgetUs; });
    std::vector<std::byte> in(64);
    Request rr = t[0]->irecv(1, kBusyPollP2P, in);
    std::thread other([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      if (abort_it) {
        t[0]->abort("the test aborts a spinning wait");
      } else {
        t[1].reset();  // its goodbye: rank 1 has left
      }
    });
    const auto begin = BusyPollClock::now();
    std::string message;
    try {
      rr.wait();
    } catch (const CommError& e) {
      message = e.what();
    }
    const auto took = BusyPollClock::now() - begin;
    other.join();
    EXPECT_NE(message, "") << "the wait did not fail (abort " << abort_it << ")";
    const std::string why = abort_it ? "the test aborts a spinning wait" : "rank 1 (host h1)";
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_LT(took, std::chrono::microseconds(kBudgetUs / 2)) << message;
  }
}

}  // namespace
}  // namespace terse::comm
