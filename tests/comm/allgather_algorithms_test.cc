// The allgatherv algorithms (allgatherv_ring.h, allgather_bruck.h, allgatherv_hierarchical.h): every rank's gathered
// bytes over worlds 1..9 with equal odd sizes, unequal ones with zeros, all-empty and one-nonempty blocks, nodes that
// do and do not divide the world; each rank's wire bytes and frames against a replay of the algorithm's messages;
// in-place calls; a rank failing mid-collective; the names and auto's rule (allgather_auto.h).
#include <gtest/gtest.h>

#include <bit>
#include <numeric>
#include <tuple>

#include "core/comm/allgather_auto.h"
#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

using testing::block;
using testing::World;

// Named block-size patterns over n ranks.
enum class Sizes { kEqualOdd, kUnequalWithZeros, kAllEmpty, kOneNonEmpty };
std::vector<uint64_t> sizesFor(Sizes kind, int n) {
  std::vector<uint64_t> s(static_cast<std::size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    const auto k = static_cast<std::size_t>(r);
    if (kind == Sizes::kEqualOdd) s[k] = 13;
    if (kind == Sizes::kUnequalWithZeros) s[k] = static_cast<uint64_t>((r * 37) % 11) * 29;  // rank 0 sends 0
    if (kind == Sizes::kOneNonEmpty) s[k] = r == n / 2 ? 301 : 0;
  }
  return s;
}

uint64_t framed(uint64_t bytes, uint64_t seg) {
  return bytes + kFrameHeaderBytes * segmentCount(bytes, seg);
}

// What each rank sends and receives, replayed from the algorithms' headers, message by message.
struct Replay {
  std::vector<WireBytes> wire;
  uint64_t seg;
  explicit Replay(int n, uint64_t segment) : wire(static_cast<std::size_t>(n)), seg(segment) {}
  void message(int from, int to, uint64_t bytes) {
    const uint64_t frames = segmentCount(bytes, seg);
    wire[static_cast<std::size_t>(from)].sent_bytes += framed(bytes, seg);
    wire[static_cast<std::size_t>(from)].sent_frames += frames;
    wire[static_cast<std::size_t>(to)].received_bytes += framed(bytes, seg);
    wire[static_cast<std::size_t>(to)].received_frames += frames;
  }
  // The flat algorithms among `ranks` (transport ranks), block i of size sizes[i].
  void ring(const std::vector<int>& ranks, const std::vector<uint64_t>& sizes) {
    const int n = static_cast<int>(ranks.size());
    for (int r = 0; r < n; ++r)
      for (int s = 0; s < n - 1; ++s)
        message(ranks[static_cast<std::size_t>(r)], ranks[static_cast<std::size_t>(modRank(r + 1, n))],
                sizes[static_cast<std::size_t>(modRank(r - s, n))]);
  }
  void bruck(const std::vector<int>& ranks, const std::vector<uint64_t>& sizes) {
    const int n = static_cast<int>(ranks.size());
    for (int r = 0; r < n; ++r)
      for (int dist = 1; dist < n; dist *= 2) {
        uint64_t bytes = 0;  // rank r's first min(dist, n - dist) held blocks: r, r + 1, ...
        for (int j = 0; j < std::min(dist, n - dist); ++j) bytes += sizes[static_cast<std::size_t>(modRank(r + j, n))];
        message(ranks[static_cast<std::size_t>(r)], ranks[static_cast<std::size_t>(modRank(r - dist, n))], bytes);
      }
  }
  void flat(AllgatherAlgorithm algo, const std::vector<int>& ranks, const std::vector<uint64_t>& sizes) {
    if (algo == AllgatherAlgorithm::kBruck) return bruck(ranks, sizes);
    ring(ranks, sizes);
  }
  void hierarchical(int n, int per, AllgatherAlgorithm leaders, const std::vector<uint64_t>& sizes) {
    const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
    if (n == 1 || total == 0) return;
    per = std::min(per, n);
    std::vector<int> heads;
    std::vector<uint64_t> node_bytes;
    for (int first = 0; first < n; first += per) {
      const int g = std::min(per, n - first);
      heads.push_back(first);
      node_bytes.push_back(0);
      for (int m = 0; m < g; ++m) node_bytes.back() += sizes[static_cast<std::size_t>(first + m)];
      for (int m = 1; m < g; ++m) message(first + m, first, sizes[static_cast<std::size_t>(first + m)]);
      // broadcast_binomial.h from the leader: member v's parent is v minus its lowest set bit.
      for (int v = 1; v < g; ++v) message(first + v - (v & -v), first + v, total);
    }
    if (heads.size() > 1) flat(leaders, heads, node_bytes);
  }
};

