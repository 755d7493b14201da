// allgatherv, broadcast, barrier and the non-blocking versions, one thread per rank over several world sizes.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <numeric>
#include <thread>

#include "core/comm/collective.h"
#include "core/comm/inproc_transport.h"
#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

using testing::block;
using testing::World;

void checkAllgatherv(int n, const std::vector<uint64_t>& sizes, uint64_t segment = 256 * 1024) {
  HostCommOptions options;
  options.segment_bytes = segment;
  World world(n, options);
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  std::vector<std::byte> want;
  for (int r = 0; r < n; ++r) {
    const auto b = block(r, sizes[static_cast<std::size_t>(r)]);
    want.insert(want.end(), b.begin(), b.end());
  }
  std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(n), std::vector<std::byte>(total + 3, std::byte{1}));
  world.runOk([&](int r, HostCommunicator& c) {
    const auto mine = block(r, sizes[static_cast<std::size_t>(r)]);
    c.allgatherv(mine, out[static_cast<std::size_t>(r)], sizes);
  });
  for (int r = 0; r < n; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    EXPECT_TRUE(std::equal(want.begin(), want.end(), o.begin())) << "rank " << r << " of " << n;
    EXPECT_EQ(o[static_cast<std::size_t>(total)], std::byte{1}) << "wrote past the gathered bytes";
  }
}

TEST(Allgatherv, VaryingSizesIncludingZero) {
  for (int n : {1, 2, 3, 5, 8}) {
    std::vector<uint64_t> sizes;
    for (int r = 0; r < n; ++r) sizes.push_back(static_cast<uint64_t>((r * 37) % 11) * 101);  // rank 0 sends 0
    checkAllgatherv(n, sizes);
  }
}

TEST(Allgatherv, AllZeroOneNonzeroAndLargeSegmented) {
  checkAllgatherv(4, {0, 0, 0, 0});
  checkAllgatherv(5, {0, 0, 12345, 0, 0});
  checkAllgatherv(3, {300000, 1, 299999}, 4096);
}

TEST(Allgatherv, InPlaceAndSizeExchange) {
  const int n = 5;
  World world(n);
  world.runOk([&](int r, HostCommunicator& c) {
    std::vector<uint64_t> sizes(n);
    c.allgatherSizes(static_cast<uint64_t>(r * r + (r == 3 ? (uint64_t{1} << 40) : 0)), sizes);
    for (int i = 0; i < n; ++i)
      if (sizes[static_cast<std::size_t>(i)] != static_cast<uint64_t>(i * i + (i == 3 ? (uint64_t{1} << 40) : 0)))
        throw std::runtime_error("size exchange mismatch");
    // In place: the own block already sits at its offset of the receive buffer.
    std::vector<uint64_t> blocks = {10, 20, 0, 30, 40};
    std::vector<std::byte> buf(100);
    uint64_t off = 0;
    for (int i = 0; i < r; ++i) off += blocks[static_cast<std::size_t>(i)];
    const auto mine = block(r, blocks[static_cast<std::size_t>(r)], 5);
    std::copy(mine.begin(), mine.end(), buf.begin() + static_cast<std::ptrdiff_t>(off));
    c.allgatherv(std::span<const std::byte>(buf.data() + off, mine.size()), buf, blocks);
    off = 0;
    for (int i = 0; i < n; ++i) {
      const auto b = block(i, blocks[static_cast<std::size_t>(i)], 5);
      if (!std::equal(b.begin(), b.end(), buf.begin() + static_cast<std::ptrdiff_t>(off)))
        throw std::runtime_error("in-place allgatherv mismatch");
      off += b.size();
    }
  });
}

