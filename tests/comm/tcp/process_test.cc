// The tcp transport across processes: n forked ranks meet through a TcpStoreServer and run the collectives, checked bit
// for bit; a rank SIGKILLed mid-allreduce, and a rank SIGSTOPped (alive but silent), make every other rank fail within
// the timeout with a CommError naming the lost rank, instead of hanging.
#include <signal.h>

#include <array>
#include <numeric>

#include "tests/comm/tcp/tcp_test_util.h"

namespace terse::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<HostCommunicator> joinWorld(int rank, int n, Store& store, const JobToken& token,
                                            std::chrono::milliseconds timeout) {
  TcpOptions o = testing::tcpOptions(rank, n, timeout);
  HostCommOptions c;
  c.segment_bytes = 64 * 1024;
  return std::make_unique<HostCommunicator>(connectTcpTransport(o, token, store), c);
}

class TcpProcesses : public ::testing::TestWithParam<int> {};

TEST_P(TcpProcesses, CollectivesAcrossProcesses) {
  const int n = GetParam();
  const JobToken token = JobToken::generate();
  const auto results = testing::forkRanks(n, token, [&](int r, Store& store, std::string& out) {
    auto comm = joinWorld(r, n, store, token, std::chrono::seconds(20));
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{7}, (std::size_t{1} << 18) + 3}) {
        for (AllreduceAlgorithm algo : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRecursiveDoubling}) {
          std::vector<std::vector<std::byte>> in;
          for (int k = 0; k < n; ++k) in.push_back(testing::makeInput(k, count, dtype));
          const auto want = algo == AllreduceAlgorithm::kRing ? testing::expectedRing(in, count, dtype)
                                                              : testing::expectedRecursiveDoubling(in, count, dtype);
          auto buf = in[static_cast<std::size_t>(r)];
          if (algo == AllreduceAlgorithm::kRing) {
            comm->allreduce(buf.data(), count, dtype);  // the default picks the ring from 64 KiB on
            if (comm->algorithmFor(buf.size()) != AllreduceAlgorithm::kRing) continue;
          } else {
            if (comm->algorithmFor(buf.size()) == AllreduceAlgorithm::kRing) continue;
            comm->allreduce(buf.data(), count, dtype);
          }
          if (!testing::sameBytes(buf, want, dtype))
            throw std::runtime_error("allreduce of " + std::to_string(count) + " wrong");
        }
      }
    }
    std::vector<uint64_t> sizes;
    for (int k = 0; k < n; ++k) sizes.push_back(static_cast<uint64_t>(k) * 100003);  // rank 0 sends nothing
    std::vector<std::byte> all(std::accumulate(sizes.begin(), sizes.end(), uint64_t{0}));
    std::vector<std::byte> mine(sizes[static_cast<std::size_t>(r)], static_cast<std::byte>(r + 1));
    comm->allgatherv(mine, all, sizes);
    std::size_t off = 0;
    for (int k = 0; k < n; ++k)
      for (uint64_t i = 0; i < sizes[static_cast<std::size_t>(k)]; ++i)
        if (all[off++] != static_cast<std::byte>(k + 1)) throw std::runtime_error("allgatherv wrong");
    std::vector<std::byte> bc(12345, static_cast<std::byte>(r == n - 1 ? 7 : 0));
    comm->broadcast(bc, n - 1);
    for (auto b : bc)
      if (b != std::byte{7}) throw std::runtime_error("broadcast wrong");
    comm->barrier();
    out = "ok";
  });
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<std::size_t>(r)];
    EXPECT_TRUE(res.exited_ok()) << "rank " << r << ": " << res.text;
    EXPECT_EQ(res.text, "ok") << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, TcpProcesses, ::testing::Values(2, 3, 4));

// Survivors loop allreduces until one fails, and report how long the failing one took and its message.
void runUntilFailure(int r, int n, Store& store, const JobToken& token, std::chrono::milliseconds timeout,
                     std::string& out, int victim, int victim_signal) {
  auto comm = joinWorld(r, n, store, token, timeout);
  std::vector<float> buf(1 << 20, 1.0f);
  for (int iter = 0;; ++iter) {
    if (r == victim && iter == 3) {
      // Mid-allreduce: its frames are in flight when the signal lands.
      CommRequest q = comm->iallreduce(buf.data(), buf.size(), DType::kF32);
      raise(victim_signal);
      q.wait();
    }
    const auto begin = Clock::now();
    try {
      comm->allreduce(buf.data(), buf.size(), DType::kF32);
    } catch (const CommError& e) {
      const double s = std::chrono::duration<double>(Clock::now() - begin).count();
      out = std::to_string(s) + "|" + e.what();
      return;
    }
    if (iter > 1000) throw std::runtime_error("the lost rank was never noticed");
  }
}