using Param = std::tuple<AllgatherAlgorithm, int, Sizes>;
class AllgatherGrid : public ::testing::TestWithParam<Param> {};

// Every rank gets every block in rank order, nothing written past them, and each rank's wire bytes and frames are the
// replay's, as the transport counted them too. The hierarchical algorithm runs with nodes of 2 and 3 (the last node
// shorter whenever they do not divide n).
TEST_P(AllgatherGrid, ExactBytesAndFrames) {
  const auto [algo, n, kind] = GetParam();
  const std::vector<uint64_t> sizes = sizesFor(kind, n);
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  std::vector<std::byte> want;
  for (int r = 0; r < n; ++r) {
    const auto b = block(r, sizes[static_cast<std::size_t>(r)]);
    want.insert(want.end(), b.begin(), b.end());
  }
  for (int per : algo == AllgatherAlgorithm::kHierarchical ? std::vector<int>{2, 3} : std::vector<int>{1}) {
    for (uint64_t seg : {uint64_t{1} << 20, uint64_t{64}}) {  // one frame per message, and several
      HostCommOptions options;
      options.allgather = algo;
      options.ranks_per_node = per;
      options.segment_bytes = seg;
      World world(n, options);
      std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(n),
                                              std::vector<std::byte>(total + 3, std::byte{1}));
      std::vector<WireBytes> got(static_cast<std::size_t>(n));
      world.runOk([&](int r, HostCommunicator& c) {
        got[static_cast<std::size_t>(r)] =
            c.allgatherv(block(r, sizes[static_cast<std::size_t>(r)]), out[static_cast<std::size_t>(r)], sizes, 4);
      });
      Replay replay(n, seg);
      if (algo == AllgatherAlgorithm::kHierarchical) {
        const int nodes = (n + std::min(per, n) - 1) / std::min(per, n);
        replay.hierarchical(n, per, flatAllgatherChoice(nodes, total), sizes);
      } else {
        std::vector<int> ranks(static_cast<std::size_t>(n));
        std::iota(ranks.begin(), ranks.end(), 0);
        replay.flat(algo, ranks, sizes);
      }
      for (int r = 0; r < n; ++r) {
        const auto k = static_cast<std::size_t>(r);
        const std::string where =
            "rank " + std::to_string(r) + " per " + std::to_string(per) + " seg " + std::to_string(seg);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), out[k].begin())) << where;
        EXPECT_EQ(out[k][static_cast<std::size_t>(total)], std::byte{1}) << "wrote past the gathered bytes, " << where;
        EXPECT_EQ(got[k], replay.wire[k]) << where;
        EXPECT_EQ(world.fabric->traffic()[k].sent.tensor(4).bytes, replay.wire[k].sent_bytes) << where;
      }
    }
  }
}

std::string allgatherGridName(const ::testing::TestParamInfo<Param>& info) {
  const auto [algo, n, kind] = info.param;
  const char* kinds[] = {"equal_odd", "unequal_zeros", "all_empty", "one_nonempty"};
  return std::string(allgatherAlgorithmName(algo)) + "_n" + std::to_string(n) + "_" + kinds[static_cast<int>(kind)];
}

INSTANTIATE_TEST_SUITE_P(Grid, AllgatherGrid,
                         ::testing::Combine(::testing::Values(AllgatherAlgorithm::kRing, AllgatherAlgorithm::kBruck,
                                                              AllgatherAlgorithm::kHierarchical),
                                            ::testing::Range(1, 10),
                                            ::testing::Values(Sizes::kEqualOdd, Sizes::kUnequalWithZeros,
                                                              Sizes::kAllEmpty, Sizes::kOneNonEmpty)),
                         allgatherGridName);

