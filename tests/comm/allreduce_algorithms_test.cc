// The tree, halving-doubling and reduce-broadcast allreduces (allreduce_tree.h, allreduce_halving_doubling.h,
// allreduce_reduce_broadcast.h): every rank's result bit for bit against the sum replayed in the algorithm's own order
// over worlds 1..8 (powers of two and not), odd counts and f32/f16/bf16; each rank's wire bytes against its header's
// closed form; a rank failing mid-collective; the names and auto's measured table.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/comm/allreduce_auto.h"
#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

using testing::World;

constexpr AllreduceAlgorithm kNew[] = {AllreduceAlgorithm::kTree, AllreduceAlgorithm::kHalvingDoubling,
                                       AllreduceAlgorithm::kReduceBroadcast};

using GridParam = std::tuple<int, std::size_t, DType, AllreduceAlgorithm>;

class AlgorithmGrid : public ::testing::TestWithParam<GridParam> {};

TEST_P(AlgorithmGrid, EveryRankGetsTheExactSumInItsOrder) {
  const auto [n, count, dtype, algo] = GetParam();
  HostCommOptions options;
  options.algorithm = algo;
  options.segment_bytes = 4096;  // several segments at the largest count, so the pipelines are exercised
  World world(n, options);
  const auto in = testing::makeInputs(n, count, dtype);
  const std::vector<std::byte> want = testing::expectedFor(algo, in, count, dtype);
  testing::expectAllreduceGives(world, in, count, dtype, want);
}

std::string gridName(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [n, count, dtype, algo] = info.param;
  return "n" + std::to_string(n) + "_count" + std::to_string(count) + "_" + std::string(dtypeName(dtype)) + "_" +
         std::string(allreduceAlgorithmName(algo));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, AlgorithmGrid,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 6, 7, 8),
                       ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{5003}),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16), ::testing::ValuesIn(kNew)),
    gridName);

// The replays are not vacuous: in bf16 each order gives other bits than the ring's and than each other's somewhere,
// but for recursive doubling and halving-doubling, which add in one order (comm_test_util.h).
TEST(AllreduceAlgorithms, Bf16OrdersDiffer) {
  const std::size_t count = 4096;
  const auto in = testing::makeInputs(6, count, DType::kBF16, 5);
  const AllreduceAlgorithm all[] = {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kRecursiveDoubling,
                                    AllreduceAlgorithm::kTree, AllreduceAlgorithm::kHalvingDoubling,
                                    AllreduceAlgorithm::kReduceBroadcast};
  const auto same_order = [](AllreduceAlgorithm x, AllreduceAlgorithm y) {
    return (x == AllreduceAlgorithm::kRecursiveDoubling && y == AllreduceAlgorithm::kHalvingDoubling) ||
           (y == AllreduceAlgorithm::kRecursiveDoubling && x == AllreduceAlgorithm::kHalvingDoubling);
  };
  for (std::size_t a = 0; a < std::size(all); ++a)
    for (std::size_t b = a + 1; b < std::size(all); ++b)
      if (!same_order(all[a], all[b])) {
        EXPECT_FALSE(testing::sameBytes(testing::expectedFor(all[a], in, count, DType::kBF16),
                                        testing::expectedFor(all[b], in, count, DType::kBF16), DType::kBF16))
            << allreduceAlgorithmName(all[a]) << " vs " << allreduceAlgorithmName(all[b]);
      }
}

uint64_t framed(uint64_t bytes, uint64_t seg) {
  return bytes + kFrameHeaderBytes * segmentCount(bytes, seg);
}

