// The tcp data path's fast parts: the pipelined ring (allreduce_ring.h) over real sockets at sizes that divide into
// neither the ranks nor the segment, with its frames exactly those of the step-by-step ring; a reduce receive added
// piece by piece as it is read (reader.cc), with elements split across reads; sends written by the calling thread
// while the io thread writes others (writer.cc) keeping their order; and the socket buffers asked for (connect.h).
#include <numeric>
#include <thread>

#include "core/comm/tcp/connect.h"
#include "tests/comm/tcp/tcp_test_util.h"

namespace terse::comm {
namespace {

using testing::RawClient;
using testing::TcpWorld;

// What rank r of n sends in a ring allreduce of `count` elements cut into frames of `seg` bytes: reduce-scatter step s
// sends chunk r - s, allgather step s chunk r + 1 - s, each chunk as its frames (allreduce_ring.h).
uint64_t ringSentBytes(int r, int n, std::size_t count, std::size_t elem, uint64_t seg) {
  if (n == 1) return 0;
  uint64_t total = 0;
  for (int s = 0; s < n - 1; ++s)
    for (int c : {modRank(r - s, n), modRank(r + 1 - s, n)}) {
      const uint64_t bytes = ringChunk(count, n, c).size * elem;
      total += bytes + kFrameHeaderBytes * segmentCount(bytes, seg);
    }
  return total;
}

class TcpPipelinedRing : public ::testing::TestWithParam<int> {};

TEST_P(TcpPipelinedRing, ExactSumAndTheStepByStepRingsFrames) {
  const int n = GetParam();
  HostCommOptions options;
  options.algorithm = AllreduceAlgorithm::kRing;
  options.segment_bytes = 1000;  // not a power of two: segments end mid-chunk and chunks mid-segment
  TcpWorld world(n, options);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::size_t elem = dtypeSize(dtype);
    const uint64_t seg = 1000 / elem * elem;
    for (std::size_t count :
         {std::size_t{1}, std::size_t{3}, std::size_t{999}, std::size_t{4099}, std::size_t{65537}}) {
      const auto in = testing::makeInputs(n, count, dtype);
      const auto want = testing::expectedRing(in, count, dtype);
      auto out = in;
      std::vector<WireBytes> wire(static_cast<std::size_t>(n));
      world.runOk([&](int r, HostCommunicator& c) {
        const auto ur = static_cast<std::size_t>(r);
        wire[ur] = c.allreduce(out[ur].data(), count, dtype);
      });
      for (int r = 0; r < n; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        EXPECT_TRUE(testing::sameBytes(out[ur], want, dtype))
            << "rank " << r << " count " << count << " " << dtypeName(dtype);
        EXPECT_EQ(wire[ur].sent_bytes, ringSentBytes(r, n, count, elem, seg)) << "rank " << r << " count " << count;
        // Every rank receives what its left neighbour sends.
        EXPECT_EQ(wire[ur].received_bytes, ringSentBytes(modRank(r - 1, n), n, count, elem, seg));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TcpPipelinedRing, ::testing::Values(1, 2, 3, 4, 5));

// A rank of world 2 played by a raw socket, so the test decides how a frame's bytes arrive.
struct RawPeer {
  MemoryStore store;
  JobToken token = JobToken::generate();
  std::unique_ptr<Transport> t0;
  std::unique_ptr<RawClient> fake;
  RawPeer() {
    std::thread rank0([&] { t0 = connectTcpTransport(testing::tcpOptions(0, 2), token, store); });
    fake = std::make_unique<RawClient>(store.get("tcp/addr/0", std::chrono::seconds(10)));
    const int acked = fake->join(token, 1, 2, "raw");
    rank0.join();
    if (acked != 0 || !t0) throw std::runtime_error("the raw peer could not join");
  }
};

// The fused receive adds whole elements as they are read and keeps a split element's bytes for the next read: a frame
// written in odd-sized pieces (an element's bytes in two or three reads), and one larger than the piece the reader
// adds at a time, must add up exactly as a frame read at once.
TEST(TcpFusedReduce, ElementsSplitAcrossReadsAddExactly) {
  RawPeer peer;
  const FrameMeta meta{OpKind::kP2P, 9, kNoTensor};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (std::size_t count : {std::size_t{5}, std::size_t{100003}}) {  // 100003 f32: 400 KB, above one 256 KiB piece
      SCOPED_TRACE(std::string(dtypeName(dtype)) + " count " + std::to_string(count));
      const auto mine = testing::makeInput(0, count, dtype);
      const auto theirs = testing::makeInput(1, count, dtype);
      auto acc = mine;
      Request r = peer.t0->irecvReduce(1, meta, acc, dtype);
      const auto header = encodeFrameHeader(FrameHeader{meta, theirs.size()});
      ASSERT_TRUE(peer.fake->write(header));
      // Pieces of 1, 3, 7, ... bytes and then large odd ones, each its own segment on the wire (TCP_NODELAY on both
      // sides; the pause lets the reader take each alone).
      std::size_t off = 0;
      for (std::size_t piece : {1, 3, 7, 13, 4093, 65521, 131071}) {
        const std::size_t len = std::min(piece, theirs.size() - off);
        ASSERT_TRUE(peer.fake->write(std::span(theirs).subspan(off, len)));
        off += len;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      ASSERT_TRUE(peer.fake->write(std::span(theirs).subspan(off)));
      r.wait();
      EXPECT_EQ(r.bytes(), theirs.size());
      auto want = mine;
      for (std::size_t i = 0; i < count; ++i)
        testing::store(want, i, dtype,
                       testing::add(testing::load(theirs, i, dtype), testing::load(mine, i, dtype), dtype));
      EXPECT_TRUE(testing::sameBytes(acc, want, dtype));
    }
  }
}

// Sends from several threads at once on one link: some written by the calling thread (the link idle), some queued
// behind a running write for the io thread. Frames of one tag keep their order either way.
TEST(TcpDirectSend, ConcurrentSendersKeepEachTagsOrder) {
  MemoryStore store;
  const JobToken token = JobToken::generate();
  auto t = testing::connectTcpWorld(2, store, token);
  constexpr int kThreads = 3, kFrames = 200;
  std::vector<std::thread> senders;
  for (int k = 0; k < kThreads; ++k) {
    senders.emplace_back([&, k] {
      const FrameMeta meta{OpKind::kP2P, static_cast<Tag>(100 + k), kNoTensor};
      std::vector<std::vector<uint32_t>> frames;
      for (int i = 0; i < kFrames; ++i) frames.emplace_back(static_cast<std::size_t>(1 + (i * 37) % 5000), i);
      std::vector<Request> sends;
      for (auto& f : frames) sends.push_back(t[0]->isend(1, meta, std::as_bytes(std::span(f))));
      for (auto& s : sends) s.wait();
    });
  }
  std::vector<std::thread> receivers;
  std::atomic<int> wrong{0};
  for (int k = 0; k < kThreads; ++k) {
    receivers.emplace_back([&, k] {
      const FrameMeta meta{OpKind::kP2P, static_cast<Tag>(100 + k), kNoTensor};
      std::vector<uint32_t> buf(5000);
      for (int i = 0; i < kFrames; ++i) {
        const uint64_t got = t[1]->recv(0, meta, std::as_writable_bytes(std::span(buf)));
        const std::size_t words = static_cast<std::size_t>(1 + (i * 37) % 5000);
        if (got != words * 4 || buf[0] != static_cast<uint32_t>(i) || buf[words - 1] != static_cast<uint32_t>(i))
          ++wrong;
      }
    });
  }
  for (auto& s : senders) s.join();
  for (auto& r : receivers) r.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(TcpSocketBuffers, SendBufferHoldsASegmentAndEmulatedLinksTheirBandwidthDelayProduct) {
  EmulationConfig off;
  EXPECT_EQ(tcp::wantedSocketBuffers(off, 4).send, tcp::kDirectSendBufferBytes);
  EXPECT_EQ(tcp::wantedSocketBuffers(off, 4).receive, 0u);  // the OS's autotuning
  EmulationConfig e = parseEmulation("bandwidth=10Gbps,latency=5ms");
  e.overrides.push_back(LinkOverride{0, 1, LinkSpec{40e9, 5e-3}});
  // The largest link: 40 Gbit/s for a 10 ms round trip = 50 MB in flight.
  const auto b = tcp::wantedSocketBuffers(e, 3);
  EXPECT_EQ(b.receive, 50'000'000u);
  EXPECT_EQ(b.send, 50'000'000u);
  // A slow link's product is below the segment: the send side keeps its minimum.
  EXPECT_EQ(tcp::wantedSocketBuffers(parseEmulation("bandwidth=1Gbps,latency=10us"), 2).send,
            tcp::kDirectSendBufferBytes);
}

}  // namespace
}  // namespace terse::comm
