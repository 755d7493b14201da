// The read half of the tcp transport's links, on the io thread (transport.h, "Data path"): each frame's header read
// and validated, and its payload routed straight into a posted receive's buffer, staged, or parked in the socket until
// a receive is posted.
#include <algorithm>
#include <cstring>

#include "core/comm/reduce.h"
#include "core/comm/tcp/transport_detail.h"
#include "core/comm/tcp/wire.h"

namespace terse::comm::tcp {

using asio::ip::tcp;
using tcp_wire::kMaxControlBytes;

// Unexpected frames up to this size are staged at once (small control-like messages need no rendezvous); larger ones
// wait for their receive (TcpTransport::route).
constexpr uint64_t kParkBytes = 64 * 1024;
// The piece a reduce receive reads before adding it: small enough to stay in L2 (512 KiB and up on the x86 parts we
// run on) beside the destination's lines, large enough that a read is one syscall for many socket-buffer pages.
constexpr std::size_t kFuseBytes = 256 * 1024;

// A frame boundary: the io thread no longer holds the connection. It waits for it to become readable, and a caller
// waiting for a receive may claim it first and read on its own thread (caller_read.cc).
void TcpTransport::readHeader(Link& l) {
  if (l.closed) return;
  l.header_got = 0;
  l.in_frame = false;
  bool claimers = false;
  {
    std::lock_guard lock(l.mutex);
    l.reader = Link::Reader::kNone;
    claimers = l.claim_waiters > 0;
  }
  // A caller asleep for a receive it would read may claim the connection now (and only such a one is woken: a
  // notify for nothing costs the waiters of large receives a wake-up per frame).
  if (claimers) l.notifyWaiters();
  armRead(l);
}

void TcpTransport::armRead(Link& l) {
  if (l.closed || l.read_closed) return;
  bool held = false;
  {
    std::lock_guard lock(l.mutex);
    l.watch_asked = false;
    if (l.read_armed) return;
    held = l.reader == Link::Reader::kCaller;
  }
  // A caller holds the connection: nobody watches it when the caller lets go, but the caller-read tick.
  if (held) return callerTick();
  if (!watch(l)) return;
  {
    std::lock_guard lock(l.mutex);
    if (l.read_armed) return;
    held = l.reader == Link::Reader::kCaller;
    if (!held) {
      l.read_armed = true;
      l.claims_armed = l.claims;
    }
  }
  if (held) return callerTick();
  // A readiness wait reads nothing: a caller that claims the connection meanwhile reads it alone.
  l.socket->async_wait(tcp::socket::wait_read, [this, &l](const boost::system::error_code& ec) { onReadable(l, ec); });
}

void TcpTransport::onReadable(Link& l, const boost::system::error_code& ec) {
  bool held = false;
  {
    std::lock_guard lock(l.mutex);
    l.read_armed = false;
    if (l.reader == Link::Reader::kCaller) {
      // A caller reads the connection (and will again at its next wait): the io thread stops watching it, and looks
      // at it again on the caller-read tick, for the frames no caller waits for (control frames, an end of file).
      held = true;
    } else {
      // A wait armed before a caller took the connection and gave it back with a whole header or inside a frame: the
      // io thread goes on from there (posted), and the next header is not due yet.
      if (l.in_frame || l.header_got == kFrameHeaderBytes) return;
      if (!ec) l.reader = Link::Reader::kIo;
    }
  }
  if (held) return unwatch(l);
  if (ec) return readFailed(l, ec);
  for (;;) {
    // The socket's own descriptor: `fd` is for callers, and unset with emulation.
    const IoResult r =
        recvSome(l.socket->native_handle(), l.in_header.data() + l.header_got, kFrameHeaderBytes - l.header_got);
    if (r.n > 0) {
      l.header_got += static_cast<std::size_t>(r.n);
      if (l.header_got == kFrameHeaderBytes) return onHeader(l, {});
      continue;
    }
    if (r.n == 0) return readFailed(l, asio::error::eof);
    if (r.would_block) break;
    return readFailed(l, r.error);
  }
  if (l.header_got == 0) {
    // Nothing after all. When a caller claimed the connection since the wait was armed, it read the bytes and let go:
    // callers read this connection, so the boundary is open to them again, and the io thread looks at it on the
    // caller-read tick instead of waking for every frame. Otherwise the wake-up was spurious (a readiness left over
    // from bytes read since): wait again.
    bool callers = false;
    {
      std::lock_guard lock(l.mutex);
      l.reader = Link::Reader::kNone;
      callers = l.claims != l.claims_armed;
    }
    if (callers) return unwatch(l);
  }
  armRead(l);
}

bool TcpTransport::watch(Link& l) {
  if (!l.unwatched) return true;
  boost::system::error_code ec;
  l.socket->assign(l.protocol, l.raw_fd, ec);
  if (ec) {
    // The descriptor stays ours: closeLink closes it.
    linkFailed(l, "connection could not be watched again (" + ec.message() + ")");
    return false;
  }
  l.unwatched = false;
  return true;
}

void TcpTransport::unwatch(Link& l) {
  callerTick();
  bool armed = false;
  {
    std::lock_guard lock(l.mutex);
    armed = l.read_armed;
  }
  // Only with nothing of the io thread's pending on the socket (a wait, a write): releasing it would cancel that. A
  // reading caller uses the descriptor itself, which stays open.
  if (l.unwatched || l.closed || l.io_writing || armed) return;
  boost::system::error_code ec;
  l.socket->release(ec);
  if (!ec) l.unwatched = true;
}

void TcpTransport::onHeader(Link& l, const boost::system::error_code& ec) {
  if (ec) return readFailed(l, ec);
  l.last_heard = Clock::now();
  try {
    decodeHeader(l);
  } catch (const InvalidPayload& e) {
    return protocolError(l, e.what());
  }
  if (l.cur.meta.kind == OpKind::kControl) {
    l.scratch.resize(static_cast<std::size_t>(l.cur.length));
    l.target = l.scratch.data();
    return readPayload(l);
  }
  if (l.peer_left) return protocolError(l, "frame from " + l.who + " after its goodbye");
  route(l, false);
}

void TcpTransport::decodeHeader(Link& l) {
  l.cur = decodeFrameHeader(l.in_header, options_.max_frame_bytes, "frame from " + l.who + " to " + who_);
  TERSE_CHECK(
      l.cur.meta.kind != OpKind::kControl || l.cur.length <= kMaxControlBytes, InvalidPayload,
      "control frame from " << l.who << " of " << l.cur.length << " bytes exceeds the limit of " << kMaxControlBytes);
  counter_.recordReceived(l.cur.meta, l.cur.length);
  l.in_frame = true;
  l.cur_started = Clock::now();
  l.got = 0;
  l.discarding = false;
  l.cur_recv.reset();
  l.cur_staged.reset();
}

// Decides where the payload of the frame whose header was just read goes: straight into a posted receive's buffer
// (zero copy), into a staging buffer, or nowhere yet. A large frame that no receive is posted for, on a link where no
// receive waits at all, is parked: the io thread stops reading that connection until a receive is posted (irecv
// wakes it), so the payload still lands in place instead of being staged and copied again -- the common case at a
// ring step's boundary, when a faster peer's next-step frames arrive before this rank posted their receives. TCP
// flow control holds the rest meanwhile. Parking is safe: nobody can be waiting for a frame behind the parked one,
// since any posted receive on the link makes the frame staged instead. `force_stage` stages whatever is parked (a
// receive of another tag was posted, or the transport is aborting or closing and must read on).
void TcpTransport::route(Link& l, bool force_stage) {
  if (routeFrame(l, force_stage)) readPayload(l);
}

bool TcpTransport::routeFrame(Link& l, bool force_stage) {
  bool notify = false;
  {
    std::lock_guard lock(l.mutex);
    auto it = std::find_if(l.posted.begin(), l.posted.end(),
                           [&](const std::shared_ptr<RecvOp>& r) { return r->expect.tag == l.cur.meta.tag; });
    if (it != l.posted.end()) {
      std::shared_ptr<RecvOp> r = std::move(*it);
      l.posted.erase(it);
      r->length = l.cur.length;
      r->error = mismatch(l, l.cur, *r);
      if (!r->error.empty()) {
        // The receive fails; the frame is drained so the stream keeps its framing.
        r->state = RecvOp::State::kFailed;
        l.discarding = true;
        notify = true;
      } else if (r->reduce) {
        // Fused: each piece read is added into the receive's buffer on this thread (readPayload).
        r->state = RecvOp::State::kDirect;
        r->io_active = true;
        if (l.fuse.empty()) l.fuse.resize(kFuseBytes);
        l.fuse_have = 0;
        l.summed = 0;
        l.target = r->buffer.data();
        l.cur_recv = std::move(r);
      } else {
        // Zero copy: the payload goes from the socket straight into the receive's buffer.
        r->state = RecvOp::State::kDirect;
        r->io_active = true;
        l.target = r->buffer.data();
        l.cur_recv = std::move(r);
      }
    } else if (!force_stage && l.cur.length > kParkBytes && l.posted.empty() && l.broken.empty() && !stopping_.load()) {
      l.parked = true;
      return false;
    } else {
      auto f = std::make_shared<Staged>();
      f->header = l.cur;
      f->data.reset(new std::byte[static_cast<std::size_t>(l.cur.length)]);  // uninitialized: read over at once
      l.target = f->data.get();
      l.unmatched.push_back(f);
      l.cur_staged = std::move(f);
    }
    l.parked = false;
  }
  if (notify) l.notifyWaiters();
  if (l.discarding) l.scratch.resize(std::min<std::size_t>(l.cur.length, std::size_t{1} << 20));
  return true;
}

// io thread: a receive was posted on a parked link (or the transport must read on): route the parked frame again.
void TcpTransport::unpark(Link& l, bool force_stage) {
  {
    std::lock_guard lock(l.mutex);
    if (!l.parked || l.closed) return;
  }
  route(l, force_stage || stopping_.load() || aborted_.load());
}

void TcpTransport::readPayload(Link& l) {
  if (l.got == l.cur.length) return frameDone(l);
  if (!watch(l)) return;
  l.socket->async_read_some(payloadBuffer(l), [this, &l](const boost::system::error_code& ec, std::size_t n) {
    if (ec) return readFailed(l, ec);
    l.last_heard = Clock::now();
    payloadRead(l, n);
    readPayload(l);
  });
}

// Whatever is available, up to the rest of the frame: every read refreshes the link's liveness, and between reads a
// dropped receive or a broken link takes the caller's buffer out of the reader's hands.
asio::mutable_buffer TcpTransport::payloadBuffer(Link& l) {
  const uint64_t left = l.cur.length - l.got;
  if (l.discarding) return asio::buffer(l.scratch.data(), std::min<uint64_t>(left, l.scratch.size()));
  if (l.cur_recv && l.cur_recv->reduce)
    return asio::buffer(l.fuse.data() + l.fuse_have, std::min<uint64_t>(left, l.fuse.size() - l.fuse_have));
  return asio::buffer(l.target + l.got, left);
}

void TcpTransport::payloadRead(Link& l, std::size_t n) {
  const bool fused = l.cur_recv && l.cur_recv->reduce && !l.discarding;
  l.got += n;
  if (!l.cur_recv || l.discarding) return;
  bool release = false;
  {
    std::lock_guard lock(l.mutex);
    if (l.cur_recv->cancelled || !l.broken.empty()) {
      l.cur_recv->io_active = false;
      release = true;
    }
  }
  if (release) {
    l.notifyWaiters();
    l.cur_recv.reset();
    l.discarding = true;
    l.scratch.resize(std::size_t{1} << 20);
  } else if (fused) {
    // Still owned (io_active): add the whole elements read so far; a split element's bytes wait for the rest.
    const RecvOp& r = *l.cur_recv;
    const std::size_t elem = dtypeSize(r.dtype);
    l.fuse_have += n;
    const std::size_t whole = l.fuse_have / elem * elem;
    if (whole != 0) {
      sumInto(l.target + l.summed, l.fuse.data(), whole / elem, r.dtype);
      l.summed += whole;
      l.fuse_have -= whole;
      if (l.fuse_have != 0) std::memmove(l.fuse.data(), l.fuse.data() + whole, l.fuse_have);
    }
  }
}

void TcpTransport::frameDone(Link& l) {
  if (l.cur.meta.kind == OpKind::kControl) {
    handleControl(l);
    if (!l.closed && !l.read_closed) readHeader(l);
    return;
  }
  finishDataFrame(l);
  readHeader(l);
}

void TcpTransport::finishDataFrame(Link& l) {
  Clock::time_point deliver{};
  if (emulated_) {
    // The sender's pacer released the frame's last slice when it left its NIC and the link; the receiver adds its
    // ingress port (shared by all incoming links) and the link's latency.
    Clock::time_point t = Clock::now();
    if (ingress_.limited()) {
      const Clock::time_point start = std::max(l.cur_started, ingress_.busyUntil());
      t = std::max(t, ingress_.occupy(start, frameWireBytes(l.cur.length)));
    }
    deliver = t + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(options_.emulation.linkSpec(l.peer, rank_).latency_s));
  }
  {
    std::lock_guard lock(l.mutex);
    if (l.cur_recv) {
      l.cur_recv->io_active = false;
      l.cur_recv->arrived = true;
      l.cur_recv->deliver_at = deliver;
    }
    if (l.cur_staged) {
      l.cur_staged->complete = true;
      l.cur_staged->deliver_at = deliver;
    }
  }
  l.notifyWaiters();
  l.cur_recv.reset();
  l.cur_staged.reset();
}

}  // namespace terse::comm::tcp
