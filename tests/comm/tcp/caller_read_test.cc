// Caller reads in the tcp transport (core/comm/tcp/transport.h, "Data path"; caller_read.cc): which of the option and
// TERSE_TCP_CALLER_READS decides (on unless told otherwise, off with emulation), the variable's bad values, the
// reading caller's spin (TERSE_TCP_CALLER_SPIN_US: its resolution, a wait it spans, failures ending it), and the
// hand-overs between a reading caller and the io thread -- frames of every size and kind in one stream, receives that
// wait and receives that only test, control frames arriving while a caller reads, and a reading caller woken by an
// abort or a departed peer. The transport's other behaviour tests run once more with caller reads off (ctest's
// tcp_caller_reads_off entry, tests/comm/tcp/CMakeLists), so the io thread's own reading stays tested.
#include <thread>

#include "core/comm/tcp/transport_detail.h"
#include "tests/comm/tcp/tcp_test_util.h"

namespace terse::comm {
namespace {

using CallerClock = std::chrono::steady_clock;

const tcp::TcpTransport& tcpOf(const Transport& t) {
  return dynamic_cast<const tcp::TcpTransport&>(t);
}

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t k = 0; k < n; ++k)
    v[k] = static_cast<std::byte>((k * 131 + static_cast<std::size_t>(seed) * 7) & 0xFF);
  return v;
}

// A two-rank world and the store it was set up through (kept, as the transports were made against it).
struct World {
  std::unique_ptr<MemoryStore> store = std::make_unique<MemoryStore>();
  std::vector<std::unique_ptr<Transport>> t;
};

// Three frames of `bytes` from rank 1 - to to rank `to` over a two-rank world whose callers read with `spin_us`, each
// sent `delay` after the receiver began waiting for it; every frame exact. Returns the world for its counters.
World sendToAWaitingReceiver(int spin_us, int to, std::size_t bytes, std::chrono::milliseconds delay) {
  World w;
  w.t = testing::connectTcpWorld(2, *w.store, JobToken::generate(), [spin_us](TcpOptions& x) {
    x.caller_reads = 1;
    x.caller_spin_us = spin_us;
  });
  Transport& receiver = *w.t[static_cast<std::size_t>(to)];
  Transport& sender = *w.t[static_cast<std::size_t>(1 - to)];
  const FrameMeta meta{OpKind::kP2P, 8, kNoTensor};
  const std::vector<std::byte> out = pattern(bytes, 3);
  std::vector<std::byte> in(out.size());
  for (int round = 0; round < 3; ++round) {
    Request rr = receiver.irecv(1 - to, meta, in);
    std::thread late([&] {
      std::this_thread::sleep_for(delay);
      sender.send(to, meta, out);
    });
    rr.wait();
    late.join();
    EXPECT_EQ(in, out) << "round " << round;
  }
  return w;
}

TEST(TcpCallerReads, OptionThenVariableThenOn) {
  TcpOptions o;
  EXPECT_TRUE(resolveCallerReads(o, testing::envOf({})));
  EXPECT_FALSE(resolveCallerReads(o, testing::envOf({{"TERSE_TCP_CALLER_READS", "0"}})));
  EXPECT_TRUE(resolveCallerReads(o, testing::envOf({{"TERSE_TCP_CALLER_READS", "1"}})));
  o.caller_reads = 0;
  EXPECT_FALSE(resolveCallerReads(o, testing::envOf({{"TERSE_TCP_CALLER_READS", "1"}})));
  o.caller_reads = 1;
  EXPECT_TRUE(resolveCallerReads(o, testing::envOf({{"TERSE_TCP_CALLER_READS", "0"}})));
  // Emulated links: the io thread computes each frame's delivery time, so it reads every frame.
  o.emulation.link.bandwidth_bps = 1e9;
  EXPECT_FALSE(resolveCallerReads(o, testing::envOf({})));
}

TEST(TcpCallerReads, BadValuesNameTheVariableOrTheField) {
  testing::expectBadValuesNamed(resolveCallerReads, "TERSE_TCP_CALLER_READS", {"", "2", "yes", "on", " 1", "-1"},
                                [](TcpOptions& o, int v) { o.caller_reads = v; }, "caller_reads", {2});
}

