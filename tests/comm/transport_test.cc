// The inproc transport: matching by tag, eager and rendezvous frames, non-blocking progress, protocol errors, and a
// corrupted header as a clear error on every rank instead of a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <numeric>
#include <thread>

#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

std::vector<std::byte> bytesOf(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(seed)) & 0xFF);
  return v;
}

const FrameMeta kP2P{OpKind::kP2P, 5, kNoTensor};

// Small (eager) and large (rendezvous) frames, in both orders of send and receive posting.
TEST(Inproc, SendRecvBothOrdersBothSizes) {
  for (std::size_t size : {std::size_t{0}, std::size_t{10}, std::size_t{65536}, std::size_t{1 << 20}}) {
    for (bool recv_first : {false, true}) {
      auto fabric = InprocFabric::create(2);
      auto t0 = fabric->endpoint(0);
      auto t1 = fabric->endpoint(1);
      const auto data = bytesOf(size, 3);
      std::vector<std::byte> got(size + 8, std::byte{0x5A});
      Request rr, sr;
      if (recv_first) rr = t1->irecv(0, kP2P, got);
      sr = t0->isend(1, kP2P, data);
      if (!recv_first) rr = t1->irecv(0, kP2P, got);
      rr.wait();
      sr.wait();
      EXPECT_EQ(rr.bytes(), size);
      EXPECT_TRUE(std::equal(data.begin(), data.end(), got.begin())) << size << " " << recv_first;
      EXPECT_EQ(got[size], std::byte{0x5A}) << "wrote past the frame";
    }
  }
}

// Frames of different tags are matched independently; frames of one tag stay in order.
TEST(Inproc, TagMatchingAndOrder) {
  auto fabric = InprocFabric::create(2);
  auto t0 = fabric->endpoint(0);
  auto t1 = fabric->endpoint(1);
  const auto a1 = bytesOf(100, 1), a2 = bytesOf(100, 2), b1 = bytesOf(200000, 3);
  std::vector<Request> sends;
  sends.push_back(t0->isend(1, FrameMeta{OpKind::kP2P, 1, 0}, a1));
  sends.push_back(t0->isend(1, FrameMeta{OpKind::kP2P, 1, 0}, a2));
  sends.push_back(t0->isend(1, FrameMeta{OpKind::kP2P, 2, 0}, b1));
  std::vector<std::byte> gb(200000), ga1(100), ga2(100);
  EXPECT_EQ(t1->recv(0, FrameMeta{OpKind::kP2P, 2, 0}, gb), 200000u);
  EXPECT_EQ(t1->recv(0, FrameMeta{OpKind::kP2P, 1, 0}, ga1), 100u);
  EXPECT_EQ(t1->recv(0, FrameMeta{OpKind::kP2P, 1, 0}, ga2), 100u);
  for (auto& s : sends) s.wait();
  EXPECT_EQ(gb, b1);
  EXPECT_EQ(ga1, a1);
  EXPECT_EQ(ga2, a2);
}

// The sender's wait of a large frame can make the copy itself, so two ranks that both wait on their sends before
// their receives do not deadlock.
TEST(Inproc, WaitingOnSendsFirstProgresses) {
  auto fabric = InprocFabric::create(2);
  const auto res = testing::spawnRanks(
      2,
      [&](int r) {
        auto t = fabric->endpoint(r);
        const auto data = bytesOf(1 << 20, r);
        std::vector<std::byte> got(1 << 20);
        Request rr = t->irecv(1 - r, kP2P, got);
        Request sr = t->isend(1 - r, kP2P, data);
        sr.wait();
        rr.wait();
        if (got != bytesOf(1 << 20, 1 - r)) throw std::runtime_error("wrong data");
      },
      fabric.get(), std::chrono::seconds(20));
  testing::expectNoErrors(res);
}

