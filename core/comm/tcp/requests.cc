// Posting sends and receives on the tcp transport's links and completing them (transport.h, "Data path" and
// "Requests"): a send queued for its link's writer (or the pacer), a receive matched with a frame staged before it or
// posted for the reader, a frame to this rank itself; and the requests through which the caller's thread waits,
// copies or adds a staged frame into its buffer, holds the emulated delivery time, or cancels what it dropped.
#include <algorithm>
#include <cstring>

#include "core/comm/reduce.h"
#include "core/comm/tcp/transport_detail.h"
#include "core/common/error.h"

namespace terse::comm::tcp {
namespace {

// How a request's wait() waits for its link's next event (transport.h, "Busy polling"): spinning on the link's event
// counter until `budget` has passed since the wait began, then sleeping on the link's condition variable. Each
// return hands the caller its lock back with the conditions to re-check: the counter only says something changed.
class LinkWaiter {
 public:
  LinkWaiter(Link& l, Clock::duration budget) : l_(l), budget_(budget) {}

  void await(std::unique_lock<std::mutex>& lock) {
    if (budget_ > Clock::duration::zero()) {
      Clock::time_point now = Clock::now();
      if (!spinning_) {
        spinning_ = true;
        deadline_ = now + budget_;
      }
      if (now < deadline_) {
        // Read under the lock: every change the caller just found missing is made under it and bumps the counter
        // afterwards, so a change after this point moves it.
        const uint64_t seen = l_.events.load(std::memory_order_acquire);
        lock.unlock();
        while (l_.events.load(std::memory_order_acquire) == seen && now < deadline_) {
          cpuRelax();
          now = Clock::now();
        }
        lock.lock();
        return;
      }
    }
    // The caller checked its conditions under this same lock, and a change is made under it before its notify: it
    // cannot slip between the check and the sleep.
    l_.cv.wait(lock);
  }

 private:
  Link& l_;
  Clock::duration budget_;
  bool spinning_ = false;
  Clock::time_point deadline_{};
};

// A send that completed when it was issued (to this rank itself).
class DoneRequest final : public RequestImpl {
 public:
  explicit DoneRequest(uint64_t bytes) : bytes_(bytes) {}
  bool test() override { return true; }
  void wait() override {}
  uint64_t bytes() const override { return bytes_; }

 private:
  uint64_t bytes_;
};

class SendRequest final : public RequestImpl {
 public:
  // `reader`: the transport, when its callers may read connections (RecvRequest); called only under the link's lock
  // while callers may read it, which the transport's end clears first (the request may outlive the transport).
  SendRequest(std::shared_ptr<Link> link, std::shared_ptr<SendOp> op, Clock::duration spin, TcpTransport* reader)
      : link_(std::move(link)), op_(std::move(op)), spin_(spin), reader_(reader) {}
  // A send dropped before completing still delivers its data (request.h): what is not written yet is copied into the
  // frame's own storage, so the caller may free its buffer at once.
  ~SendRequest() override {
    if (done_) return;
    std::unique_lock lock(link_->mutex);
    link_->cv.wait(lock, [&] { return !op_->io_active; });
    if (!op_->done && op_->owned.empty() && !op_->data.empty()) {
      op_->owned.assign(op_->data.begin(), op_->data.end());
      op_->data = op_->owned;
    }
  }
  bool test() override { return progress(false); }
  void wait() override { progress(true); }
  uint64_t bytes() const override { return op_->wire_bytes - kFrameHeaderBytes; }

 private:
  bool progress(bool block) {
    if (done_) return true;
    Link& l = *link_;
    LinkWaiter waiter(l, spin_);
    std::unique_lock lock(l.mutex);
    for (;;) {
      if (op_->done && op_->scheduled) break;
      // A write in progress reads from the caller's buffer: it must end before the caller hears of the failure.
      if (!l.broken.empty() && !op_->io_active) throwBroken(l);
      if (!block) return false;
      // When callers read this connection and none does now: the send may wait for the peer, which may wait for this
      // rank to read (both ranks' sends in full sockets), so the io thread reads it meanwhile, rather than at its next
      // caller-read tick.
      if (reader_ != nullptr && l.callers_may_read) reader_->watchSoon(l);
      waiter.await(lock);
    }
    const Clock::time_point t = op_->sent_at;
    lock.unlock();
    if (block) {
      sleepUntilPrecise(t);
    } else if (Clock::now() < t) {
      return false;
    }
    done_ = true;
    return true;
  }