// The negotiation's word exchange (Bruck's allgather): every world size, powers of two or not, gets every rank's word
// in rank order, in ceil(log2 n) frames per rank carrying (n - 1) words in all -- where the ring sends n - 1 frames.
TEST(AllgatherControl, EveryRanksWordInRankOrderInLogRounds) {
  for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 13}) {
    World world(n);
    const auto word = [](int r) { return static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull + (uint64_t{1} << 40); };
    const auto rounds = static_cast<uint64_t>(std::ceil(std::log2(n)));
    std::vector<std::vector<uint64_t>> got(static_cast<std::size_t>(n));
    std::vector<WireBytes> bytes(static_cast<std::size_t>(n));
    world.runOk([&](int r, HostCommunicator& c) {
      auto& all = got[static_cast<std::size_t>(r)];
      all.assign(static_cast<std::size_t>(n), 0);
      bytes[static_cast<std::size_t>(r)] = c.allgatherControl(word(r), all);
    });
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < n; ++i)
        EXPECT_EQ(got[r][static_cast<std::size_t>(i)], word(i)) << "rank " << r << " of " << n;
      EXPECT_EQ(bytes[r].sent_frames, rounds) << "rank " << r << " of " << n;
      EXPECT_EQ(bytes[r].sent_bytes, 8 * static_cast<uint64_t>(n - 1) + kFrameHeaderBytes * rounds) << n;
    }
  }
}

TEST(Channels, ConcurrentCollectivesStartedInAnyOrderKeepApart) {
  // Three channels per rank run allreduces at once, each started in a different order on every rank (rank r starts
  // channel (r + k) % 3 k-th), while the parent runs its own allreduce: tags from the channels' ids keep them apart,
  // where the parent's sequence, drawn in start order, would pair up different operations on different ranks.
  for (int n : {2, 3, 4}) {
    World world(n);
    constexpr int kChannels = 3;
    constexpr std::size_t kCount = 70000;  // several frames, so the operations interleave on the links
    std::vector<std::vector<std::vector<float>>> data(static_cast<std::size_t>(n));
    world.runOk([&](int r, HostCommunicator& c) {
      auto& mine = data[static_cast<std::size_t>(r)];
      mine.assign(kChannels + 1, std::vector<float>(kCount));
      for (int k = 0; k <= kChannels; ++k)
        for (std::size_t i = 0; i < kCount; ++i)
          mine[static_cast<std::size_t>(k)][i] = static_cast<float>(r + k * i % 7);
      std::vector<std::thread> threads;
      for (int j = 0; j < kChannels; ++j) {
        const int k = (r + j) % kChannels;
        threads.emplace_back([&, k] {
          auto channel = c.openChannel();
          channel->select(1000 + static_cast<uint64_t>(k));
          auto& v = mine[static_cast<std::size_t>(k)];
          channel->allreduce(v.data(), v.size(), DType::kF32);
          EXPECT_EQ(channel->stats().kind(OpKind::kAllreduce).ops, 1u);
        });
      }
      auto& own = mine[kChannels];
      c.allreduce(own.data(), own.size(), DType::kF32);
      for (auto& t : threads) t.join();
      EXPECT_EQ(c.stats().kind(OpKind::kAllreduce).ops, static_cast<uint64_t>(kChannels + 1));
    });
    const float ranks = static_cast<float>(n * (n - 1) / 2);
    for (int r = 0; r < n; ++r)
      for (int k = 0; k <= kChannels; ++k)
        for (std::size_t i = 0; i < kCount; i += 997)
          ASSERT_EQ(data[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)][i],
                    ranks + static_cast<float>(n) * static_cast<float>(k * i % 7))
              << n << " ranks, rank " << r << ", channel " << k << ", element " << i;
  }
}