// irecvReduce adds the frame into the buffer instead of overwriting it, from an eager copy or straight from the
// sender's buffer, in either posting order; a frame that is not whole elements is refused.
TEST(Inproc, ReceiveReduce) {
  for (std::size_t count : {std::size_t{3}, std::size_t{100000}}) {
    for (bool recv_first : {false, true}) {
      auto fabric = InprocFabric::create(2);
      auto t0 = fabric->endpoint(0);
      auto t1 = fabric->endpoint(1);
      std::vector<float> x(count), acc(count);
      for (std::size_t i = 0; i < count; ++i) {
        x[i] = static_cast<float>(i % 13);
        acc[i] = 0.5f;
      }
      const auto bytes = std::as_bytes(std::span<const float>(x));
      const auto into = std::as_writable_bytes(std::span<float>(acc));
      Request rr, sr;
      if (recv_first) rr = t1->irecvReduce(0, kP2P, into, DType::kF32);
      sr = t0->isend(1, kP2P, bytes);
      if (!recv_first) rr = t1->irecvReduce(0, kP2P, into, DType::kF32);
      rr.wait();
      sr.wait();
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(acc[i], x[i] + 0.5f) << i;
    }
  }
  auto fabric = InprocFabric::create(2);
  auto t0 = fabric->endpoint(0);
  auto t1 = fabric->endpoint(1);
  const auto odd = bytesOf(6, 1);
  t0->isend(1, kP2P, odd);
  std::vector<std::byte> acc(8);
  Request r = t1->irecvReduce(0, kP2P, acc, DType::kF32);
  EXPECT_THROW(r.wait(), InvalidPayload);
  int32_t ints[2] = {};
  EXPECT_THROW(t1->irecvReduce(0, kP2P, std::as_writable_bytes(std::span<int32_t>(ints)), DType::kI32), Unsupported);
}

// A small frame whose receive is already posted is moved into the receive's buffer by isend itself (copied, or added
// for irecvReduce): the buffer holds it before the receiver touches its request, the sender's buffer is free at once,
// and the frame is counted once. A receive that refuses it fails as it would have, and the send completes. Not so on
// emulated links, where the pacer sets when the bytes arrive.
TEST(Inproc, ASmallFrameToAPostedReceiveIsDeliveredBySend) {
  for (bool reduce : {false, true}) {
    auto fabric = InprocFabric::create(2);
    auto t0 = fabric->endpoint(0);
    auto t1 = fabric->endpoint(1);
    std::vector<float> x(1024), acc(1024, 0.5f);
    std::iota(x.begin(), x.end(), 1.0f);
    const auto into = std::as_writable_bytes(std::span<float>(acc));
    Request rr = reduce ? t1->irecvReduce(0, kP2P, into, DType::kF32) : t1->irecv(0, kP2P, into);
    Request sr = t0->isend(1, kP2P, std::as_bytes(std::span<const float>(x)));
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(acc[i], reduce ? x[i] + 0.5f : x[i]) << reduce << " " << i;
    std::fill(x.begin(), x.end(), -1.0f);  // the send is complete: its buffer is the caller's again
    EXPECT_TRUE(sr.test());
    rr.wait();
    EXPECT_EQ(rr.bytes(), 4096u);
    EXPECT_EQ(acc[7], reduce ? 8.5f : 8.0f);
    const auto traffic = fabric->traffic();
    EXPECT_EQ(traffic[0].sent.total().frames, 1u);
    EXPECT_EQ(traffic[1].received.total().frames, 1u);
  }
  {
    auto fabric = InprocFabric::create(2);
    auto t0 = fabric->endpoint(0);
    auto t1 = fabric->endpoint(1);
    std::vector<std::byte> small(10, std::byte{0x5A});
    Request rr = t1->irecv(0, kP2P, small);
    Request sr = t0->isend(1, kP2P, bytesOf(20, 0));
    EXPECT_TRUE(sr.test());
    EXPECT_THROW(rr.wait(), InvalidPayload);
    EXPECT_EQ(small, std::vector<std::byte>(10, std::byte{0x5A}));
  }
  {
    InprocOptions emulated;
    emulated.emulation.link = {1e9, 0.05};
    auto fabric = InprocFabric::create(2, emulated);
    auto t0 = fabric->endpoint(0);
    auto t1 = fabric->endpoint(1);
    std::vector<std::byte> got(100, std::byte{0x5A});
    Request rr = t1->irecv(0, kP2P, got);
    const auto data = bytesOf(100, 4);
    Request sr = t0->isend(1, kP2P, data);
    EXPECT_EQ(got[0], std::byte{0x5A}) << "moved before the emulated link delivered it";
    rr.wait();
    sr.wait();
    EXPECT_EQ(got, data);
  }
}

