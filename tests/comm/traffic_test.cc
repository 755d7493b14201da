// Byte accounting: the exact wire bytes of every collective, per rank, from closed formulas written independently of
// the algorithms' loops, checked against both the transport's counters (per kind, per tensor) and what each call
// returned. Small segments make the per-frame headers and the chunk remainders show.
#include <gtest/gtest.h>

#include <numeric>

#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

using testing::World;

constexpr uint64_t kHeader = kFrameHeaderBytes;

uint64_t frames(uint64_t bytes, uint64_t seg) {
  return bytes == 0 ? 0 : (bytes + seg - 1) / seg;
}

// Ring allreduce: reduce-scatter sends every chunk but (r + 1), allgather every chunk but (r + 2) (allreduce_ring.h),
// so rank r sends 2S - c(r+1) - c(r+2) payload bytes: 2(n-1)/n * S when n divides the element count.
uint64_t ringSent(int n, int r, uint64_t count, uint64_t elem, uint64_t seg) {
  if (n == 1) return 0;
  uint64_t total_bytes = 0, total_frames = 0;
  auto chunk = [&](int c) {
    const uint64_t base = count / static_cast<uint64_t>(n), rem = count % static_cast<uint64_t>(n);
    return (base + (static_cast<uint64_t>(c) < rem ? 1 : 0)) * elem;
  };
  for (int c = 0; c < n; ++c) {
    total_bytes += chunk(c);
    total_frames += frames(chunk(c), seg);
  }
  const int skip1 = (r + 1) % n, skip2 = (r + 2) % n;
  const uint64_t payload = 2 * total_bytes - chunk(skip1) - chunk(skip2);
  const uint64_t nframes = 2 * total_frames - frames(chunk(skip1), seg) - frames(chunk(skip2), seg);
  return payload + kHeader * nframes;
}

struct Expect {
  uint64_t sent = 0;
  uint64_t received = 0;
};

void checkCounts(World& world, OpKind kind, uint64_t tensor, const std::vector<Expect>& want,
                 const std::vector<WireBytes>& returned) {
  const auto traffic = world.fabric->traffic();
  for (int r = 0; r < world.size(); ++r) {
    const auto& t = traffic[static_cast<std::size_t>(r)];
    const auto& w = want[static_cast<std::size_t>(r)];
    EXPECT_EQ(t.sent.kind(kind).bytes, w.sent) << opKindName(kind) << " rank " << r;
    EXPECT_EQ(t.received.kind(kind).bytes, w.received) << opKindName(kind) << " rank " << r;
    EXPECT_EQ(t.sent.tensor(tensor).bytes, w.sent) << "per-tensor, rank " << r;
    EXPECT_EQ(t.sent.total().bytes, w.sent) << "nothing else was sent, rank " << r;
    EXPECT_EQ(returned[static_cast<std::size_t>(r)].sent_bytes, w.sent) << "returned, rank " << r;
    EXPECT_EQ(returned[static_cast<std::size_t>(r)].received_bytes, w.received) << "returned, rank " << r;
    EXPECT_EQ(t.sent.total().frames, returned[static_cast<std::size_t>(r)].sent_frames);
  }
}

TEST(Traffic, RingAllreduceExactBytes) {
  const uint64_t seg = 4096;
  for (int n : {2, 3, 4, 5, 8}) {
    for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, uint64_t{1001}, uint64_t{(1 << 18) + 3}}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        HostCommOptions options;
        options.algorithm = AllreduceAlgorithm::kRing;
        options.segment_bytes = seg;
        World world(n, options);
        const uint64_t elem = dtypeSize(dtype);
        std::vector<WireBytes> returned(static_cast<std::size_t>(n));
        world.runOk([&](int r, HostCommunicator& c) {
          auto buf = testing::makeInput(r, count, dtype);
          returned[static_cast<std::size_t>(r)] = c.allreduce(buf.data(), count, dtype, ReduceOp::kSum, 42);
        });
        std::vector<Expect> want;
        for (int r = 0; r < n; ++r)
          want.push_back({ringSent(n, r, count, elem, seg), ringSent(n, (r + n - 1) % n, count, elem, seg)});
        checkCounts(world, OpKind::kAllreduce, 42, want, returned);
      }
    }
  }
}

