// The tcp transport across processes: n forked ranks meet through a TcpStoreServer and run the collectives, checked bit
// for bit; a rank SIGKILLed mid-allreduce, and a rank SIGSTOPped (alive but silent), make every other rank fail within
// the timeout (+5%, measured from the signal) with a CommError naming the lost rank, instead of hanging.
#include <signal.h>
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstdio>
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
        std::vector<std::vector<std::byte>> in;
        for (int k = 0; k < n; ++k) in.push_back(testing::makeInput(k, count, dtype));
        auto buf = in[static_cast<std::size_t>(r)];
        // The default (auto) picks by size; its choice is replayed.
        const auto want = testing::expectedFor(comm->algorithmFor(buf.size()), in, count, dtype);
        comm->allreduce(buf.data(), count, dtype);
        if (!testing::sameBytes(buf, want, dtype))
          throw std::runtime_error("allreduce of " + std::to_string(count) + " wrong");
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

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// The moment the victim was signalled, written by the victim and read by the parent: steady_clock is CLOCK_MONOTONIC,
// one clock for every process of the host.
class FaultTime {
 public:
  FaultTime()
      : ns_(static_cast<std::atomic<int64_t>*>(
            mmap(nullptr, sizeof(std::atomic<int64_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    if (ns_ == MAP_FAILED) throw std::runtime_error("mmap failed");
    new (ns_) std::atomic<int64_t>(0);
  }
  ~FaultTime() { munmap(ns_, sizeof(std::atomic<int64_t>)); }
  void mark() { ns_->store(nowNs()); }
  int64_t ns() const { return ns_->load(); }

 private:
  std::atomic<int64_t>* ns_;
};

// Survivors loop allreduces until one fails, and report when it failed and its message; the victim marks the moment
// it is signalled.
void runUntilFailure(int r, int n, Store& store, const JobToken& token, std::chrono::milliseconds timeout,
                     std::string& out, int victim, int victim_signal, FaultTime& fault) {
  auto comm = joinWorld(r, n, store, token, timeout);
  std::vector<float> buf(1 << 20, 1.0f);
  for (int iter = 0;; ++iter) {
    if (r == victim && iter == 3) {
      // Mid-allreduce: its frames are in flight when the signal lands.
      CommRequest q = comm->iallreduce(buf.data(), buf.size(), DType::kF32);
      fault.mark();
      raise(victim_signal);
      q.wait();
    }
    try {
      comm->allreduce(buf.data(), buf.size(), DType::kF32);
    } catch (const CommError& e) {
      out = std::to_string(nowNs()) + "|" + e.what();
      return;
    }
    if (iter > 1000) throw std::runtime_error("the lost rank was never noticed");
  }
}

// Every survivor failed within `limit_s` of the fault, naming the victim.
void expectSurvivorsNamed(const std::vector<testing::ProcessResult>& results, int victim, const FaultTime& fault,
                          double limit_s, const std::vector<std::string>& details) {
  ASSERT_NE(fault.ns(), 0) << "the victim never reached its fault";
  for (int r = 0; r < static_cast<int>(results.size()); ++r) {
    if (r == victim) continue;
    const auto& res = results[static_cast<std::size_t>(r)];
    EXPECT_TRUE(res.exited_ok()) << "rank " << r << " (status 0x" << std::hex << res.status << std::dec
                                 << "): " << res.text;
    const auto bar = res.text.find('|');
    ASSERT_NE(bar, std::string::npos) << "rank " << r << ": " << res.text;
    const double took = static_cast<double>(std::stoll(res.text.substr(0, bar)) - fault.ns()) / 1e9;
    const std::string message = res.text.substr(bar + 1);
    EXPECT_LT(took, limit_s) << "rank " << r << " noticed late: " << message;
    std::printf("rank %d failed %.3f s after the fault (limit %.3f s)\n", r, took, limit_s);
    EXPECT_NE(message.find("rank " + std::to_string(victim) + " (host h" + std::to_string(victim) + ")"),
              std::string::npos)
        << "rank " << r << ": " << message;
    // Either this rank noticed itself, or it learned it from another survivor's abort notice: both name the rank.
    bool found = false;
    for (const auto& d : details) found = found || message.find(d) != std::string::npos;
    EXPECT_TRUE(found) << "rank " << r << ": " << message;
  }
}

// A killed process's sockets are closed by the kernel: noticed at once, well within the timeout. End of file or
// reset, depending on whether unread bytes were in its socket.
void expectKilledRankNamed(int n, int victim) {
  const auto timeout = std::chrono::milliseconds(2000);
  const JobToken token = JobToken::generate();
  FaultTime fault;
  const auto results = testing::forkRanks(n, token, [&](int r, Store& store, std::string& out) {
    runUntilFailure(r, n, store, token, timeout, out, victim, SIGKILL, fault);
  });
  EXPECT_TRUE(WIFSIGNALED(results[static_cast<std::size_t>(victim)].status));
  expectSurvivorsNamed(results, victim, fault, 1.0, {"without saying goodbye", "connection failed"});
}

TEST(TcpFaults, KilledRankFailsEveryOtherRankNamingIt) {
  expectKilledRankNamed(3, 2);
}

// Five ranks, so the pipelined ring (allreduce_ring.h) has reduce-scatter and allgather frames of several steps in
// flight at once when the middle rank dies: its neighbours notice the closed connections, the others learn it from
// their abort notices, and nobody waits on a segment that will never come.
TEST(TcpFaults, KilledRankMidPipelineFailsAllFourOthers) {
  expectKilledRankNamed(5, 2);
}

// The liveness promise (transport.h): a silent peer fails every rank within tcp.timeout plus 5%. The silence is
// caught at the timeout itself (the liveness timer is set for that moment), so the 5% is left to the abort notice and
// the scheduler.
TEST(TcpFaults, StoppedRankFailsEveryRankWithinTheTimeoutPlusFivePercent) {
  const int n = 3, victim = 1;
  const auto timeout = std::chrono::milliseconds(2000);
  const JobToken token = JobToken::generate();
  FaultTime fault;
  const auto results = testing::forkRanks(n, token, [&](int r, Store& store, std::string& out) {
    runUntilFailure(r, n, store, token, timeout, out, victim, SIGSTOP, fault);
  });
  EXPECT_TRUE(results[victim].stopped);
  expectSurvivorsNamed(results, victim, fault, 2.0 * 1.05, {"heartbeat timeout"});
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
