// Caller reads (transport.h, "Data path"): a caller's thread waiting for a receive reads its connection itself, so a
// small message costs one wake-up per hop (the kernel's, of the waiting thread) instead of two (epoll waking the io
// thread, whose notify wakes the caller). The caller runs the io thread's reader steps (reader.cc) on the same link
// state, one frame at a time; whatever it does not take -- a control frame, a frame over callerFrameBytes(), a
// malformed header, an end of file, an error, or a frame it must leave half read -- goes back to the io thread exactly
// where it stands.
#include <poll.h>
#include <sys/eventfd.h>

#include "core/comm/tcp/transport_detail.h"

namespace terse::comm::tcp {

// How often the io thread looks again at connections that callers read and then left unwatched at a frame boundary,
// for frames nobody waits for (heartbeats, an abort notice, a goodbye, an end of file): the extra time such a frame
// may sit in the socket.
constexpr auto kCallerTickPeriod = std::chrono::milliseconds(2);

namespace {

enum class Stop : uint8_t { kHeader, kFrame, kPayload };

bool settled(const RecvOp& r) {
  return r.state == RecvOp::State::kFailed || (r.state == RecvOp::State::kDirect && r.arrived);
}

// Under the link's lock: the reading caller must give the connection up (it closes, the transport ends, it broke).
bool mustLetGo(const Link& l) {
  return !l.callers_may_read || !l.broken.empty();
}

}  // namespace

void TcpTransport::callerRead(Link& l, const RecvOp& mine, bool block) {
  // The descriptor stays open while this thread holds the connection: closeLink waits for it (liveness.cc).
  const int fd = l.fd;
  const int tick_ms = static_cast<int>(
      std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(liveness_tick_).count()));
  auto must_stop = [&] {
    std::lock_guard lock(l.mutex);
    return mustLetGo(l);
  };
  // Spinning (transport.h, "Data path"): after the socket was found empty, the caller retries for up to caller_spin_
  // before it sleeps, yielding its CPU between tries, so that a thread it waits for (a peer rank's on the same CPU)
  // runs. Sleeping costs a wake-up, and in a virtual machine an idle vCPU's halt and the interrupt that ends it.
  // The budget starts when the socket is first found empty and again after any bytes.
  // A yield that ran another thread for longer than the whole budget (a CPU hog's time slice) ends the spin, and once
  // such stalls add up the thread sleeps at once for a while (spin_wait.h, SpinStalls; the inproc transport's too).
  SpinBudget spin(caller_spin_);
  SpinStalls& stalls = threadSpinStalls();
  bool stalled = false;  // this wait's spin ended with a stall
  bool spun = false;     // the last wait spun (the bytes it heard came during a spin)
  // Waits until the socket may have bytes or a notifier kicked: false when this thread must give the connection up.
  auto await_bytes = [&] {
    if (!stalled && stalls.maySpin(Clock::now()) && spin.running()) {
      if (must_stop()) return false;
      stalled = stalls.timedStep(yieldCpu, caller_spin_);
      spun = true;
      return true;  // the caller's recv tries again
    }
    spun = false;
    l.caller_polling.store(true);
    if (must_stop()) {
      l.caller_polling.store(false);
      return false;
    }
    pollfd p[2] = {{fd, POLLIN, 0}, {l.wake_fd, POLLIN, 0}};
    // Bounded: a kick is never lost (notifyWaiters sees caller_polling after any change made under the lock), but the
    // wait re-checks once per liveness tick all the same.
    caller_sleeps_.fetch_add(1, std::memory_order_relaxed);
    (void)::poll(p, 2, tick_ms);
    l.caller_polling.store(false);
    if ((p[1].revents & POLLIN) != 0) {
      eventfd_t ignored = 0;
      (void)::eventfd_read(l.wake_fd, &ignored);
    }
    return true;
  };
  auto heard = [&] {
    if (spun && !stalled) stalls.progressed();
    spun = false;
    stalled = false;
    spin.restart();
    l.caller_heard.store(Clock::now().time_since_epoch().count());
  };
  auto give_back = [&](Stop where, const boost::system::error_code& ec) {
    {
      // Posted before the connection is the io thread's again: the transport outlives this thread's hold on it
      // (closeLink waits for it), not the moment after.
      std::lock_guard lock(l.mutex);
      l.reader = Link::Reader::kIo;
      if (ec) {
        asio::post(io_, [this, link = &l, ec] { readFailed(*link, ec); });
      } else if (where == Stop::kHeader) {
        asio::post(io_, [this, link = &l] { armRead(*link); });
      } else if (where == Stop::kFrame) {
        asio::post(io_, [this, link = &l] { onHeader(*link, {}); });
      } else {
        asio::post(io_, [this, link = &l] { readPayload(*link); });
      }
    }
    l.notifyWaiters();
  };
  auto release = [&] {
    {
      std::lock_guard lock(l.mutex);
      l.reader = Link::Reader::kNone;
    }
    l.notifyWaiters();
  };