// Sent and received bytes of rank r of n from each header's closed form.
std::pair<uint64_t, uint64_t> closedForm(AllreduceAlgorithm algo, int n, int r, uint64_t count, uint64_t elem,
                                         uint64_t seg) {
  const uint64_t whole = framed(count * elem, seg);
  if (n == 1) return {0, 0};
  if (algo == AllreduceAlgorithm::kTree) {
    const uint64_t links = static_cast<uint64_t>(std::clamp(n - (2 * r + 1), 0, 2) + (r > 0 ? 1 : 0));
    return {links * whole, links * whole};
  }
  if (algo == AllreduceAlgorithm::kReduceBroadcast) {
    const uint64_t k = r == 0 ? static_cast<uint64_t>(n - 1) : 1;
    return {k * whole, k * whole};
  }
  // Halving-doubling, nearest partner first: at distance d the range of 2h blocks (h = p / (2d)) starting at lo is
  // split, v keeps the half bit d of v names and gives the other away; the allgather sends the kept half back.
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  if (r < 2 * rem && r % 2 == 0) return {whole, whole};  // folded out: its buffer there, the result back
  const int v = r < 2 * rem ? r / 2 : r - rem;
  auto blocks = [&](int first, int h) {
    const Range a = ringChunk(count, p, first), b = ringChunk(count, p, first + h - 1);
    return (b.begin + b.size - a.begin) * elem;
  };
  uint64_t sent = r < 2 * rem ? whole : 0, received = sent;
  int lo = 0;
  for (int d = 1; d < p; d *= 2) {
    const int h = p / (2 * d);
    const int keep = (v & d) == 0 ? lo : lo + h, give = (v & d) == 0 ? lo + h : lo;
    sent += framed(blocks(give, h), seg) + framed(blocks(keep, h), seg);
    received += framed(blocks(keep, h), seg) + framed(blocks(give, h), seg);
    lo = keep;
  }
  return {sent, received};
}

TEST(AllreduceAlgorithms, ExactWireBytesPerRank) {
  const uint64_t seg = 4096, count = 10007, elem = 4;
  for (AllreduceAlgorithm algo : kNew) {
    for (int n : {1, 2, 3, 5, 6, 8}) {
      HostCommOptions options;
      options.algorithm = algo;
      options.segment_bytes = seg;
      World world(n, options);
      std::vector<WireBytes> got(static_cast<std::size_t>(n));
      world.runOk([&](int r, HostCommunicator& c) {
        auto buf = testing::makeInput(r, count, DType::kF32);
        got[static_cast<std::size_t>(r)] = c.allreduce(buf.data(), count, DType::kF32, ReduceOp::kSum, 9);
      });
      for (int r = 0; r < n; ++r) {
        const auto [sent, received] = closedForm(algo, n, r, count, elem, seg);
        const std::string where =
            std::string(allreduceAlgorithmName(algo)) + " n " + std::to_string(n) + " rank " + std::to_string(r);
        EXPECT_EQ(got[static_cast<std::size_t>(r)].sent_bytes, sent) << where;
        EXPECT_EQ(got[static_cast<std::size_t>(r)].received_bytes, received) << where;
        EXPECT_EQ(world.fabric->traffic()[static_cast<std::size_t>(r)].sent.tensor(9).bytes, sent)
            << "the transport counted the same, " << where;
      }
    }
  }
}

// A rank that gives up fails every rank, without a hang: the root, a leaf, a rank folded out of the power of two.
TEST(AllreduceAlgorithms, AFailingRankFailsEveryRank) {
  for (AllreduceAlgorithm algo : kNew) {
    for (int failing : {0, 4, 6}) {
      HostCommOptions options;
      options.algorithm = algo;
      options.segment_bytes = 16384;
      World world(7, options);
      const std::string reason = "rank " + std::to_string(failing) + " gives up";
      const auto res = world.run(
          [&](int r, HostCommunicator& c) {
            std::vector<float> a(100000, 1.0f);
            if (r == failing) c.transport().abort(reason);
            c.allreduce(a.data(), a.size(), DType::kF32);
          },
          std::chrono::seconds(20));
      EXPECT_FALSE(res.watchdog_fired) << allreduceAlgorithmName(algo);
      for (int r = 0; r < 7; ++r)
        EXPECT_NE(res.message(r).find(reason), std::string::npos)
            << allreduceAlgorithmName(algo) << " rank " << r << ": " << res.message(r);
    }
  }
}