// Dropping unfinished requests: a receive is cancelled (the next receive gets the frame), a large send still
// delivers its data even though the sender's buffer is gone.
TEST(Inproc, DroppedRequestsAreSafe) {
  auto fabric = InprocFabric::create(2);
  auto t0 = fabric->endpoint(0);
  auto t1 = fabric->endpoint(1);
  {
    std::vector<std::byte> gone(16);
    Request dropped = t1->irecv(0, kP2P, gone);
  }
  const auto want = bytesOf(500000, 4);
  {
    std::vector<std::byte> data = want;
    Request s = t0->isend(1, kP2P, data);
  }  // handle and buffer gone before any receive was posted
  std::vector<std::byte> got(500000);
  EXPECT_EQ(t1->recv(0, kP2P, got), 500000u);
  EXPECT_EQ(got, want);
}

TEST(Inproc, TestPollsToCompletion) {
  auto fabric = InprocFabric::create(2);
  auto t0 = fabric->endpoint(0);
  auto t1 = fabric->endpoint(1);
  std::vector<std::byte> got(300000);
  Request rr = t1->irecv(0, kP2P, got);
  EXPECT_FALSE(rr.test());
  const auto data = bytesOf(300000, 1);
  Request sr = t0->isend(1, kP2P, data);
  while (!rr.test()) {
  }
  EXPECT_TRUE(sr.test());
  EXPECT_EQ(got, data);
}

TEST(Inproc, ProtocolErrors) {
  auto fabric = InprocFabric::create(2, InprocOptions{{}, 64 * 1024, 1 << 20, nullptr});
  auto t0 = fabric->endpoint(0);
  auto t1 = fabric->endpoint(1);
  // Longer than the receive buffer.
  std::vector<std::byte> small(10);
  const auto data = bytesOf(20, 0);
  t0->isend(1, kP2P, data);
  Request rr = t1->irecv(0, kP2P, small);
  try {
    rr.wait();
    ADD_FAILURE() << "expected InvalidPayload";
  } catch (const InvalidPayload& e) {
    EXPECT_NE(std::string(e.what()).find("carries 20 bytes, the receive buffer holds 10"), std::string::npos)
        << e.what();
  }
  // Same tag, other op kind.
  t0->isend(1, FrameMeta{OpKind::kBroadcast, 9, 0}, data);
  std::vector<std::byte> buf(20);
  EXPECT_THROW(t1->recv(0, FrameMeta{OpKind::kAllreduce, 9, 0}, buf), InvalidPayload);
  // Above the maximum frame size; a bad peer.
  std::vector<std::byte> huge((1 << 20) + 1);
  EXPECT_THROW(t0->isend(1, kP2P, huge), InvalidArgument);
  EXPECT_THROW(t0->isend(2, kP2P, data), InvalidArgument);
  EXPECT_THROW(t0->irecv(-1, kP2P, buf), InvalidArgument);
}