void expectSurvivorsNamed(const std::vector<testing::ProcessResult>& results, int victim, double limit_s,
                          const std::vector<std::string>& details) {
  for (int r = 0; r < static_cast<int>(results.size()); ++r) {
    if (r == victim) continue;
    const auto& res = results[static_cast<std::size_t>(r)];
    EXPECT_TRUE(res.exited_ok()) << "rank " << r << " (status 0x" << std::hex << res.status << std::dec
                                 << "): " << res.text;
    const auto bar = res.text.find('|');
    ASSERT_NE(bar, std::string::npos) << "rank " << r << ": " << res.text;
    const double took = std::stod(res.text.substr(0, bar));
    const std::string message = res.text.substr(bar + 1);
    EXPECT_LT(took, limit_s) << "rank " << r << " noticed late: " << message;
    EXPECT_NE(message.find("rank " + std::to_string(victim) + " (host h" + std::to_string(victim) + ")"),
              std::string::npos)
        << "rank " << r << ": " << message;
    // Either this rank noticed itself, or it learned it from another survivor's abort notice: both name the rank.
    bool found = false;
    for (const auto& d : details) found = found || message.find(d) != std::string::npos;
    EXPECT_TRUE(found) << "rank " << r << ": " << message;
  }
}

TEST(TcpFaults, KilledRankFailsEveryOtherRankNamingIt) {
  const int n = 3, victim = 2;
  const auto timeout = std::chrono::milliseconds(2000);
  const JobToken token = JobToken::generate();
  const auto results = testing::forkRanks(n, token, [&](int r, Store& store, std::string& out) {
    runUntilFailure(r, n, store, token, timeout, out, victim, SIGKILL);
  });
  EXPECT_TRUE(WIFSIGNALED(results[victim].status));
  // A killed process's sockets are closed by the kernel: noticed at once, well within the timeout.
  // End of file or reset, depending on whether unread bytes were in its socket.
  expectSurvivorsNamed(results, victim, 2.0 + 1.0, {"without saying goodbye", "connection failed"});
}

TEST(TcpFaults, StoppedRankIsDetectedByTheHeartbeatTimeout) {
  const int n = 3, victim = 1;
  const auto timeout = std::chrono::milliseconds(1500);
  const JobToken token = JobToken::generate();
  const auto results = testing::forkRanks(n, token, [&](int r, Store& store, std::string& out) {
    runUntilFailure(r, n, store, token, timeout, out, victim, SIGSTOP);
  });
  EXPECT_TRUE(results[victim].stopped);
  // Silence is noticed after the timeout (plus one heartbeat period), never a hang.
  expectSurvivorsNamed(results, victim, 1.5 * 1.25 + 2.0, {"heartbeat timeout"});
}

TEST(TcpFaults, AnExpendableRankIsLostAloneAndTheOthersGoOn) {
  // The parameter server's workers are expendable (TcpOptions::expendable_ranks): rank 2 dies, rank 0 sees its
  // receive from it fail naming it, and ranks 0 and 1 keep talking.
  const int n = 3;
  const JobToken token = JobToken::generate();
  const auto results = testing::forkRanks(n, token, [&](int r, Store& store, std::string& out) {
    TcpOptions o = testing::tcpOptions(r, n, std::chrono::milliseconds(2000));
    o.expendable_ranks = {2};
    auto t = connectTcpTransport(o, token, store);
    const FrameMeta meta{OpKind::kP2P, 77, kNoTensor};
    std::array<std::byte, 4> buf{};
    if (r == 2) raise(SIGKILL);
    if (r == 0) {
      try {
        t->recv(2, meta, buf);
        out = "received from a dead rank";
        return;
      } catch (const CommError& e) {
        if (std::string(e.what()).find("rank 2") == std::string::npos ||
            std::string(e.what()).find("lost") == std::string::npos) {
          out = std::string("unexpected message: ") + e.what();
          return;
        }
      }
      if (t->aborted()) {
        out = "the job was aborted";
        return;
      }
      t->send(1, meta, buf);
      t->recv(1, meta, buf);
      out = "ok";
    } else {
      t->recv(0, meta, buf);
      t->send(0, meta, buf);
      out = "ok";
    }
  });
  EXPECT_TRUE(WIFSIGNALED(results[2].status));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[static_cast<std::size_t>(r)].exited_ok()) << "rank " << r;
    EXPECT_EQ(results[static_cast<std::size_t>(r)].text, "ok") << "rank " << r;
  }
}

}  // namespace
}  // namespace terse::comm