TEST(AllreduceAlgorithms, NamesRoundTrip) {
  for (AllreduceAlgorithm algo : kNew) EXPECT_EQ(parseAllreduceAlgorithm(allreduceAlgorithmName(algo)), algo);
  EXPECT_EQ(parseAllreduceAlgorithm("halving_doubling"), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(parseAllreduceAlgorithm("rabenseifner"), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(parseAllreduceAlgorithm("butterfly"), std::nullopt);
}

// auto's rows are the bands results/reference/collectives/study.py derive read off the study's runs
// (auto_table.csv there): a row edited by hand, or a study re-derived without the code following, fails here. Checked
// at every size the study ran (4 KiB x 4^k) and on both sides of every band's bound.
TEST(AllreduceAlgorithms, AutoRowsAreTheStudysDerivedBands) {
  const std::string path = std::string(TERSE_TEST_SOURCE_DIR) + "/results/reference/collectives/auto_table.csv";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  struct Row {
    int ranks;
    uint64_t below;  // 0: no bound
    AllreduceAlgorithm algo;
  };
  std::vector<Row> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("ranks,", 0) == 0) continue;
    std::istringstream fields(line);
    std::string ranks, below, algo;
    ASSERT_TRUE(std::getline(fields, ranks, ',') && std::getline(fields, below, ',') && std::getline(fields, algo))
        << line;
    const auto parsed = parseAllreduceAlgorithm(algo);
    ASSERT_TRUE(parsed.has_value()) << line;
    rows.push_back({std::stoi(ranks), below.empty() ? 0 : std::stoull(below), *parsed});
  }
  ASSERT_FALSE(rows.empty());
  for (int n = 2; n <= 8; ++n) {
    uint64_t from = 0;  // the band's lower bound: the previous band's `below`
    int bands = 0;
    for (const Row& row : rows) {
      if (row.ranks != n) continue;
      ++bands;
      const uint64_t to = row.below == 0 ? uint64_t{256} << 20 : row.below;
      for (uint64_t bytes = 4096; bytes < (uint64_t{256} << 20); bytes *= 4) {
        if (bytes < from || bytes >= to) continue;
        EXPECT_EQ(measuredAllreduceChoice(n, bytes), row.algo) << n << " " << bytes;
      }
      if (from != 0) {
        EXPECT_EQ(measuredAllreduceChoice(n, from), row.algo) << n << " from " << from;
      }
      EXPECT_EQ(measuredAllreduceChoice(n, to - 4), row.algo) << n << " below " << to;
      from = to;
    }
    EXPECT_GT(bands, 0) << "no row for " << n << " ranks in " << path;
  }
}