// The replay is not a copy of the code under test: Bruck's frames are ceil(log2 n) per rank, the ring's n - 1.
TEST(Allgatherv, BruckTakesLogRoundsTheRingLinear) {
  for (int n : {2, 3, 5, 8, 9, 13}) {
    const auto rounds = static_cast<uint64_t>(std::bit_width(static_cast<unsigned>(n - 1)));
    for (AllgatherAlgorithm algo : {AllgatherAlgorithm::kBruck, AllgatherAlgorithm::kRing}) {
      HostCommOptions options;
      options.allgather = algo;
      World world(n, options);
      const std::vector<uint64_t> sizes(static_cast<std::size_t>(n), 7);
      std::vector<WireBytes> got(static_cast<std::size_t>(n));
      world.runOk([&](int r, HostCommunicator& c) {
        std::vector<std::byte> out(7 * static_cast<std::size_t>(n));
        got[static_cast<std::size_t>(r)] = c.allgatherv(block(r, 7), out, sizes);
      });
      const uint64_t frames = algo == AllgatherAlgorithm::kBruck ? rounds : static_cast<uint64_t>(n - 1);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(got[static_cast<std::size_t>(r)].sent_frames, frames) << allgatherAlgorithmName(algo) << " " << n;
        EXPECT_EQ(got[static_cast<std::size_t>(r)].sent_bytes, 7 * static_cast<uint64_t>(n - 1) + 32 * frames);
      }
    }
  }
}

// In place (the own block already at its offset of the receive buffer), every algorithm.
TEST(Allgatherv, InPlaceEveryAlgorithm) {
  const std::vector<uint64_t> sizes = {10, 20, 0, 30, 40, 5, 1};
  const int n = static_cast<int>(sizes.size());
  for (AllgatherAlgorithm algo :
       {AllgatherAlgorithm::kRing, AllgatherAlgorithm::kBruck, AllgatherAlgorithm::kHierarchical}) {
    HostCommOptions options;
    options.allgather = algo;
    options.ranks_per_node = 3;
    World world(n, options);
    world.runOk([&](int r, HostCommunicator& c) {
      std::vector<std::byte> buf(106);
      const uint64_t off = std::accumulate(sizes.begin(), sizes.begin() + r, uint64_t{0});
      const auto mine = block(r, sizes[static_cast<std::size_t>(r)], 5);
      std::copy(mine.begin(), mine.end(), buf.begin() + static_cast<std::ptrdiff_t>(off));
      c.allgatherv(std::span<const std::byte>(buf.data() + off, mine.size()), buf, sizes);
      std::vector<std::byte> want;
      for (int i = 0; i < n; ++i) {
        const auto b = block(i, sizes[static_cast<std::size_t>(i)], 5);
        want.insert(want.end(), b.begin(), b.end());
      }
      if (!std::equal(want.begin(), want.end(), buf.begin()))
        throw std::runtime_error("in-place " + std::string(allgatherAlgorithmName(algo)) + " mismatch");
    });
  }
}

// A rank that gives up mid-collective fails every rank, without a hang: a leader and a member of the hierarchical one.
TEST(Allgatherv, AFailingRankFailsEveryRank) {
  for (AllgatherAlgorithm algo :
       {AllgatherAlgorithm::kRing, AllgatherAlgorithm::kBruck, AllgatherAlgorithm::kHierarchical}) {
    for (int failing : {3, 4}) {
      HostCommOptions options;
      options.allgather = algo;
      options.ranks_per_node = 3;
      options.segment_bytes = 4096;
      World world(7, options);
      const std::string reason = "rank " + std::to_string(failing) + " gives up";
      const std::vector<uint64_t> sizes(7, 50000);
      const auto res = world.run(
          [&](int r, HostCommunicator& c) {
            std::vector<std::byte> out(7 * 50000);
            if (r == failing) c.transport().abort(reason);
            c.allgatherv(block(r, 50000), out, sizes);
          },
          std::chrono::seconds(20));
      EXPECT_FALSE(res.watchdog_fired) << allgatherAlgorithmName(algo);
      for (int r = 0; r < 7; ++r)
        EXPECT_NE(res.message(r).find(reason), std::string::npos)
            << allgatherAlgorithmName(algo) << " rank " << r << ": " << res.message(r);
    }
  }
}