TEST(TcpCallerReads, SpinOptionThenVariableThenDefault) {
  TcpOptions o;
  EXPECT_EQ(resolveCallerSpinUs(o, testing::envOf({})), kDefaultCallerSpinUs);
  EXPECT_EQ(resolveCallerSpinUs(o, testing::envOf({{"TERSE_TCP_CALLER_SPIN_US", "0"}})), 0);
  EXPECT_EQ(resolveCallerSpinUs(o, testing::envOf({{"TERSE_TCP_CALLER_SPIN_US", "1000000"}})), 1000000);
  o.caller_spin_us = 7;
  EXPECT_EQ(resolveCallerSpinUs(o, testing::envOf({{"TERSE_TCP_CALLER_SPIN_US", "0"}})), 7);
  o.caller_spin_us = 0;
  EXPECT_EQ(resolveCallerSpinUs(o, testing::envOf({{"TERSE_TCP_CALLER_SPIN_US", "30"}})), 0);
  o.caller_spin_us = -1;
  o.emulation.link.bandwidth_bps = 1e9;  // no caller reads, so no spinning; the variable is still checked
  EXPECT_EQ(resolveCallerSpinUs(o, testing::envOf({{"TERSE_TCP_CALLER_SPIN_US", "30"}})), 0);
  EXPECT_THROW((void)resolveCallerSpinUs(o, testing::envOf({{"TERSE_TCP_CALLER_SPIN_US", "x"}})), InvalidArgument);
}

TEST(TcpCallerReads, BadSpinValuesNameTheVariableOrTheField) {
  testing::expectBadValuesNamed(resolveCallerSpinUs, "TERSE_TCP_CALLER_SPIN_US",
                                {"", "-1", "1000001", "5us", " 5", "1e3"},
                                [](TcpOptions& o, int v) { o.caller_spin_us = v; }, "caller_spin_us", {-2, 1000001});
}

// A reading caller with a spin budget longer than the peer's pause retries until the frame comes and never sleeps in
// poll(); without one it sleeps. The count of sleeps is what tells the two apart (the bytes are the same).
TEST(TcpCallerReads, ASpinningCallerReadsWithoutSleeping) {
  for (int spin_us : {1000000, 0}) {
    const World w = sendToAWaitingReceiver(spin_us, 0, 4096, std::chrono::milliseconds(20));
    const auto& rank0 = tcpOf(*w.t[0]);
    EXPECT_GT(rank0.framesReadByCallers(), 0u) << "spin " << spin_us;
    if (spin_us > 0) {
      EXPECT_EQ(rank0.callerSleeps(), 0u) << "a caller with a 1 s budget slept waiting 20 ms";
    } else {
      EXPECT_GT(rank0.callerSleeps(), 0u) << "a caller without a budget never slept";
    }
  }
}

// The largest frame a waiting caller reads itself follows the spin: 256 KiB with it, 64 KiB without (link.h, measured
// there). A 200,000-byte frame sent to a receiver already waiting is the caller's with the spin, the io thread's
// without.
TEST(TcpCallerReads, TheFrameSizeCallersReadFollowsTheSpin) {
  for (int spin_us : {50, 0}) {
    const World w = sendToAWaitingReceiver(spin_us, 1, 200000, std::chrono::milliseconds(10));
    const auto& rank1 = tcpOf(*w.t[1]);
    EXPECT_EQ(rank1.callerFrameBytes(), spin_us > 0 ? 256u * 1024 : 64u * 1024);
    if (spin_us > 0) {
      EXPECT_GT(rank1.framesReadByCallers(), 0u) << "a spinning caller left a 200,000-byte frame to the io thread";
    } else {
      EXPECT_EQ(rank1.framesReadByCallers(), 0u) << "a caller without the spin read a 200,000-byte frame";
    }
  }
}

// Ping-pong of small frames: every frame exact, and with caller reads on, the waiting callers read (most of) them --
// the count is what tells this path from the io thread's, which gives the same bytes. Off: none.
TEST(TcpCallerReads, SmallFramesAreReadByTheWaitingCaller) {
  for (int on : {1, 0}) {
    MemoryStore store;
    const JobToken token = JobToken::generate();
    auto t = testing::connectTcpWorld(2, store, token, [on](TcpOptions& x) { x.caller_reads = on; });
    ASSERT_EQ(tcpOf(*t[0]).callerReads(), on == 1);
    constexpr int kRounds = 200;
    const FrameMeta meta{OpKind::kP2P, 5, kNoTensor};
    const testing::SpawnResult res = testing::spawnRanks(
        2,
        [&](int r) {
          Transport& me = *t[static_cast<std::size_t>(r)];
          for (int i = 0; i < kRounds; ++i) {
            const std::vector<std::byte> out = pattern(4096 + static_cast<std::size_t>(i % 3), i * 2 + r);
            std::vector<std::byte> in(out.size());
            Request rr = me.irecv(1 - r, meta, in);
            me.isend(1 - r, meta, out).wait();
            rr.wait();
            if (in != pattern(in.size(), i * 2 + 1 - r)) throw std::runtime_error("round " + std::to_string(i));
          }
        },
        nullptr, std::chrono::seconds(60));
    testing::expectNoErrors(res);
    for (int r = 0; r < 2; ++r) {
      const uint64_t n = tcpOf(*t[static_cast<std::size_t>(r)]).framesReadByCallers();
      if (on == 1) {
        // A frame that arrived before its receive's wait is the io thread's (or staged): not every one is a caller's.
        EXPECT_GT(n, 0u) << "rank " << r;
      } else {
        EXPECT_EQ(n, 0u) << "rank " << r;
      }
    }
  }
}