  std::shared_ptr<Link> link_;
  std::shared_ptr<SendOp> op_;
  Clock::duration spin_;  // busy-poll budget of a wait (transport.h); zero: sleep at once
  TcpTransport* reader_;  // null: the io thread reads every frame
  bool done_ = false;
};

class RecvRequest final : public RequestImpl {
 public:
  // `reader`: the transport, when its callers may read connections themselves (transport.h, "Data path"); used only
  // while this request holds the link, which the transport waits for before it closes the link. `caller_frame_bytes`:
  // the largest receive this thread reads for itself (TcpTransport::callerFrameBytes()).
  RecvRequest(std::shared_ptr<Link> link, std::shared_ptr<RecvOp> op, Clock::duration spin, TcpTransport* reader,
              uint64_t caller_frame_bytes)
      : link_(std::move(link)),
        op_(std::move(op)),
        spin_(spin),
        reader_(reader),
        caller_frame_bytes_(reader != nullptr ? caller_frame_bytes : 0) {}
  // A receive dropped before completing is cancelled: it leaves the posted list, or the io thread stops writing into
  // its buffer (which its owner may free next) and drains the rest of the frame.
  ~RecvRequest() override {
    std::unique_lock lock(link_->mutex);
    RecvOp& r = *op_;
    if (r.state == RecvOp::State::kPosted) {
      auto it = std::find(link_->posted.begin(), link_->posted.end(), op_);
      if (it != link_->posted.end()) link_->posted.erase(it);
    }
    r.cancelled = true;
    link_->cv.wait(lock, [&] { return !r.io_active; });
  }
  bool test() override { return progress(false); }
  void wait() override { progress(true); }
  uint64_t bytes() const override { return length_; }

 private:
  bool progress(bool block) {
    if (done_) return true;
    RecvOp& r = *op_;
    if (!landed_) {
      Link& l = *link_;
      LinkWaiter waiter(l, spin_);
      std::unique_lock lock(l.mutex);
      bool read_once = false;
      const bool small = r.buffer.size() <= caller_frame_bytes_;
      for (;;) {
        if (r.state == RecvOp::State::kFailed) {
          if (r.error_comm) throw CommError(r.error);
          throw InvalidPayload(r.error);
        }
        if (r.state == RecvOp::State::kStaged && r.staged->complete) break;
        if (r.state == RecvOp::State::kDirect && r.arrived) break;
        if (!l.broken.empty() && !r.io_active) throwBroken(l);
        // Nobody reads the connection and this receive's frame, a small one, has not begun: read it on this thread.
        // test() reads what is there, once; wait() reads until the frame is in, or hands the connection back and
        // sleeps below.
        if (reader_ != nullptr && (block || !read_once) && r.state == RecvOp::State::kPosted && small &&
            l.callers_may_read && l.reader == Link::Reader::kNone) {
          l.reader = Link::Reader::kCaller;
          ++l.claims;
          read_once = true;
          lock.unlock();
          reader_->callerRead(l, r, block);
          lock.lock();
          continue;
        }
        // A large receive (or one test() already read for) on a connection that callers read and nobody reads now:
        // the io thread reads it, now rather than at its next caller-read tick.
        if (reader_ != nullptr && l.callers_may_read) reader_->watchSoon(l);
        if (!block) return false;
        // A receive this thread could read for sleeps: the io thread wakes it when it lets go of the connection.
        const bool could_claim = reader_ != nullptr && r.state == RecvOp::State::kPosted && small;
        if (could_claim) ++l.claim_waiters;
        waiter.await(lock);
        if (could_claim) --l.claim_waiters;
      }
      // The frame is complete and this request alone owns it now: finish outside the lock.
      std::shared_ptr<Staged> staged = std::move(r.staged);
      deliver_at_ = staged ? staged->deliver_at : r.deliver_at;
      length_ = r.length;
      lock.unlock();
      if (staged) {
        if (r.reduce) {
          sumInto(r.buffer.data(), staged->data.get(), staged->header.length / dtypeSize(r.dtype), r.dtype);
        } else if (staged->header.length != 0) {
          std::memcpy(r.buffer.data(), staged->data.get(), staged->header.length);
        }
      }  // else it landed in place, or was added in place as it was read (reader.cc)
      landed_ = true;
    }
    if (block) {
      sleepUntilPrecise(deliver_at_);
    } else if (Clock::now() < deliver_at_) {
      return false;
    }
    done_ = true;
    return true;
  }