// The size exchange takes the allgatherv rule too: Bruck's rounds for n words under auto on a flat world.
TEST(Allgatherv, SizeExchangeFollowsTheRule) {
  const int n = 9;
  World world(n);
  std::vector<WireBytes> got(static_cast<std::size_t>(n));
  world.runOk([&](int r, HostCommunicator& c) {
    std::vector<uint64_t> all(static_cast<std::size_t>(n));
    got[static_cast<std::size_t>(r)] = c.allgatherSizes(static_cast<uint64_t>(r) << 40 | 3, all);
    for (int i = 0; i < n; ++i)
      if (all[static_cast<std::size_t>(i)] != (static_cast<uint64_t>(i) << 40 | 3))
        throw std::runtime_error("size exchange mismatch");
  });
  ASSERT_EQ(world.comms[0]->allgatherAlgorithmFor(8 * n), AllgatherAlgorithm::kBruck);
  for (const WireBytes& w : got) EXPECT_EQ(w.sent_frames, 4u) << "ceil(log2 9) rounds";
}

TEST(AllgatherAlgorithms, NamesRoundTrip) {
  for (AllgatherAlgorithm algo : {AllgatherAlgorithm::kAuto, AllgatherAlgorithm::kRing, AllgatherAlgorithm::kBruck,
                                  AllgatherAlgorithm::kHierarchical})
    EXPECT_EQ(parseAllgatherAlgorithm(allgatherAlgorithmName(algo)), algo);
  EXPECT_EQ(parseAllgatherAlgorithm("recursive_doubling"), std::nullopt);
  EXPECT_EQ(allgatherAlgorithmChoices(), "ring, bruck, hierarchical or auto");
}

// Auto: Bruck below a crossover proportional to the latencies it saves over the ring, the ring above, the hierarchical
// one on more than one node; a communicator asks exactly this rule.
TEST(AllgatherAlgorithms, AutoRule) {
  const uint64_t kib = 1024;
  EXPECT_EQ(bruckCrossover(1), 0u);
  EXPECT_EQ(bruckCrossover(2), 0u) << "one round either way";
  EXPECT_EQ(bruckCrossover(3), 0u) << "2 rounds either way";
  EXPECT_EQ(bruckCrossover(8), 4 * 64 * kib) << "7 - 3 latencies saved";
  EXPECT_EQ(bruckCrossover(9), 4 * 64 * kib) << "8 - 4";
  EXPECT_EQ(bruckCrossover(64), 57 * 64 * kib);
  EXPECT_EQ(bruckCrossover(1024), 1013 * 64 * kib);
  for (int n = 2; n < 2048; ++n) EXPECT_LE(bruckCrossover(n), bruckCrossover(n + 1)) << n;
  EXPECT_EQ(flatAllgatherChoice(8, 4 * 64 * kib - 1), AllgatherAlgorithm::kBruck);
  EXPECT_EQ(flatAllgatherChoice(8, 4 * 64 * kib), AllgatherAlgorithm::kRing);
  EXPECT_EQ(flatAllgatherChoice(2, 8), AllgatherAlgorithm::kRing);
  EXPECT_EQ(allgatherChoice(16, 8, 8), AllgatherAlgorithm::kHierarchical);
  EXPECT_EQ(allgatherChoice(16, 8, uint64_t{1} << 30), AllgatherAlgorithm::kHierarchical);
  // The worlds of results/reference/collectives/allgather.md's two-level study: no flat band held across them.
  for (int world : {16, 64, 256})
    for (uint64_t bytes = 4 * kib; bytes <= (uint64_t{16} << 20); bytes *= 4)
      EXPECT_EQ(allgatherChoice(world, 8, bytes), AllgatherAlgorithm::kHierarchical) << world << " " << bytes;
  EXPECT_EQ(allgatherChoice(8, 8, 1000), AllgatherAlgorithm::kBruck) << "one node is a flat world";
  EXPECT_EQ(allgatherChoice(1024, 1, 1000), AllgatherAlgorithm::kBruck);
  HostCommOptions nodes;
  nodes.ranks_per_node = 4;
  World two_nodes(8, nodes);
  World flat(8);
  for (uint64_t bytes = 8; bytes <= (uint64_t{64} << 20); bytes *= 4) {
    EXPECT_EQ(two_nodes.comms[3]->allgatherAlgorithmFor(bytes), allgatherChoice(8, 4, bytes));
    EXPECT_EQ(flat.comms[5]->allgatherAlgorithmFor(bytes), flatAllgatherChoice(8, bytes));
  }
  HostCommOptions named;
  named.allgather = AllgatherAlgorithm::kRing;
  World ring(8, named);
  EXPECT_EQ(ring.comms[0]->allgatherAlgorithmFor(8), AllgatherAlgorithm::kRing);
}

}  // namespace
}  // namespace terse::comm
