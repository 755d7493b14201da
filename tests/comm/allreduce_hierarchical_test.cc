// The hierarchical allreduce (allreduce_hierarchical.h): every rank's result bit for bit against the sum replayed in
// its order, over worlds that are and are not multiples of the node size (a short last node, one node, nodes of one),
// exact wire bytes per rank from the chains' and the leaders' ring's closed forms, auto's choice, bad arguments and a
// rank failing mid-collective.
#include <gtest/gtest.h>

#include <tuple>

#include "core/comm/allreduce_auto.h"
#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

using testing::World;

using Param = std::tuple<int, int, std::size_t, DType>;  // world, ranks per node, elements, dtype

class HierarchicalGrid : public ::testing::TestWithParam<Param> {};

TEST_P(HierarchicalGrid, EveryRankGetsTheExactSumInTheTwoLevelOrder) {
  const auto [n, per, count, dtype] = GetParam();
  HostCommOptions options;
  options.algorithm = AllreduceAlgorithm::kHierarchical;
  options.ranks_per_node = per;
  options.segment_bytes = 4096;  // several segments per chain, so the pipelining is exercised
  World world(n, options);
  const auto in = testing::makeInputs(n, count, dtype);
  const std::vector<std::byte> want = testing::expectedHierarchical(in, count, dtype, per);
  testing::expectAllreduceGives(world, in, count, dtype, want);
}

std::string gridName(const ::testing::TestParamInfo<Param>& info) {
  const auto [n, per, count, dtype] = info.param;
  return "n" + std::to_string(n) + "_per" + std::to_string(per) + "_count" + std::to_string(count) + "_" +
         std::string(dtypeName(dtype));
}

