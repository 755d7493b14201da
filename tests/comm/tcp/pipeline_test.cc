// The tcp data path's fast parts: the pipelined ring (allreduce_ring.h) over real sockets at sizes that divide into
// neither the ranks nor the segment, with its frames exactly those of the step-by-step ring; a reduce receive added
// piece by piece as it is read (reader.cc), with elements split across reads; sends written by the calling thread
// while the io thread writes others (writer.cc) keeping their order; the bulk writer's backlogs (writer.cc); and the
// socket buffers asked for (connect.h).
#include <algorithm>
#include <future>
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

// ---- the bulk writer (writer.cc): the frames a direct write could not finish ------------------------------------

// Bytes that differ with the seed and with the 4 KiB block they are in, so a block out of place shows.
std::vector<std::byte> bulkPattern(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 31 + (i >> 12) * 7 + static_cast<std::size_t>(seed) * 13) & 0xFF);
  return v;
}

// Frames larger than a socket's buffers to a peer that reads nothing yet: the caller's direct write stops when the
// socket is full and the bulk writer owns the link until the peer reads. Meanwhile another link's large frame must go
// through -- the bulk writer waits on every link it owns at once, so a stalled peer holds up no other -- and once the
// stalled peer posts its receives, its frames arrive whole and in order; one of them was dropped by its sender while
// backlogged (request.h: the transport copies what it has not written) and its buffer overwritten at once.
TEST(TcpBulkWriter, AStalledPeerHoldsUpNoOtherLinkAndItsBacklogArrivesWhole) {
  MemoryStore store;
  const JobToken token = JobToken::generate();
  auto t = testing::connectTcpWorld(3, store, token);
  constexpr std::size_t kBig = std::size_t{24} << 20;  // above the 8 MiB send buffer plus any receive window
  const FrameMeta to1{OpKind::kP2P, 11, kNoTensor};
  const FrameMeta to2{OpKind::kP2P, 12, kNoTensor};
  std::vector<std::vector<std::byte>> frames;
  for (int i = 0; i < 3; ++i) frames.push_back(bulkPattern(kBig - static_cast<std::size_t>(i) * 4099, i + 1));
  std::vector<Request> sends;
  sends.push_back(t[0]->isend(1, to1, frames[0]));
  { Request dropped = t[0]->isend(1, to1, frames[1]); }  // queued behind frames[0]: the transport keeps a copy
  std::fill(frames[1].begin(), frames[1].end(), std::byte{0});
  sends.push_back(t[0]->isend(1, to1, frames[2]));

  const std::vector<std::byte> other = bulkPattern(kBig + 5, 9);
  std::vector<std::byte> got2(other.size());
  auto second = std::async(std::launch::async, [&] {
    // Sent before rank 2 posts its receive, so that rank 2 parks it and this link too fills up and goes to the bulk
    // writer, which then owns both.
    Request s = t[0]->isend(2, to2, other);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Request r = t[2]->irecv(0, to2, got2);
    r.wait();
    s.wait();
    return r.bytes();
  });
  const bool through = second.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  EXPECT_TRUE(through) << "a frame to rank 2 waited for rank 1, which reads nothing";

  std::vector<std::vector<std::byte>> got;
  for (int i = 0; i < 3; ++i) got.emplace_back(kBig);
  for (int i = 0; i < 3; ++i) {
    auto buf = std::span(got[static_cast<std::size_t>(i)]);
    const uint64_t n = t[1]->recv(0, to1, buf);
    EXPECT_EQ(n, kBig - static_cast<std::size_t>(i) * 4099) << "frame " << i;
    EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n),
                           bulkPattern(static_cast<std::size_t>(n), i + 1).begin()))
        << "frame " << i;
  }
  for (auto& s : sends) s.wait();
  EXPECT_EQ(second.get(), other.size());
  EXPECT_EQ(got2, other);
}

// Many frames of two tags, sizes from a byte to several socket buffers, sent as fast as the caller can to a reader that
// takes them slowly: the link passes between the caller's direct writes, the bulk writer and back many times, and every
// frame arrives whole, each tag in order.
TEST(TcpBulkWriter, HandOversKeepEachTagsOrderAndBytes) {
  MemoryStore store;
  const JobToken token = JobToken::generate();
  auto t = testing::connectTcpWorld(2, store, token);
  constexpr int kFrames = 40;
  auto sizeOf = [](int i) {
    return static_cast<std::size_t>(i % 5 == 0 ? (std::size_t{9} << 20) + static_cast<std::size_t>(i)
                                               : (static_cast<std::size_t>(i) * 104729) % (std::size_t{3} << 20) + 1);
  };
  auto metaOf = [](int i) { return FrameMeta{OpKind::kP2P, static_cast<Tag>(30 + i % 2), kNoTensor}; };
  std::atomic<int> wrong{0};
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the first frames fill the socket
    std::vector<std::byte> buf((std::size_t{9} << 20) + kFrames);
    // Tag 31's frames first, then tag 30's: each tag's frames in the order they were sent.
    for (int parity : {1, 0})
      for (int i = parity; i < kFrames; i += 2) {
        try {
          const uint64_t n = t[1]->recv(0, metaOf(i), buf);
          if (n != sizeOf(i) ||
              !std::equal(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n), bulkPattern(sizeOf(i), i).begin()))
            ++wrong;
        } catch (const std::exception& e) {
          ADD_FAILURE() << "frame " << i << ": " << e.what();
          return;
        }
        if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
  });
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < kFrames; ++i) data.push_back(bulkPattern(sizeOf(i), i));
  std::vector<Request> sends;
  for (int i = 0; i < kFrames; ++i) sends.push_back(t[0]->isend(1, metaOf(i), data[static_cast<std::size_t>(i)]));
  for (auto& s : sends) s.wait();
  reader.join();
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