// One stream of frames from 0 bytes to 1 MiB (below, at and above the sizes a caller reads itself, 64 KiB without
// the spin and 256 KiB with it; ctest's tcp_caller_spin_off entry runs this without), of two
// tags, each received out of order of arrival or in order, by a waiting caller or one that only tests: each tag's
// frames in order and exact. Every hand-over (a large frame's header read by the caller and given to the io thread, a
// staged frame of the other tag, a test() that leaves a frame half read) is on this path.
TEST(TcpCallerReads, MixedSizesAndTagsHandOverExactly) {
  const std::vector<std::size_t> sizes = {0,    1, 4096,          65535, 65536,  65537,  256 << 10,
                                          1000, 7, (1 << 20) + 3, 32768, 262143, 262145, 65536 * 2};
  for (bool polling : {false, true}) {
    MemoryStore store;
    const JobToken token = JobToken::generate();
    auto t = testing::connectTcpWorld(2, store, token, [](TcpOptions& x) { x.caller_reads = 1; });
    const std::size_t n = sizes.size();
    auto metaOf = [](std::size_t i) { return FrameMeta{OpKind::kP2P, static_cast<Tag>(40 + i % 2), kNoTensor}; };
    std::thread sender([&] {
      std::vector<Request> sends;
      std::vector<std::vector<std::byte>> data;
      for (std::size_t i = 0; i < n; ++i) data.push_back(pattern(sizes[i], static_cast<int>(i)));
      for (int rep = 0; rep < 3; ++rep)
        for (std::size_t i = 0; i < n; ++i) sends.push_back(t[0]->isend(1, metaOf(i), data[i]));
      for (auto& s : sends) s.wait();
    });
    int wrong = 0;
    for (int rep = 0; rep < 3; ++rep) {
      // Tag 41's frames of this repetition first, then tag 40's: the earlier ones of tag 40 are staged meanwhile.
      for (std::size_t parity : {std::size_t{1}, std::size_t{0}})
        for (std::size_t i = parity; i < n; i += 2) {
          std::vector<std::byte> in(sizes[i] + 5);
          Request rr = t[1]->irecv(0, metaOf(i), in);
          if (polling) {
            const auto limit = CallerClock::now() + std::chrono::seconds(30);
            while (!rr.test() && CallerClock::now() < limit) std::this_thread::yield();
          }
          rr.wait();
          if (rr.bytes() != sizes[i] || !std::equal(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(sizes[i]),
                                                    pattern(sizes[i], static_cast<int>(i)).begin()))
            ++wrong;
        }
    }
    sender.join();
    EXPECT_EQ(wrong, 0) << (polling ? "test()" : "wait()");
  }
}

// The same sizes sent one at a time to a receiver already waiting for each: the caller holds the connection when every
// frame begins, reads the header of each large one and gives the frame to the io thread, whose readiness wait, armed
// at the previous frame's end, may fire meanwhile and must not read a header from the middle of that frame. (That
// race needs a slow io thread: TcpBulkWriter.HandOvers* and TcpNonBlocking.Overlapping* are the cases that caught it,
// on 2 CPUs; this one did not when the guard was removed.)
TEST(TcpCallerReads, FramesSentToAWaitingCallerHandOverExactly) {
  const std::vector<std::size_t> sizes = {4096, 65537, 100,   1 << 20, 0,       65536,  300000,
                                          1,    70000, 70000, 5,       1 << 18, 262145, 262143};
  MemoryStore store;
  const JobToken token = JobToken::generate();
  auto t = testing::connectTcpWorld(2, store, token, [](TcpOptions& x) { x.caller_reads = 1; });
  const FrameMeta meta{OpKind::kP2P, 8, kNoTensor};
  constexpr int kReps = 8;
  std::thread sender([&] {
    for (int rep = 0; rep < kReps; ++rep)
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        std::this_thread::sleep_for(std::chrono::microseconds(500));  // the receiver waits already
        t[0]->send(1, meta, pattern(sizes[i], static_cast<int>(i) + rep));
      }
  });
  int wrong = 0;
  std::string failure;
  try {
    for (int rep = 0; rep < kReps; ++rep)
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        std::vector<std::byte> in(sizes[i]);
        if (t[1]->recv(0, meta, in) != sizes[i] || in != pattern(sizes[i], static_cast<int>(i) + rep)) ++wrong;
      }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  sender.join();
  EXPECT_EQ(failure, "");
  EXPECT_EQ(wrong, 0);
}