  std::shared_ptr<Link> link_;
  std::shared_ptr<RecvOp> op_;
  Clock::duration spin_;         // busy-poll budget of a wait (transport.h); zero: sleep at once
  TcpTransport* reader_;         // null: the io thread reads every frame
  uint64_t caller_frame_bytes_;  // the largest receive this thread reads for itself (with reader_)
  uint64_t length_ = 0;
  Clock::time_point deliver_at_{};
  bool landed_ = false;  // copied or added into the caller's buffer (exactly once)
  bool done_ = false;
};

}  // namespace

Request TcpTransport::isend(int peer, const FrameMeta& meta, std::span<const std::byte> data) {
  checkPeer(peer, "isend: peer");
  TERSE_CHECK(data.size() <= options_.max_frame_bytes, InvalidArgument,
              "isend to rank " << peer << ": frame of " << data.size() << " bytes exceeds the maximum of "
                               << options_.max_frame_bytes);
  TERSE_CHECK(data.data() != nullptr || data.empty(), InvalidArgument, "isend: null data");
  TERSE_CHECK(meta.kind != OpKind::kControl, InvalidArgument,
              "isend: kControl frames are the tcp transport's own (heartbeats, abort notices)");
  const std::shared_ptr<Link>& lp = links_[static_cast<std::size_t>(peer)];
  Link& l = *lp;
  if (peer == rank_) return sendToSelf(l, meta, data);
  auto op = std::make_shared<SendOp>();
  op->header = encodeFrameHeader(FrameHeader{meta, data.size()});
  op->data = data;
  op->wire_bytes = frameWireBytes(data.size());
  bool post_pump = false;
  bool direct = false;
  {
    std::lock_guard lock(l.mutex);
    if (!l.broken.empty()) throwBroken(l);
    TERSE_CHECK(!l.peer_left, CommError, who_ << ": isend to " << l.who << ", which has closed its transport");
    counter_.recordSent(meta, data.size());
    if (emulated_) {
      // Under the link lock, so the pacer releases this link's frames in the order they were sent.
      op->scheduled = false;
      op->queued_at = Clock::now();
      pacer_.enqueue(l, op);
    } else if (l.fd >= 0 && !l.writing && l.writes.empty() && l.controls.empty() && !l.mid_frame && !stopping_.load()) {
      // An idle link: this thread writes the frame itself, saving the hand-off to the io thread and its wake-up (most
      // of a small message's latency).
      l.writing = true;
      l.direct = true;
      op->io_active = true;
      direct = true;
    } else {
      l.writes.push_back(WriteItem{op, 0, op->wire_bytes});
      // One wake-up of the io thread for a burst of frames (a ring step posts all of its segments at once).
      post_pump = !l.pump_posted;
      l.pump_posted = true;
    }
  }
  if (emulated_) {
    pacer_.wake();
  } else if (direct) {
    writeDirect(l, op);
  } else if (post_pump) {
    postPump(l);
  }
  return Request(std::make_shared<SendRequest>(lp, std::move(op), busy_poll_, caller_reads_ ? this : nullptr));
}

void TcpTransport::checkPeer(int r, const char* what) const {
  TERSE_CHECK(r >= 0 && r < n_, InvalidArgument, what << " must be in [0, " << n_ << "), got " << r);
}

Request TcpTransport::post(int peer, const FrameMeta& expect, std::span<std::byte> buffer, bool reduce, DType dtype) {
  checkPeer(peer, "irecv: peer");
  TERSE_CHECK(buffer.data() != nullptr || buffer.empty(), InvalidArgument, "irecv: null buffer");
  TERSE_CHECK(!reduce || isSummable(dtype), Unsupported, "irecvReduce: cannot sum " << dtypeName(dtype));
  TERSE_CHECK(expect.kind != OpKind::kControl, InvalidArgument,
              "irecv: kControl frames are the tcp transport's own (heartbeats, abort notices)");
  const std::shared_ptr<Link>& lp = links_[static_cast<std::size_t>(peer)];
  Link& l = *lp;
  auto r = std::make_shared<RecvOp>();
  r->expect = expect;
  r->buffer = buffer;
  r->reduce = reduce;
  r->dtype = dtype;
  bool wake = false;
  {
    std::lock_guard lock(l.mutex);
    if (!l.broken.empty()) throwBroken(l);
    auto it = std::find_if(l.unmatched.begin(), l.unmatched.end(),
                           [&](const std::shared_ptr<Staged>& f) { return f->header.meta.tag == expect.tag; });
    if (it != l.unmatched.end()) {
      std::shared_ptr<Staged> f = std::move(*it);
      l.unmatched.erase(it);
      r->length = f->header.length;
      r->error = mismatch(l, f->header, *r);
      if (r->error.empty()) {
        r->state = RecvOp::State::kStaged;
        r->staged = std::move(f);
      } else {
        r->state = RecvOp::State::kFailed;  // the frame is consumed, as a wire's would be
      }
    } else {
      TERSE_CHECK(!l.peer_left, CommError,
                  who_ << ": irecv from " << l.who << " (tag 0x" << std::hex << expect.tag << std::dec
                       << "): that rank has closed its transport and sent no such frame before");
      l.posted.push_back(r);
      wake = l.parked;
    }
  }
  if (wake) asio::post(io_, [this, link = &l] { unpark(*link, false); });
  return Request(
      std::make_shared<RecvRequest>(lp, std::move(r), busy_poll_, caller_reads_ ? this : nullptr, caller_frame_bytes_));
}

// A frame to this rank itself crosses no socket: it is matched at once and copied (or staged), and counted as
// inproc counts it.
Request TcpTransport::sendToSelf(Link& l, const FrameMeta& meta, std::span<const std::byte> data) {
  std::shared_ptr<RecvOp> target;
  FrameHeader h{meta, data.size()};
  {
    std::lock_guard lock(l.mutex);
    if (!l.broken.empty()) throwBroken(l);
    counter_.recordSent(meta, data.size());
    counter_.recordReceived(meta, data.size());
    auto it = std::find_if(l.posted.begin(), l.posted.end(),
                           [&](const std::shared_ptr<RecvOp>& r) { return r->expect.tag == meta.tag; });
    if (it == l.posted.end()) {
      auto f = std::make_shared<Staged>();
      f->header = h;
      f->data.reset(new std::byte[data.size()]);
      if (!data.empty()) std::memcpy(f->data.get(), data.data(), data.size());
      f->complete = true;
      l.unmatched.push_back(std::move(f));
    } else {
      target = std::move(*it);
      l.posted.erase(it);
      target->length = h.length;
      target->error = mismatch(l, h, *target);
      if (target->error.empty()) {
        auto f = std::make_shared<Staged>();
        f->header = h;
        f->data.reset(new std::byte[data.size()]);
        if (!data.empty()) std::memcpy(f->data.get(), data.data(), data.size());
        f->complete = true;
        target->state = RecvOp::State::kStaged;
        target->staged = std::move(f);
      } else {
        target->state = RecvOp::State::kFailed;
      }
    }
  }
  l.notifyWaiters();
  return Request(std::make_shared<DoneRequest>(data.size()));  // complete: the data has been copied
}

}  // namespace terse::comm::tcp