TEST(CollectiveContext, HoldsWhatIsInFlightNotEveryRequestItMade) {
  // 10,000 frames each way, each waited and let go of at once: the context keeps a bounded list (track() drops the
  // complete ones nobody else holds whenever the list has doubled), where it used to keep all 20,000 to the end.
  // Requests the caller still holds, and those not complete, stay.
  auto t = makeInprocTransports(2);
  std::vector<std::byte> scratch0, scratch1;
  CollectiveContext c0{*t[0], FrameMeta{OpKind::kAllreduce, 7, 0}, 1 << 20, &scratch0, {}, {}, {}, -1};
  CollectiveContext c1{*t[1], FrameMeta{OpKind::kAllreduce, 7, 0}, 1 << 20, &scratch1, {}, {}, {}, -1};
  std::vector<std::byte> out(16, std::byte{3}), in(16);
  std::size_t most = 0;
  for (int i = 0; i < 10000; ++i) {
    RequestList sends, recvs;
    LengthList expected;
    c1.recv(0, in, recvs, expected);
    c0.send(1, out, sends);
    waitRecvs(recvs, expected, c1);
    waitAll(sends);
    most = std::max({most, c0.inflight.size(), c1.inflight.size()});
  }
  EXPECT_LE(most, 128u);
  // A held request is kept however many others come and go, and so is one still in flight.
  RequestList held, pending;
  LengthList expected;
  c1.recv(0, in, pending, expected);  // nothing sent yet: not complete
  c0.send(1, out, held);
  for (int i = 0; i < 1000; ++i) {
    RequestList sends;
    c0.send(1, out, sends);
  }
  EXPECT_EQ(std::count_if(c0.inflight.begin(), c0.inflight.end(), [](const Request& r) { return !r.alone(); }), 1);
  EXPECT_FALSE(c1.inflight.empty());
  // The first frame sent after the 10,000 matches the pending receive.
  waitRecvs(pending, expected, c1);
  EXPECT_EQ(in, out);
}

TEST(Allgatherv, BadArguments) {
  World world(2);
  const auto res = world.run([&](int r, HostCommunicator& c) {
    std::vector<std::byte> send(5), recv(4);
    if (r == 0) c.allgatherv(send, recv, std::vector<uint64_t>{5, 5});  // receive buffer too small
  });
  EXPECT_NE(res.message(0).find("receive buffer of 4 bytes"), std::string::npos) << res.message(0);
}

TEST(Broadcast, FromEveryRoot) {
  for (int n : {1, 2, 3, 5, 8}) {
    World world(n);
    for (int root = 0; root < n; ++root) {
      for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{300001}}) {
        const auto want = block(root, size, 11);
        std::vector<std::vector<std::byte>> bufs(static_cast<std::size_t>(n), std::vector<std::byte>(size));
        bufs[static_cast<std::size_t>(root)] = want;
        world.runOk([&](int r, HostCommunicator& c) { c.broadcast(bufs[static_cast<std::size_t>(r)], root); });
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(bufs[static_cast<std::size_t>(r)], want) << "n " << n << " root " << root << " size " << size;
      }
    }
  }
}

// Nobody leaves a barrier before everyone entered it, round after round.
TEST(Barrier, NoRankLeavesEarly) {
  for (int n : {1, 2, 3, 5, 8}) {
    World world(n);
    constexpr int kRounds = 20;
    std::vector<std::atomic<int>> arrived(kRounds);
    world.runOk([&](int r, HostCommunicator& c) {
      for (int round = 0; round < kRounds; ++round) {
        if ((r + round) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        ++arrived[static_cast<std::size_t>(round)];
        c.barrier();
        if (arrived[static_cast<std::size_t>(round)].load() != n) throw std::runtime_error("left the barrier early");
      }
    });
  }
}

// Several operations in flight at once, each under its own tag, issued in the same order everywhere but completed in
// any order, with blocking calls interleaved and compute running meanwhile.
TEST(NonBlocking, OverlappingOperationsCompleteCorrectly) {
  World world(4);
  testing::checkOverlappingOperations(world);
}

// An async op's failure reaches its request, and later requests fail fast instead of hanging.
TEST(NonBlocking, FailureReachesTheRequest) {
  World world(2);
  const auto res = world.run([&](int r, HostCommunicator& c) {
    std::vector<float> a(1000, 1.0f);
    if (r == 1) c.transport().abort("rank 1 gives up");
    CommRequest q = c.iallreduce(a.data(), a.size(), DType::kF32);
    q.wait();
  });
  EXPECT_FALSE(res.watchdog_fired);
  EXPECT_NE(res.message(0).find("rank 1 gives up"), std::string::npos) << res.message(0);
}

}  // namespace
}  // namespace terse::comm