// The textbook number, spelled out once: n = 4, S = 4 MiB of f32, 64 KiB frames. Each chunk is 1 MiB = 16 frames and
// every rank sends 2(n-1) = 6 chunks: 2(n-1)/n * S = 6 MiB of payload plus 6 * 16 headers of 32 bytes.
TEST(Traffic, RingAllreduceTextbookCase) {
  HostCommOptions options;
  options.algorithm = AllreduceAlgorithm::kRing;
  options.segment_bytes = 64 * 1024;
  World world(4, options);
  world.runOk([&](int, HostCommunicator& c) {
    std::vector<float> data(1 << 20, 1.0f);
    c.allreduce(data.data(), data.size(), DType::kF32);
  });
  for (const auto& t : world.fabric->traffic()) {
    EXPECT_EQ(t.sent.kind(OpKind::kAllreduce).bytes, 6u * 1024 * 1024 + 6 * 16 * 32);
    EXPECT_EQ(t.sent.kind(OpKind::kAllreduce).frames, 96u);
    EXPECT_EQ(t.received.kind(OpKind::kAllreduce).bytes, 6u * 1024 * 1024 + 6 * 16 * 32);
  }
}

// Recursive doubling: with p = 2^floor(log2 n) and rem = n - p, even ranks below 2*rem send S once and receive it
// once; odd ranks below 2*rem receive S, exchange S log2(p) times, send S; the rest exchange log2(p) times.
TEST(Traffic, RecursiveDoublingExactBytes) {
  const uint64_t seg = 1000;
  for (int n : {2, 3, 5, 6, 8}) {
    for (uint64_t count : {uint64_t{0}, uint64_t{7}, uint64_t{999}}) {
      HostCommOptions options;
      options.algorithm = AllreduceAlgorithm::kRecursiveDoubling;
      options.segment_bytes = seg;
      World world(n, options);
      std::vector<WireBytes> returned(static_cast<std::size_t>(n));
      world.runOk([&](int r, HostCommunicator& c) {
        auto buf = testing::makeInput(r, count, DType::kF32);
        returned[static_cast<std::size_t>(r)] = c.allreduce(buf.data(), count, DType::kF32, ReduceOp::kSum, 3);
      });
      int p = 1, log_p = 0;
      while (p * 2 <= n) p *= 2, ++log_p;
      const int rem = n - p;
      const uint64_t msg = count * 4 + kHeader * frames(count * 4, seg);
      std::vector<Expect> want;
      for (int r = 0; r < n; ++r) {
        uint64_t messages_sent = 0, messages_received = 0;
        if (r < 2 * rem && r % 2 == 0) {
          messages_sent = messages_received = 1;
        } else if (r < 2 * rem) {
          messages_sent = messages_received = static_cast<uint64_t>(log_p) + 1;
        } else {
          messages_sent = messages_received = static_cast<uint64_t>(log_p);
        }
        want.push_back({messages_sent * msg, messages_received * msg});
      }
      checkCounts(world, OpKind::kAllreduce, 3, want, returned);
    }
  }
}

// Ring allgatherv: rank r forwards every block but block r + 1.
TEST(Traffic, AllgathervExactBytes) {
  const uint64_t seg = 500;
  for (int n : {2, 3, 5}) {
    std::vector<uint64_t> sizes;
    for (int r = 0; r < n; ++r) sizes.push_back(static_cast<uint64_t>(r % 3) * 777);
    World world(n, HostCommOptions{AllreduceAlgorithm::kAuto, 64 * 1024, seg, AllgatherAlgorithm::kRing});
    const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
    std::vector<WireBytes> returned(static_cast<std::size_t>(n));
    world.runOk([&](int r, HostCommunicator& c) {
      std::vector<std::byte> mine(sizes[static_cast<std::size_t>(r)]), out(total);
      returned[static_cast<std::size_t>(r)] = c.allgatherv(mine, out, sizes, 5);
    });
    auto sent = [&](int r) {
      uint64_t b = 0;
      for (int i = 0; i < n; ++i) {
        if (i == (r + 1) % n) continue;
        b += sizes[static_cast<std::size_t>(i)] + kHeader * frames(sizes[static_cast<std::size_t>(i)], seg);
      }
      return b;
    };
    std::vector<Expect> want;
    for (int r = 0; r < n; ++r) want.push_back({sent(r), sent((r + n - 1) % n)});
    checkCounts(world, OpKind::kAllgather, 5, want, returned);
  }
}

// Binomial broadcast: every non-root receives S once; a rank sends S to each child vr + 2^k (2^k below its lowest set
// bit, any k for the root) that exists. Barrier: ceil(log2 n) header-only frames each way.
TEST(Traffic, BroadcastAndBarrierExactBytes) {
  const uint64_t size = 10000, seg = 4096;
  for (int n : {2, 3, 5, 8}) {
    for (int root : {0, n - 1}) {
      World world(n, HostCommOptions{AllreduceAlgorithm::kAuto, 64 * 1024, seg});
      std::vector<WireBytes> returned(static_cast<std::size_t>(n));
      world.runOk([&](int r, HostCommunicator& c) {
        std::vector<std::byte> buf(size);
        returned[static_cast<std::size_t>(r)] = c.broadcast(buf, root, 8);
      });
      const uint64_t msg = size + kHeader * frames(size, seg);
      std::vector<Expect> want;
      for (int r = 0; r < n; ++r) {
        const int vr = (r - root + n) % n;
        uint64_t children = 0;
        for (int m = 1; m < n; m *= 2) {
          if (vr != 0 && m >= (vr & -vr)) break;
          if (vr + m < n) ++children;
        }
        want.push_back({children * msg, vr == 0 ? 0 : msg});
      }
      checkCounts(world, OpKind::kBroadcast, 8, want, returned);
    }
    World world(n);
    std::vector<WireBytes> returned(static_cast<std::size_t>(n));
    world.runOk([&](int r, HostCommunicator& c) { returned[static_cast<std::size_t>(r)] = c.barrier(); });
    uint64_t rounds = 0;
    for (int k = 1; k < n; k *= 2) ++rounds;
    checkCounts(world, OpKind::kBarrier, kNoTensor,
                std::vector<Expect>(static_cast<std::size_t>(n), {32 * rounds, 32 * rounds}), returned);
  }
}