// A caller claims a connection just as the io thread lets go of it after a large frame, and then both ranks wait for
// their large sends before their receives (a ring allreduce does at its allgather steps): neither caller reads while
// its send waits, so the io thread must be watching the connection. An earlier version left it unwatched when the
// claim came between the io thread's handing over and its readiness wait, and the exchange hung until the liveness
// timeout failed it.
TEST(TcpCallerReads, SendsWaitedBeforeReceivesDoNotStall) {
  MemoryStore store;
  const JobToken token = JobToken::generate();
  auto t = testing::connectTcpWorld(2, store, token, [](TcpOptions& x) {
    x.caller_reads = 1;
    x.timeout = std::chrono::seconds(10);
  });
  const FrameMeta small{OpKind::kP2P, 11, kNoTensor};
  const FrameMeta big{OpKind::kP2P, 12, kNoTensor};
  constexpr std::size_t kBig = std::size_t{8} << 20;  // several socket buffers: each send waits for the peer's reads
  const testing::SpawnResult res = testing::spawnRanks(
      2,
      [&](int r) {
        Transport& me = *t[static_cast<std::size_t>(r)];
        const int peer = 1 - r;
        const std::vector<std::byte> out = pattern(kBig, r);
        std::vector<std::byte> in(kBig);
        for (int round = 0; round < 20; ++round) {
          // A large frame, then a small one, whose receive waits first: its caller sleeps while the io thread reads
          // the large frame, and claims the connection as the io thread lets go of it.
          {
            std::vector<std::byte> a(100, std::byte{1}), b(100);
            Request big_in = me.irecv(peer, big, in);
            Request small_in = me.irecv(peer, small, b);
            Request big_out = me.isend(peer, big, out);
            me.send(peer, small, a);
            small_in.wait();
            big_out.wait();
            big_in.wait();
          }
          // Then large sends waited before their receives.
          Request rr = me.irecv(peer, big, in);
          me.isend(peer, big, out).wait();
          rr.wait();
          if (in != pattern(kBig, peer)) throw std::runtime_error("round " + std::to_string(round));
        }
      },
      nullptr, std::chrono::seconds(60));
  testing::expectNoErrors(res);
}

// A caller that holds its connection while the peer stays quiet for several heartbeat periods reads the heartbeats
// (control frames: handed to the io thread) and gets the frame that follows; the link is not taken for silent.
TEST(TcpCallerReads, HeartbeatsWhileACallerReadsKeepTheLinkAlive) {
  MemoryStore store;
  const JobToken token = JobToken::generate();
  const auto timeout = std::chrono::milliseconds(800);  // a heartbeat every 200 ms; 4 periods of margin under load
  auto t = testing::connectTcpWorld(2, store, token, [&](TcpOptions& x) {
    x.caller_reads = 1;
    x.timeout = timeout;
  });
  const FrameMeta meta{OpKind::kP2P, 6, kNoTensor};
  const std::vector<std::byte> out = pattern(3000, 1);
  std::vector<std::byte> in(out.size());
  Request rr = t[1]->irecv(0, meta, in);
  std::thread late([&] {
    std::this_thread::sleep_for(3 * timeout);
    t[0]->send(1, meta, out);
  });
  EXPECT_NO_THROW(rr.wait());
  late.join();
  EXPECT_EQ(in, out);
  EXPECT_GT(tcpOf(*t[1]).traffic().received.kind(OpKind::kControl).frames, 0u) << "no heartbeat arrived";
}

// A caller asleep in poll() on its connection is woken by its rank's abort and by the peer's goodbye: the failure,
// not the next frame or the liveness timeout, ends the wait.
TEST(TcpCallerReads, ReadingWaitFailsAtOnceOnAbortAndOnADepartedPeer) {
  testing::expectWaitEndsOnAbortAndOnADepartedPeer(
      [](TcpOptions& x) {
        x.caller_reads = 1;
        x.caller_spin_us = 0;
      },
      std::chrono::seconds(5));
}

// The same for a caller still spinning: a 1 s budget, ended within half of it (the spin re-checks the link's state at
// every try).
TEST(TcpCallerReads, SpinningWaitFailsAtOnceOnAbortAndOnADepartedPeer) {
  testing::expectWaitEndsOnAbortAndOnADepartedPeer(
      [](TcpOptions& x) {
        x.caller_reads = 1;
        x.caller_spin_us = 1000000;
      },
      std::chrono::milliseconds(500));
}

}  // namespace
}  // namespace terse::comm