// A large (not eagerly buffered) frame already waiting when a receive that refuses it is posted: the receive fails and
// the sender, blocked until its frame is consumed, must still complete -- a refused frame is consumed as a wire's would
// be. (Regression: the refusal did not wake the waiting sender, which hung.)
TEST(Inproc, RefusedQueuedFrameReleasesItsWaitingSender) {
  auto fabric = InprocFabric::create(2, InprocOptions{{}, 1024, 1 << 20, nullptr});
  auto t0 = fabric->endpoint(0);
  auto t1 = fabric->endpoint(1);
  const auto data = bytesOf(64 * 1024, 0);
  for (const bool wrong_kind : {false, true}) {
    Request sent = t0->isend(1, kP2P, data);
    std::atomic<bool> done{false};
    std::thread sender([&] {
      try {
        sent.wait();
        done = true;
      } catch (const CommError&) {  // the abort below, when the sender was not released
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the sender is blocked on its unmatched frame
    std::vector<std::byte> buf(wrong_kind ? data.size() : 10);
    const FrameMeta expect = wrong_kind ? FrameMeta{OpKind::kBroadcast, kP2P.tag, 0} : kP2P;
    EXPECT_THROW(t1->recv(0, expect, buf), InvalidPayload);
    for (int i = 0; i < 500 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(done) << "the sender of a refused frame still waits (wrong kind: " << wrong_kind << ")";
    if (!done) fabric->abort("test: release the hung sender");
    sender.join();
    if (!done) break;
  }
}

// A corrupted header injected on link 0 -> 1 fails the receive waiting on it, with the field named.
TEST(Inproc, CorruptedHeaderFailsTheWaitingReceive) {
  auto fabric = InprocFabric::create(2);
  auto t1 = fabric->endpoint(1);
  std::vector<std::byte> buf(64);
  Request rr = t1->irecv(0, kP2P, buf);
  EncodedHeader h = encodeFrameHeader(FrameHeader{kP2P, 8});
  h[1] = std::byte{0xEE};
  const std::vector<std::byte> payload(8);
  std::thread injector([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fabric->injectRawFrame(0, 1, h, payload);
  });
  try {
    rr.wait();
    ADD_FAILURE() << "expected InvalidPayload";
  } catch (const InvalidPayload& e) {
    EXPECT_NE(std::string(e.what()).find("bad magic"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("link 0 -> 1"), std::string::npos) << e.what();
  }
  injector.join();
  // The stream lost its framing: later receives on the link fail too.
  EXPECT_THROW(t1->irecv(0, kP2P, buf), InvalidPayload);
  // An oversized length is caught the same way.
  EncodedHeader h2 = encodeFrameHeader(FrameHeader{kP2P, kDefaultMaxFrameBytes + 1});
  auto fabric2 = InprocFabric::create(2);
  fabric2->injectRawFrame(0, 1, h2, {});
  auto u1 = fabric2->endpoint(1);
  EXPECT_THROW(u1->irecv(0, kP2P, buf), InvalidPayload);
}

// The same corruption in the middle of a collective: the receiving rank reports it, every other rank fails with the
// abort it caused, and no rank hangs.
TEST(Inproc, CorruptedHeaderDuringCollectiveIsAnErrorOnEveryRank) {
  testing::World world(4);
  std::atomic<int> entered{0};
  EncodedHeader bad = encodeFrameHeader(FrameHeader{FrameMeta{OpKind::kAllreduce, kCollectiveTagBit, kNoTensor}, 4});
  bad[5] = std::byte{0x7F};  // version
  const auto start = std::chrono::steady_clock::now();
  const auto res = world.run(
      [&](int, HostCommunicator& c) {
        std::vector<float> data(1 << 18, 1.0f);
        if (++entered == 4) world.fabric->injectRawFrame(2, 3, bad, std::vector<std::byte>(4));
        for (int i = 0; i < 50; ++i) c.allreduce(data.data(), data.size(), DType::kF32);
      },
      std::chrono::seconds(20));
  EXPECT_FALSE(res.watchdog_fired);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(res.errors[static_cast<std::size_t>(r)] != nullptr) << "rank " << r << " did not fail";
    EXPECT_NE(res.message(r).find("frame version 32513"), std::string::npos) << "rank " << r << ": " << res.message(r);
  }
  EXPECT_TRUE(world.fabric->aborted());
}

TEST(Inproc, AbortFailsPendingAndFutureRequests) {
  auto fabric = InprocFabric::create(3);
  auto t0 = fabric->endpoint(0);
  auto t2 = fabric->endpoint(2);
  std::vector<std::byte> buf(16);
  Request pending = t0->irecv(1, kP2P, buf);
  const auto big = bytesOf(1 << 20, 0);
  Request unmatched_send = t2->isend(0, kP2P, big);
  t2->abort("test reason");
  EXPECT_TRUE(t0->aborted());
  const auto failsWithTheReason = [](const std::function<void()>& f) {
    try {
      f();
      ADD_FAILURE() << "expected CommError";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2: test reason"), std::string::npos) << e.what();
    }
  };
  for (Request* r : {&pending, &unmatched_send}) failsWithTheReason([r] { r->wait(); });
  // Links are made on first use: pairs that never exchanged a frame before the abort fail with its reason too.
  failsWithTheReason([&] { t0->isend(1, kP2P, buf); });
  failsWithTheReason([&] { t2->irecv(1, kP2P, buf); });
}

TEST(Inproc, FactoryAndSelfSend) {
  auto ts = makeInprocTransports(3);
  ASSERT_EQ(ts.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ts[static_cast<std::size_t>(r)]->rank(), r);
    EXPECT_EQ(ts[static_cast<std::size_t>(r)]->size(), 3);
    EXPECT_EQ(ts[static_cast<std::size_t>(r)]->name(), "inproc");
  }
  const auto data = bytesOf(100, 1);
  std::vector<std::byte> got(100);
  Request s = ts[1]->isend(1, kP2P, data);
  EXPECT_EQ(ts[1]->recv(1, kP2P, got), 100u);
  s.wait();
  EXPECT_EQ(got, data);
  EXPECT_THROW(InprocFabric::create(0), InvalidArgument);
}

}  // namespace
}  // namespace terse::comm