// Snapshots attribute bytes to each op kind and tensor; reset starts from zero.
TEST(Traffic, PerKindPerTensorSnapshotAndReset) {
  World world(3);
  world.runOk([&](int r, HostCommunicator& c) {
    std::vector<float> a(100, 1.0f), b(200, 1.0f);
    c.allreduce(a.data(), a.size(), DType::kF32, ReduceOp::kSum, 1);
    c.allreduce(b.data(), b.size(), DType::kF32, ReduceOp::kSum, 2);
    c.barrier();
    std::vector<std::byte> p2p(10);
    if (r == 0) c.transport().send(1, FrameMeta{OpKind::kP2P, 1, 2}, p2p);
    if (r == 1) c.transport().recv(0, FrameMeta{OpKind::kP2P, 1, 2}, p2p);
  });
  const RankTraffic t0 = world.comms[0]->traffic();
  EXPECT_GT(t0.sent.tensor(1).bytes, 0u);
  EXPECT_GT(t0.sent.tensor(2).bytes, t0.sent.tensor(1).bytes);
  EXPECT_EQ(t0.sent.kind(OpKind::kP2P).bytes, 42u);
  EXPECT_EQ(t0.sent.kind(OpKind::kP2P).frames, 1u);
  EXPECT_EQ(world.comms[1]->traffic().received.kind(OpKind::kP2P).bytes, 42u);
  EXPECT_EQ(t0.sent.total().bytes, t0.sent.kind(OpKind::kAllreduce).bytes + t0.sent.kind(OpKind::kBarrier).bytes + 42);
  EXPECT_EQ(t0.sent.tensor(kNoTensor), t0.sent.kind(OpKind::kBarrier));
  world.comms[0]->resetTraffic();
  EXPECT_EQ(world.comms[0]->traffic().sent.total().bytes, 0u);
  EXPECT_GT(world.comms[1]->traffic().sent.total().bytes, 0u);
  world.fabric->resetTraffic();
  for (const auto& t : world.fabric->traffic()) EXPECT_EQ(t.received.total().frames, 0u);
}

// The counter remembers the by_tensor entry of the last frame (traffic.h): runs of one tensor, switches between
// tensors and back, and a reset between two frames of the same tensor must all land in the right, fresh entries.
TEST(Traffic, CounterPerTensorRunsAndResetBetweenThem) {
  TrafficCounter counter(4);
  const FrameMeta t7{OpKind::kAllreduce, 1, 7}, t9{OpKind::kAllgather, 2, 9};
  counter.recordSent(t7, 100);
  counter.recordSent(t7, 50);
  counter.recordSent(t9, 10);
  counter.recordSent(t7, 0);
  counter.recordReceived(t9, 20);
  RankTraffic t = counter.snapshot();
  EXPECT_EQ(t.rank, 4);
  EXPECT_EQ(t.sent.tensor(7), (FrameCount{150 + 3 * kHeader, 3}));
  EXPECT_EQ(t.sent.tensor(9), (FrameCount{10 + kHeader, 1}));
  EXPECT_EQ(t.received.tensor(9), (FrameCount{20 + kHeader, 1}));
  EXPECT_EQ(t.received.tensor(7), FrameCount{});
  EXPECT_EQ(t.sent.kind(OpKind::kAllreduce), t.sent.tensor(7));
  counter.reset();
  counter.recordSent(t7, 1);  // the same tensor as the last frame before the reset: a fresh entry
  counter.recordReceived(t9, 2);
  t = counter.snapshot();
  EXPECT_EQ(t.sent.tensor(7), (FrameCount{1 + kHeader, 1}));
  EXPECT_EQ(t.sent.by_tensor.size(), 1u);
  EXPECT_EQ(t.received.tensor(9), (FrameCount{2 + kHeader, 1}));
  EXPECT_EQ(t.sent.total(), (FrameCount{1 + kHeader, 1}));
}

}  // namespace
}  // namespace terse::comm