// Auto follows the measured table (flat worlds), the same on every rank, and the result is that algorithm's exactly.
TEST(AllreduceAlgorithms, AutoFollowsTheMeasuredTable) {
  for (int n : {2, 3, 5, 8}) {
    World world(n);
    for (uint64_t bytes : {uint64_t{4} << 10, uint64_t{256} << 10, uint64_t{64} << 20})
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(world.comms[static_cast<std::size_t>(r)]->algorithmFor(bytes), measuredAllreduceChoice(n, bytes));
  }
  EXPECT_EQ(measuredAllreduceChoice(64, 1 << 30), measuredAllreduceChoice(8, 1 << 30));
  EXPECT_EQ(measuredAllreduceChoice(1, 1024), AllreduceAlgorithm::kRing);
  // Past the table: halving-doubling below a crossover that grows with the latencies it saves, the ring above.
  const uint64_t mib = uint64_t{1} << 20;
  EXPECT_EQ(halvingDoublingCrossover(8), mib) << "1 MiB for the 4 latencies an 8-rank world saves";
  EXPECT_EQ(halvingDoublingCrossover(16), 11 * mib / 4);
  EXPECT_EQ(halvingDoublingCrossover(1024), 1013 * mib / 4);
  EXPECT_EQ(halvingDoublingCrossover(9), 4 * mib / 4) << "ceil(log2 9) = 4";
  EXPECT_EQ(measuredAllreduceChoice(16, 2 * mib), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(measuredAllreduceChoice(16, 3 * mib), AllreduceAlgorithm::kRing);
  EXPECT_EQ(measuredAllreduceChoice(1024, 100 * mib), AllreduceAlgorithm::kHalvingDoubling);
  for (int n = 9; n < 2048; ++n) EXPECT_LE(halvingDoublingCrossover(n), halvingDoublingCrossover(n + 1)) << n;
  // And recursive doubling below 16 KiB, past the table only: half the steps where latency is the time.
  const uint64_t kib = 1024;
  for (int n : {9, 12, 16, 64, 1024}) {
    EXPECT_EQ(measuredAllreduceChoice(n, 4 * kib), AllreduceAlgorithm::kRecursiveDoubling) << n;
    EXPECT_EQ(measuredAllreduceChoice(n, 16 * kib - 4), AllreduceAlgorithm::kRecursiveDoubling) << n;
    EXPECT_EQ(measuredAllreduceChoice(n, 16 * kib), AllreduceAlgorithm::kHalvingDoubling) << n;
  }
  EXPECT_EQ(recursiveDoublingBelow(8), 0u) << "the table's rows keep their own choice";
  EXPECT_EQ(measuredAllreduceChoice(8, 4 * kib), AllreduceAlgorithm::kRecursiveDoubling) << "the 8-rank row's own";
  EXPECT_EQ(measuredAllreduceChoice(8, 16 * kib), AllreduceAlgorithm::kHalvingDoubling) << "the 8-rank row's own";
  World twelve(12);  // a flat world past the table follows the extrapolation: (11 - 4) / 4 = 1.75 MiB
  EXPECT_EQ(twelve.comms[0]->algorithmFor(4 * kib), AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(twelve.comms[0]->algorithmFor(mib), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(twelve.comms[0]->algorithmFor(2 * mib), AllreduceAlgorithm::kRing);
  // The communicator's auto is autoAllreduceChoice, which the step trace replay (core/sim/replay.h) asks at other
  // world sizes: flat, the measured choice; on several nodes the 8-rank row, hierarchical where that is the ring; a
  // small_allreduce_bytes threshold splits recursive doubling from the ring.
  for (int n : {2, 12, 1024})
    for (uint64_t bytes : {uint64_t{4} << 10, mib, 64 * mib})
      EXPECT_EQ(autoAllreduceChoice(n, 1, bytes), measuredAllreduceChoice(n, bytes)) << n << " " << bytes;
  EXPECT_EQ(autoAllreduceChoice(12, 12, 64 * mib), AllreduceAlgorithm::kRing) << "one node: flat";
  EXPECT_EQ(autoAllreduceChoice(1024, 8, 64 * mib), AllreduceAlgorithm::kHierarchical);
  EXPECT_EQ(autoAllreduceChoice(1024, 8, 64 << 10), measuredAllreduceChoice(8, 64 << 10));
  EXPECT_EQ(autoAllreduceChoice(16, 1, 1000, 4096), AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(autoAllreduceChoice(16, 1, 8192, 4096), AllreduceAlgorithm::kRing);
  EXPECT_EQ(twelve.comms[0]->algorithmFor(mib), autoAllreduceChoice(12, 1, mib));
  const std::size_t count = 70000;  // 280 KB of f32
  World world(8);
  const auto in = testing::makeInputs(8, count, DType::kF32, 3);
  const auto want = testing::expectedFor(measuredAllreduceChoice(8, count * 4), in, count, DType::kF32);
  testing::expectAllreduceGives(world, in, count, DType::kF32, want);
  // Past the table at a small size auto runs recursive doubling with a fold (12 is 8 + 4; the choice is pinned above):
  // its sums, for an odd count, on every rank.
  const std::size_t small = 1001;
  const auto in12 = testing::makeInputs(12, small, DType::kF32, 5);
  const auto want12 = testing::expectedFor(AllreduceAlgorithm::kRecursiveDoubling, in12, small, DType::kF32);
  testing::expectAllreduceGives(twelve, in12, small, DType::kF32, want12);
}

}  // namespace
}  // namespace terse::comm
