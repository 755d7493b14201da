// The read half of the tcp transport's links, on the io thread (transport.h, "Data path"): each frame's header read
// and validated, and its payload routed straight into a posted receive's buffer, staged, or parked in the socket until
// a receive is posted.
#include <algorithm>
#include <cstring>

#include "core/comm/reduce.h"
#include "core/comm/tcp/transport_detail.h"
#include "core/comm/tcp/wire.h"

namespace terse::comm::tcp {

using tcp_wire::kMaxControlBytes;

// Unexpected frames up to this size are staged at once (small control-like messages need no rendezvous); larger ones
// wait for their receive (TcpTransport::route).
constexpr uint64_t kParkBytes = 64 * 1024;
// The piece a reduce receive reads before adding it: small enough to stay in L2 (512 KiB and up on the x86 parts we
// run on) beside the destination's lines, large enough that a read is one syscall for many socket-buffer pages.
constexpr std::size_t kFuseBytes = 256 * 1024;

void TcpTransport::readHeader(Link& l) {
  if (l.closed) return;
  asio::async_read(*l.socket, asio::buffer(l.in_header),
                   [this, &l](const boost::system::error_code& ec, std::size_t) { onHeader(l, ec); });
}

void TcpTransport::onHeader(Link& l, const boost::system::error_code& ec) {
  if (ec) return readFailed(l, ec);
  const Clock::time_point now = Clock::now();
  l.last_heard = now;
  try {
    l.cur = decodeFrameHeader(l.in_header, options_.max_frame_bytes, "frame from " + l.who + " to " + who_);
    TERSE_CHECK(
        l.cur.meta.kind != OpKind::kControl || l.cur.length <= kMaxControlBytes, InvalidPayload,
        "control frame from " << l.who << " of " << l.cur.length << " bytes exceeds the limit of " << kMaxControlBytes);
  } catch (const InvalidPayload& e) {
    return protocolError(l, e.what());
  }
  counter_.recordReceived(l.cur.meta, l.cur.length);
  l.cur_started = now;
  l.got = 0;
  l.discarding = false;
  l.cur_recv.reset();
  l.cur_staged.reset();
  if (l.cur.meta.kind == OpKind::kControl) {
    l.scratch.resize(static_cast<std::size_t>(l.cur.length));
    l.target = l.scratch.data();
    return readPayload(l);
  }
  if (l.peer_left) return protocolError(l, "frame from " + l.who + " after its goodbye");
  route(l, false);
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
      return;
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
  readPayload(l);
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
  const uint64_t left = l.cur.length - l.got;
  if (left == 0) return frameDone(l);
  // Whatever is available, up to the rest of the frame: every read refreshes the link's liveness, and between reads
  // a dropped receive or a broken link takes the caller's buffer out of the io thread's hands.
  const bool fused = l.cur_recv && l.cur_recv->reduce && !l.discarding;
  asio::mutable_buffer buf =
      l.discarding ? asio::buffer(l.scratch.data(), std::min<uint64_t>(left, l.scratch.size()))
      : fused      ? asio::buffer(l.fuse.data() + l.fuse_have, std::min<uint64_t>(left, l.fuse.size() - l.fuse_have))
                   : asio::buffer(l.target + l.got, left);
  l.socket->async_read_some(buf, [this, &l, fused](const boost::system::error_code& ec, std::size_t n) {
    if (ec) return readFailed(l, ec);
    l.last_heard = Clock::now();
    l.got += n;
    if (l.cur_recv && !l.discarding) {
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
    readPayload(l);
  });
}

void TcpTransport::frameDone(Link& l) {
  if (l.cur.meta.kind == OpKind::kControl) {
    handleControl(l);
    if (!l.closed && !l.read_closed) readHeader(l);
    return;
  }
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
  readHeader(l);
}

}  // namespace terse::comm::tcp