INSTANTIATE_TEST_SUITE_P(Grid, HierarchicalGrid,
                         ::testing::Combine(::testing::Values(1, 2, 5, 7, 8), ::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(std::size_t{0}, std::size_t{7}, std::size_t{5003}),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         gridName);

// The 16-bit replay is not vacuous: the two-level order gives other bits than the flat ring's somewhere.
TEST(Hierarchical, OrderDiffersFromTheFlatRing) {
  const std::size_t count = 4096;
  const auto in = testing::makeInputs(6, count, DType::kBF16, 7);
  EXPECT_FALSE(testing::sameBytes(testing::expectedHierarchical(in, count, DType::kBF16, 3),
                                  testing::expectedRing(in, count, DType::kBF16), DType::kBF16));
}

uint64_t framed(uint64_t bytes, uint64_t seg) {
  const uint64_t frames = bytes == 0 ? 0 : (bytes + seg - 1) / seg;
  return bytes + kFrameHeaderBytes * frames;
}

// The leaders' ring, rank r of m (allreduce_ring.h): every chunk but (r + 1) in the reduce-scatter, every chunk but
// (r + 2) in the allgather.
uint64_t ringSent(int m, int r, uint64_t count, uint64_t elem, uint64_t seg) {
  if (m == 1) return 0;
  uint64_t total = 0;
  auto chunk = [&](int c) {
    const Range rc = ringChunk(count, m, c);
    return framed(rc.size * elem, seg);
  };
  for (int c = 0; c < m; ++c) total += chunk(c);
  return 2 * total - chunk((r + 1) % m) - chunk((r + 2) % m);
}

TEST(Hierarchical, ExactWireBytesPerRank) {
  const uint64_t seg = 4096, count = 10007, elem = 4;
  const uint64_t whole = framed(count * elem, seg);
  for (int n : {3, 6, 7, 9}) {
    for (int per : {2, 3, 4}) {
      HostCommOptions options;
      options.algorithm = AllreduceAlgorithm::kHierarchical;
      options.ranks_per_node = per;
      options.segment_bytes = seg;
      World world(n, options);
      std::vector<WireBytes> got(static_cast<std::size_t>(n));
      world.runOk([&](int r, HostCommunicator& c) {
        auto buf = testing::makeInput(r, count, DType::kF32);
        got[static_cast<std::size_t>(r)] = c.allreduce(buf.data(), count, DType::kF32, ReduceOp::kSum, 9);
      });
      const int m = (n + per - 1) / per;
      for (int r = 0; r < n; ++r) {
        const int first = r / per * per, g = r - first, last = std::min(first + per, n) - 1 - first;
        uint64_t sent = (g > 0 ? whole : 0) + (g < last ? whole : 0);
        uint64_t received = sent;  // each chain hop is received by the member it is sent to
        if (g == 0) {
          const int l = r / per;
          sent += ringSent(m, l, count, elem, seg);
          received += ringSent(m, (l + m - 1) % m, count, elem, seg);
        }
        EXPECT_EQ(got[static_cast<std::size_t>(r)].sent_bytes, sent) << "n " << n << " per " << per << " rank " << r;
        EXPECT_EQ(got[static_cast<std::size_t>(r)].received_bytes, received)
            << "n " << n << " per " << per << " rank " << r;
        const auto traffic = world.fabric->traffic()[static_cast<std::size_t>(r)];
        EXPECT_EQ(traffic.sent.tensor(9).bytes, sent) << "the transport counted the same, rank " << r;
      }
    }
  }
}

TEST(Hierarchical, AutoPicksItForLargeMessagesOnMoreThanOneNode) {
  HostCommOptions options;
  options.ranks_per_node = 4;
  World world(8, options);
  World one_node(4, options);
  bool hierarchical = false;
  // Where the flat table picks the ring, several nodes take the hierarchical allreduce instead; one node never does.
  for (uint64_t bytes = 1024; bytes <= (uint64_t{256} << 20); bytes *= 4) {
    const AllreduceAlgorithm flat = measuredAllreduceChoice(8, bytes);
    EXPECT_EQ(world.comms[0]->algorithmFor(bytes),
              flat == AllreduceAlgorithm::kRing ? AllreduceAlgorithm::kHierarchical : flat);
    hierarchical = hierarchical || flat == AllreduceAlgorithm::kRing;
    EXPECT_EQ(one_node.comms[0]->algorithmFor(bytes), measuredAllreduceChoice(4, bytes));
  }
  EXPECT_TRUE(hierarchical) << "the table never picks the ring at 8 ranks";
  // Past 8 ranks on several nodes the 8-rank row still decides: the extrapolation for flat worlds would hand the
  // hierarchical allreduce's messages (up to 253 MiB at 1,024 ranks) to a flat halving-doubling.
  World sixteen(16, options);
  EXPECT_EQ(sixteen.comms[0]->algorithmFor(uint64_t{5} << 20), AllreduceAlgorithm::kHierarchical);
  EXPECT_EQ(sixteen.comms[0]->algorithmFor(uint64_t{2} << 20), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(sixteen.comms[0]->algorithmFor(uint64_t{8} << 10), AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(parseAllreduceAlgorithm("hierarchical"), AllreduceAlgorithm::kHierarchical);
  EXPECT_EQ(allreduceAlgorithmName(AllreduceAlgorithm::kHierarchical), "hierarchical");
}

TEST(Hierarchical, BadRanksPerNodeIsRefused) {
  HostCommOptions options;
  options.ranks_per_node = 0;
  auto fabric = InprocFabric::create(2);
  try {
    HostCommunicator c(fabric->endpoint(0), options);
    FAIL() << "ranks_per_node 0 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ranks_per_node must be >= 1, got 0"), std::string::npos) << e.what();
  }
}

// A member that gives up mid-collective fails every rank, leaders and other nodes included, without a hang.
TEST(Hierarchical, AFailingMemberFailsEveryRank) {
  HostCommOptions options;
  options.algorithm = AllreduceAlgorithm::kHierarchical;
  options.ranks_per_node = 3;
  World world(7, options);
  const auto res = world.run([&](int r, HostCommunicator& c) {
    std::vector<float> a(100000, 1.0f);
    if (r == 4) c.transport().abort("rank 4 gives up");
    c.allreduce(a.data(), a.size(), DType::kF32);
  });
  EXPECT_FALSE(res.watchdog_fired);
  for (int r = 0; r < 7; ++r) EXPECT_NE(res.message(r).find("rank 4 gives up"), std::string::npos) << res.message(r);
}

}  // namespace
}  // namespace terse::comm