  for (;;) {
    while (l.header_got < kFrameHeaderBytes) {
      const IoResult r = recvSome(fd, l.in_header.data() + l.header_got, kFrameHeaderBytes - l.header_got);
      if (r.n > 0) {
        heard();
        l.header_got += static_cast<std::size_t>(r.n);
        continue;
      }
      if (r.n == 0) return give_back(Stop::kHeader, asio::error::eof);
      if (!r.would_block) return give_back(Stop::kHeader, r.error);
      if (!block || !await_bytes()) return l.header_got == 0 ? release() : give_back(Stop::kHeader, {});
    }
    // A whole header: this thread takes small data frames only, and leaves a malformed header to the io thread, which
    // decodes it again and fails the connection.
    bool take = false;
    try {
      const FrameHeader h = decodeFrameHeader(l.in_header, options_.max_frame_bytes, "frame");
      take = h.meta.kind != OpKind::kControl && h.length <= caller_frame_bytes_;
    } catch (const InvalidPayload&) {
    }
    if (take) {
      std::lock_guard lock(l.mutex);
      take = !l.peer_left;
    }
    if (!take) return give_back(Stop::kFrame, {});
    decodeHeader(l);
    // Never parks: parking needs a link with no receive posted (reader.cc), and this caller's own stays posted until
    // its frame is routed, after which this loop ends.
    (void)routeFrame(l, false);
    while (l.got < l.cur.length) {
      const asio::mutable_buffer b = payloadBuffer(l);
      const IoResult r = recvSome(fd, b.data(), b.size());
      if (r.n > 0) {
        heard();
        payloadRead(l, static_cast<std::size_t>(r.n));
        continue;
      }
      if (r.n == 0) return give_back(Stop::kPayload, asio::error::eof);
      if (!r.would_block) return give_back(Stop::kPayload, r.error);
      // A frame begun is finished, by this thread or (test(), a link to give up) by the io thread.
      if (!block || !await_bytes()) return give_back(Stop::kPayload, {});
    }
    finishDataFrame(l);
    l.header_got = 0;
    l.in_frame = false;
    caller_frames_.fetch_add(1, std::memory_order_relaxed);
    bool done = false;
    {
      std::lock_guard lock(l.mutex);
      done = settled(mine) || mustLetGo(l);
    }
    if (done) return release();
  }
}

void TcpTransport::watchSoon(Link& l) {
  if (l.reader != Link::Reader::kNone || l.read_armed || l.watch_asked) return;
  l.watch_asked = true;
  asio::post(io_, [this, link = &l] { armRead(*link); });
}

void TcpTransport::callerTick() {
  if (caller_tick_running_) return;
  caller_tick_running_ = true;
  caller_tick_.expires_after(kCallerTickPeriod);
  caller_tick_.async_wait([this](const boost::system::error_code& ec) {
    caller_tick_running_ = false;
    if (ec) return;
    watchIdleLinks();
  });
}

void TcpTransport::watchIdleLinks() {
  for (auto& lp : links_)
    if (lp && lp->socket) watchIfIdle(*lp);
}

void TcpTransport::watchIfIdle(Link& l) {
  bool io_reads = false;
  {
    std::lock_guard lock(l.mutex);
    io_reads = l.reader == Link::Reader::kIo;
  }
  // armRead watches a link nobody reads, and keeps the tick going for one a caller holds (unwatched when it lets go).
  if (!io_reads) armRead(l);
}

void TcpTransport::readOn(Link& l) {
  if (!l.socket || l.closed) return;
  unpark(l, true);
  watchIfIdle(l);
}

}  // namespace terse::comm::tcp
