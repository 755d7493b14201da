#include "core/comm/tcp/transport.h"

#include <sys/prctl.h>

// Before Asio, in its own block: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "core/comm/reduce.h"
#include "core/comm/tcp/wire.h"
#include "core/common/log.h"

namespace terse::comm {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using tcp_wire::kAbortTag;
using tcp_wire::kByeTag;
using tcp_wire::kHeartbeatTag;
using tcp_wire::kMaxControlBytes;

// Unexpected frames up to this size are staged at once (small control-like messages need no rendezvous); larger ones
// wait for their receive (TcpTransport::route).
constexpr uint64_t kParkBytes = 64 * 1024;

std::string secondsText(Clock::duration d) {
  std::ostringstream o;
  o.precision(3);
  o << std::chrono::duration<double>(d).count() << " s";
  return o.str();
}

// A frame read before any receive was posted for it: the only frames the transport copies.
struct Staged {
  FrameHeader header;
  std::unique_ptr<std::byte[]> data;  // header.length bytes
  // Guarded by the link's mutex.
  bool complete = false;
  Clock::time_point deliver_at{};
};

struct RecvOp {
  FrameMeta expect;
  std::span<std::byte> buffer;
  bool reduce = false;
  DType dtype = DType::kF32;
  enum class State : uint8_t { kPosted, kStaged, kDirect, kFailed };
  // Guarded by the link's mutex.
  State state = State::kPosted;
  std::shared_ptr<Staged> staged;  // kStaged: the frame, possibly still arriving
  std::vector<std::byte> bounce;   // kDirect + reduce: where the payload lands before it is added
  bool io_active = false;          // kDirect: the io thread is writing into `buffer`, which must stay alive
  bool arrived = false;            // kDirect: the whole payload is in
  bool cancelled = false;          // the request was dropped: the io thread drains the rest of the frame
  bool error_comm = false;         // kFailed: CommError (the peer left) rather than InvalidPayload
  uint64_t length = 0;
  Clock::time_point deliver_at{};
  std::string error;
};

struct SendOp {
  EncodedHeader header{};
  std::span<const std::byte> data;
  std::vector<std::byte> owned;  // control payloads, and the data of a send dropped before it was written
  uint64_t wire_bytes = 0;
  Tag control_tag = 0;  // kControl frames: which one
  // Guarded by the link's mutex.
  bool io_active = false;  // the io thread is reading from `data`
  bool done = false;       // every byte written to the socket
  bool scheduled = true;   // emulation: sent_at is known
  Clock::time_point queued_at{};
  Clock::time_point sent_at{};
};

// A byte range of one frame's wire bytes (header then payload): a whole frame, or an emulated slice of one.
struct WriteItem {
  std::shared_ptr<SendOp> op;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Link {
  int peer = 0;
  std::string who;                      // "rank 2 (host a)"
  std::unique_ptr<tcp::socket> socket;  // null for the link to this rank itself

  std::mutex mutex;
  std::condition_variable cv;
  // Guarded by mutex.
  std::deque<std::shared_ptr<RecvOp>> posted;
  std::deque<std::shared_ptr<Staged>> unmatched;
  std::string broken;                            // nonempty: every request on the link fails with this reason
  bool broken_by_payload = false;                // InvalidPayload (a malformed frame) rather than CommError
  bool peer_left = false;                        // the peer's goodbye arrived: no frame follows it
  std::deque<WriteItem> writes;                  // data frames (or released slices) in stream order
  std::deque<std::shared_ptr<SendOp>> controls;  // written between data frames, never inside one
  bool mid_frame = false;                        // the last write ended inside a frame (emulated slices)
  bool pump_posted = false;                      // a pump of this link is queued on the io thread
  bool parked = false;  // the io thread holds a frame's header and waits for a receive before reading its payload
  std::vector<std::vector<std::byte>> bounce_pool;

  // io thread only.
  bool writing = false;
  bool write_shut = false;  // our goodbye went out and the sending side is shut down
  bool bye_queued = false;
  bool notice_sent = false;  // our abort notice went out
  bool reading = false;
  bool read_closed = false;  // the peer's end of file, or the connection failed
  bool closed = false;
  Clock::time_point last_heard{};
  Clock::time_point last_sent{};
  EncodedHeader in_header{};
  FrameHeader cur;
  Clock::time_point cur_started{};
  std::byte* target = nullptr;
  uint64_t got = 0;
  std::shared_ptr<RecvOp> cur_recv;
  std::shared_ptr<Staged> cur_staged;
  bool discarding = false;
  std::vector<std::byte> scratch;  // control payloads and drained frames

  // Emulation, guarded by the pacer's mutex.
  LinkSpec spec;
  PacedResource wire;
  std::deque<std::shared_ptr<SendOp>> nic_queue;
  uint64_t head_reserved = 0;
  Clock::time_point head_end{};
  std::deque<std::pair<Clock::time_point, WriteItem>> release;  // slices reserved, handed to the writer at their end
};

[[noreturn]] void throwBroken(const Link& l) {
  if (l.broken_by_payload) throw InvalidPayload(l.broken);
  throw CommError(l.broken);
}

// Checks a frame against the receive it is matched with; "" when it fits. Called under the link's mutex.
std::string mismatch(const Link& l, const FrameHeader& h, const RecvOp& r) {
  std::ostringstream m;
  if (h.meta.kind != r.expect.kind) {
    m << detail::where(__FILE__, __LINE__) << "frame from " << l.who << " (tag 0x" << std::hex << h.meta.tag << std::dec
      << ") belongs to a " << opKindName(h.meta.kind) << " operation, the receive expected "
      << opKindName(r.expect.kind) << " (two operations share a tag)";
  } else if (r.reduce && h.length % dtypeSize(r.dtype) != 0) {
    m << detail::where(__FILE__, __LINE__) << "frame from " << l.who << " (" << opKindName(h.meta.kind) << ") carries "
      << h.length << " bytes, not a whole number of " << dtypeName(r.dtype) << " elements to add";
  } else if (h.length > r.buffer.size()) {
    m << detail::where(__FILE__, __LINE__) << "frame from " << l.who << " (" << opKindName(h.meta.kind) << ", tag 0x"
      << std::hex << h.meta.tag << std::dec << ") carries " << h.length << " bytes, the receive buffer holds "
      << r.buffer.size();
  }
  return m.str();
}

class TcpTransport;

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

class TcpSendRequest final : public RequestImpl {
 public:
  TcpSendRequest(std::shared_ptr<Link> link, std::shared_ptr<SendOp> op) : link_(std::move(link)), op_(std::move(op)) {}
  // A send dropped before completing still delivers its data (request.h): what is not written yet is copied into the
  // frame's own storage, so the caller may free its buffer at once.
  ~TcpSendRequest() override {
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
    std::unique_lock lock(l.mutex);
    for (;;) {
      if (op_->done && op_->scheduled) break;
      // A write in progress reads from the caller's buffer: it must end before the caller hears of the failure.
      if (!l.broken.empty() && !op_->io_active) throwBroken(l);
      if (!block) return false;
      l.cv.wait(lock);
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
  bool done_ = false;
};

class TcpRecvRequest final : public RequestImpl {
 public:
  TcpRecvRequest(std::shared_ptr<Link> link, std::shared_ptr<RecvOp> op) : link_(std::move(link)), op_(std::move(op)) {}
  // A receive dropped before completing is cancelled: it leaves the posted list, or the io thread stops writing into
  // its buffer (which its owner may free next) and drains the rest of the frame.
  ~TcpRecvRequest() override {
    std::unique_lock lock(link_->mutex);
    RecvOp& r = *op_;
    if (r.state == RecvOp::State::kPosted) {
      auto it = std::find(link_->posted.begin(), link_->posted.end(), op_);
      if (it != link_->posted.end()) link_->posted.erase(it);
    }
    r.cancelled = true;
    link_->cv.wait(lock, [&] { return !r.io_active; });
    if (r.bounce.capacity() != 0) link_->bounce_pool.push_back(std::move(r.bounce));
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
      std::unique_lock lock(l.mutex);
      for (;;) {
        if (r.state == RecvOp::State::kFailed) {
          if (r.error_comm) throw CommError(r.error);
          throw InvalidPayload(r.error);
        }
        if (r.state == RecvOp::State::kStaged && r.staged->complete) break;
        if (r.state == RecvOp::State::kDirect && r.arrived) break;
        if (!l.broken.empty() && !r.io_active) throwBroken(l);
        if (!block) return false;
        l.cv.wait(lock);
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
      } else if (r.reduce) {
        sumInto(r.buffer.data(), r.bounce.data(), r.length / dtypeSize(r.dtype), r.dtype);
        lock.lock();
        l.bounce_pool.push_back(std::move(r.bounce));
        r.bounce = {};
      }
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
  uint64_t length_ = 0;
  Clock::time_point deliver_at_{};
  bool landed_ = false;  // copied or added into the caller's buffer (exactly once)
  bool done_ = false;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(const TcpOptions& options, const JobToken& token)
      : options_(options),
        token_(token),
        n_(options.world_size),
        rank_(options.rank),
        label_(options.host_label.empty() ? asio::ip::host_name() : options.host_label),
        who_("rank " + std::to_string(options.rank) + " (host " + label_ + ")"),
        emulated_(options.emulation.enabled()),
        counter_(options.rank),
        acceptor_(io_),
        heartbeat_(io_),
        abort_grace_(io_),
        heartbeat_period_(std::max<Clock::duration>(options.timeout / 4, std::chrono::milliseconds(1))),
        handshake_timeout_(std::min<Clock::duration>(options.timeout, std::chrono::seconds(10))),
        ingress_(options.emulation.nic_ingress_bps),
        egress_(options.emulation.nic_egress_bps) {
    links_.resize(static_cast<std::size_t>(n_));
    auto self = std::make_shared<Link>();
    self->peer = rank_;
    self->who = who_;
    links_[static_cast<std::size_t>(rank_)] = std::move(self);
    last_error_.resize(static_cast<std::size_t>(n_));
  }

  ~TcpTransport() override { shutdown(); }

  // ---- Transport ------------------------------------------------------------------------------------------------
  std::string_view name() const noexcept override { return "tcp"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return n_; }
  uint64_t maxFrameBytes() const noexcept override { return options_.max_frame_bytes; }

  Request isend(int peer, const FrameMeta& meta, std::span<const std::byte> data) override {
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
    {
      std::lock_guard lock(l.mutex);
      if (!l.broken.empty()) throwBroken(l);
      TERSE_CHECK(!l.peer_left, CommError, who_ << ": isend to " << l.who << ", which has closed its transport");
      counter_.recordSent(meta, data.size());
      if (emulated_) {
        // Under the link lock, so the pacer releases this link's frames in the order they were sent.
        op->scheduled = false;
        op->queued_at = Clock::now();
        std::lock_guard pacer_lock(pacer_mutex_);
        l.nic_queue.push_back(op);
      } else {
        l.writes.push_back(WriteItem{op, 0, op->wire_bytes});
        // One wake-up of the io thread for a burst of frames (a ring step posts all of its segments at once).
        post_pump = !l.pump_posted;
        l.pump_posted = true;
      }
    }
    if (emulated_) {
      pacer_cv_.notify_all();
    } else if (post_pump) {
      asio::post(io_, [this, link = &l] {
        {
          std::lock_guard lock(link->mutex);
          link->pump_posted = false;
        }
        pump(*link);
      });
    }
    return Request(std::make_shared<TcpSendRequest>(lp, std::move(op)));
  }

  Request irecv(int peer, const FrameMeta& expect, std::span<std::byte> buffer) override {
    return post(peer, expect, buffer, false, DType::kF32);
  }
  Request irecvReduce(int peer, const FrameMeta& expect, std::span<std::byte> accumulate, DType dtype) override {
    return post(peer, expect, accumulate, true, dtype);
  }

  RankTraffic traffic() const override { return counter_.snapshot(); }
  void resetTraffic() override { counter_.reset(); }

  void abort(const std::string& reason) override { abortJob(who_ + ": " + reason); }
  bool aborted() const noexcept override { return aborted_.load(); }

  // ---- setup ------------------------------------------------------------------------------------------------------
  void connect(Store& store);

 private:
  void checkPeer(int r, const char* what) const {
    TERSE_CHECK(r >= 0 && r < n_, InvalidArgument, what << " must be in [0, " << n_ << "), got " << r);
  }
  std::string key(const char* what, int r) const {
    return options_.store_prefix + "tcp/" + what + "/" + std::to_string(r);
  }

  Request post(int peer, const FrameMeta& expect, std::span<std::byte> buffer, bool reduce, DType dtype) {
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
    return Request(std::make_shared<TcpRecvRequest>(lp, std::move(r)));
  }

  // A frame to this rank itself crosses no socket: it is matched at once and copied (or staged), and counted as
  // inproc counts it.
  Request sendToSelf(Link& l, const FrameMeta& meta, std::span<const std::byte> data) {
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
    l.cv.notify_all();
    return Request(std::make_shared<DoneRequest>(data.size()));  // complete: the data has been copied
  }

  // ---- io thread: writing ----------------------------------------------------------------------------------------
  void queueControl(Link& l, Tag tag, std::string_view payload) {
    auto op = std::make_shared<SendOp>();
    const std::string_view body = payload.substr(0, kMaxControlBytes);
    const FrameMeta meta{OpKind::kControl, tag, kNoTensor};
    op->header = encodeFrameHeader(FrameHeader{meta, body.size()});
    op->owned.resize(body.size());
    if (!body.empty()) std::memcpy(op->owned.data(), body.data(), body.size());
    op->data = op->owned;
    op->wire_bytes = frameWireBytes(body.size());
    op->control_tag = tag;
    counter_.recordSent(meta, body.size());
    {
      std::lock_guard lock(l.mutex);
      // Heartbeats and abort notices may go ahead of queued data; a goodbye must follow every data frame.
      if (tag == kByeTag) {
        l.writes.push_back(WriteItem{op, 0, op->wire_bytes});
      } else {
        l.controls.push_back(std::move(op));
      }
    }
    pump(l);
  }

  void pump(Link& l) {
    if (l.writing || l.closed || l.write_shut || !l.socket) return;
    WriteItem item;
    {
      std::lock_guard lock(l.mutex);
      if (!l.mid_frame && !l.controls.empty()) {
        auto op = std::move(l.controls.front());
        l.controls.pop_front();
        item = WriteItem{op, 0, op->wire_bytes};
      } else if (!l.writes.empty()) {
        item = std::move(l.writes.front());
        l.writes.pop_front();
      } else {
        return;
      }
      item.op->io_active = true;
    }
    // Scatter-gather: the header (or its remaining part) and the caller's payload go out in one write, no copy.
    const SendOp& op = *item.op;
    std::array<asio::const_buffer, 2> bufs{};
    if (item.begin < kFrameHeaderBytes)
      bufs[0] =
          asio::buffer(op.header.data() + item.begin, std::min<uint64_t>(item.end, kFrameHeaderBytes) - item.begin);
    if (item.end > kFrameHeaderBytes) {
      const uint64_t b = std::max<uint64_t>(item.begin, kFrameHeaderBytes) - kFrameHeaderBytes;
      bufs[1] = asio::buffer(op.data.data() + b, item.end - kFrameHeaderBytes - b);
    }
    l.writing = true;
    asio::async_write(*l.socket, bufs,
                      [this, &l, item](const boost::system::error_code& ec, std::size_t) { onWritten(l, item, ec); });
  }

  void onWritten(Link& l, const WriteItem& item, const boost::system::error_code& ec) {
    l.writing = false;
    {
      std::lock_guard lock(l.mutex);
      item.op->io_active = false;
      if (!ec) {
        l.mid_frame = item.end != item.op->wire_bytes;
        if (!l.mid_frame) item.op->done = true;
      }
    }
    l.cv.notify_all();
    if (ec) {
      // A reset or broken pipe on write is how a killed peer shows up when our write races its death.
      if (!l.closed)
        linkFailed(l,
                   "connection failed while writing (" + ec.message() + "): the process died or the network is down");
      return;
    }
    l.last_sent = Clock::now();
    if (item.op->control_tag == kAbortTag) {
      l.notice_sent = true;
      // A transport being destroyed closes the connection as soon as the peer has been told why.
      if (stopping_.load()) closeLink(l);
      return;
    }
    if (item.op->control_tag == kByeTag) {
      // Our goodbye is the last thing on this connection; the peer answers with its own and its end of file.
      boost::system::error_code ignored;
      l.socket->shutdown(tcp::socket::shutdown_send, ignored);
      l.write_shut = true;
      return;
    }
    pump(l);
  }

  // ---- io thread: reading ----------------------------------------------------------------------------------------
  void readHeader(Link& l) {
    if (l.closed) return;
    asio::async_read(*l.socket, asio::buffer(l.in_header),
                     [this, &l](const boost::system::error_code& ec, std::size_t) { onHeader(l, ec); });
  }

  void onHeader(Link& l, const boost::system::error_code& ec) {
    if (ec) return readFailed(l, ec);
    const Clock::time_point now = Clock::now();
    l.last_heard = now;
    try {
      l.cur = decodeFrameHeader(l.in_header, options_.max_frame_bytes, "frame from " + l.who + " to " + who_);
      TERSE_CHECK(l.cur.meta.kind != OpKind::kControl || l.cur.length <= kMaxControlBytes, InvalidPayload,
                  "control frame from " << l.who << " of " << l.cur.length << " bytes exceeds the limit of "
                                        << kMaxControlBytes);
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
  void route(Link& l, bool force_stage) {
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
          if (!l.bounce_pool.empty()) {
            r->bounce = std::move(l.bounce_pool.back());
            l.bounce_pool.pop_back();
          }
          r->bounce.resize(static_cast<std::size_t>(l.cur.length));
          r->state = RecvOp::State::kDirect;
          r->io_active = true;  // the bounce buffer is returned to the pool by the request
          l.target = r->bounce.data();
          l.cur_recv = std::move(r);
        } else {
          // Zero copy: the payload goes from the socket straight into the receive's buffer.
          r->state = RecvOp::State::kDirect;
          r->io_active = true;
          l.target = r->buffer.data();
          l.cur_recv = std::move(r);
        }
      } else if (!force_stage && l.cur.length > kParkBytes && l.posted.empty() && l.broken.empty() &&
                 !stopping_.load()) {
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
    if (notify) l.cv.notify_all();
    if (l.discarding) l.scratch.resize(std::min<std::size_t>(l.cur.length, std::size_t{1} << 20));
    readPayload(l);
  }

  // io thread: a receive was posted on a parked link (or the transport must read on): route the parked frame again.
  void unpark(Link& l, bool force_stage) {
    {
      std::lock_guard lock(l.mutex);
      if (!l.parked || l.closed) return;
    }
    route(l, force_stage || stopping_.load() || aborted_.load());
  }

  void readPayload(Link& l) {
    const uint64_t left = l.cur.length - l.got;
    if (left == 0) return frameDone(l);
    // Whatever is available, up to the rest of the frame: every read refreshes the link's liveness, and between reads
    // a dropped receive or a broken link takes the caller's buffer out of the io thread's hands.
    asio::mutable_buffer buf = l.discarding ? asio::buffer(l.scratch.data(), std::min<uint64_t>(left, l.scratch.size()))
                                            : asio::buffer(l.target + l.got, left);
    l.socket->async_read_some(buf, [this, &l](const boost::system::error_code& ec, std::size_t n) {
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
          l.cv.notify_all();
          l.cur_recv.reset();
          l.discarding = true;
          l.scratch.resize(std::size_t{1} << 20);
        }
      }
      readPayload(l);
    });
  }

  void frameDone(Link& l) {
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
    l.cv.notify_all();
    l.cur_recv.reset();
    l.cur_staged.reset();
    readHeader(l);
  }

  void handleControl(Link& l) {
    switch (l.cur.meta.tag) {
      case kHeartbeatTag:
        return;
      case kAbortTag: {
        std::string reason(reinterpret_cast<const char*>(l.scratch.data()), l.scratch.size());
        for (char& c : reason)
          if (static_cast<unsigned char>(c) < 0x20 && c != '\n') c = '?';
        TERSE_LOG(LogLevel::kInfo, who_ << ": abort notice from " << l.who << ": " << reason);
        abortJob(reason);
        return;
      }
      case kByeTag: {
        std::vector<std::shared_ptr<RecvOp>> failed;
        {
          std::lock_guard lock(l.mutex);
          l.peer_left = true;
          for (auto& r : l.posted) {
            r->state = RecvOp::State::kFailed;
            r->error_comm = true;
            r->error = who_ + ": " + l.who + " closed its transport (left the job) before sending the frame of tag " +
                       std::to_string(r->expect.tag) + " this rank is waiting for";
          }
          l.posted.clear();
        }
        l.cv.notify_all();
        if (!l.bye_queued && !l.write_shut) {
          l.bye_queued = true;
          queueControl(l, kByeTag, {});
        }
        return;
      }
      default:
        return protocolError(l, "unknown control frame (tag " + std::to_string(l.cur.meta.tag) + ") from " + l.who);
    }
  }

  void readFailed(Link& l, const boost::system::error_code& ec) {
    {
      std::lock_guard lock(l.mutex);
      if (l.cur_recv) l.cur_recv->io_active = false;
    }
    l.cv.notify_all();
    l.cur_recv.reset();
    l.cur_staged.reset();
    if (l.closed) return markReadClosed(l);
    if (ec == asio::error::eof && l.peer_left) {
      // The orderly end after the peer's goodbye.
      markReadClosed(l);
      if (l.write_shut) closeLink(l);
      return;
    }
    const std::string what =
        ec == asio::error::eof
            ? "closed its connection without saying goodbye (end of file): the process exited, crashed or was killed"
            : "connection failed (" + ec.message() + "): the process died or the network is down";
    linkFailed(l, what);
  }

  // The link can no longer be trusted or used: the whole job fails, naming the peer.
  void linkFailed(Link& l, const std::string& what) {
    markReadClosed(l);
    closeLink(l);
    if (l.peer_left || stopping_.load()) return;
    if (std::find(options_.expendable_ranks.begin(), options_.expendable_ranks.end(), l.peer) !=
        options_.expendable_ranks.end()) {
      // An expendable peer is lost alone: its link's operations fail, the job goes on.
      const std::string message = who_ + ": " + l.who + " " + what + " (lost; the job goes on without it)";
      TERSE_LOG(LogLevel::kWarn, message);
      {
        std::lock_guard lock(l.mutex);
        if (l.broken.empty()) {
          l.broken = message;
          l.broken_by_payload = false;
        }
        l.writes.clear();
      }
      l.cv.notify_all();
      {
        std::lock_guard lock(pacer_mutex_);
        l.nic_queue.clear();
        l.release.clear();
        l.head_reserved = 0;
      }
      pacer_cv_.notify_all();
      return;
    }
    abortJob(who_ + ": " + l.who + " " + what);
  }

  void protocolError(Link& l, const std::string& what) {
    TERSE_LOG(LogLevel::kError, who_ << ": protocol error from " << l.who << ": " << what);
    {
      std::lock_guard lock(l.mutex);
      if (l.cur_recv) l.cur_recv->io_active = false;
    }
    l.cur_recv.reset();
    markReadClosed(l);
    closeLink(l);
    abortJob(who_ + ": protocol error on the connection from " + l.who + " (the stream lost its framing): " + what, &l,
             who_ + ": protocol error on the connection from " + l.who + ": " + what);
  }

  void markReadClosed(Link& l) {
    {
      std::lock_guard lock(life_mutex_);
      l.read_closed = true;
    }
    life_cv_.notify_all();
  }

  void closeLink(Link& l) {
    if (l.closed || !l.socket) return;
    l.closed = true;
    boost::system::error_code ignored;
    l.socket->shutdown(tcp::socket::shutdown_both, ignored);
    l.socket->close(ignored);
    {
      std::lock_guard lock(life_mutex_);
      l.read_closed = true;
    }
    life_cv_.notify_all();
  }

  // ---- liveness ---------------------------------------------------------------------------------------------------
  void armHeartbeat() {
    heartbeat_.expires_after(heartbeat_period_);
    heartbeat_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || stopping_.load()) return;
      const Clock::time_point now = Clock::now();
      for (auto& lp : links_) {
        Link& l = *lp;
        if (!l.socket || l.closed || l.read_closed) continue;
        bool parked = false;
        {
          std::lock_guard lock(l.mutex);
          parked = l.parked;
        }
        // A parked link is silent because this rank stopped reading it, not because the peer did.
        if (parked) l.last_heard = now;
        if (!l.peer_left && !aborted_.load() && now - l.last_heard > options_.timeout) {
          linkFailed(l, "has sent nothing for " + secondsText(now - l.last_heard) + " (heartbeat timeout " +
                            secondsText(options_.timeout) + "): the process is stopped, hung or unreachable");
          continue;
        }
        if (!l.writing && !l.write_shut && !l.bye_queued && now - l.last_sent >= heartbeat_period_)
          queueControl(l, kHeartbeatTag, {});
      }
      armHeartbeat();
    });
  }

  // ---- abort ------------------------------------------------------------------------------------------------------
  // `bad_link` (a protocol error) fails with InvalidPayload(bad_message) instead; it is marked under the same
  // ordering as the others, after aborted() turned true, so whoever sees the failure also sees the abort.
  void abortJob(const std::string& reason, Link* bad_link = nullptr, const std::string& bad_message = {}) {
    bool first = false;
    {
      std::lock_guard lock(abort_mutex_);
      if (!aborted_.load()) {
        abort_reason_ = reason;
        aborted_.store(true);
        first = true;
      }
    }
    if (bad_link != nullptr) {
      {
        std::lock_guard lock(bad_link->mutex);
        if (bad_link->broken.empty()) {
          bad_link->broken = bad_message;
          bad_link->broken_by_payload = true;
        }
      }
      bad_link->cv.notify_all();
    }
    if (!first) return;
    TERSE_LOG(LogLevel::kWarn, who_ << ": communication aborted: " << reason);
    const std::string message = "communication aborted: " + reason;
    for (auto& lp : links_) {
      if (!lp) continue;
      {
        std::lock_guard lock(lp->mutex);
        if (lp->broken.empty()) {
          lp->broken = message;
          lp->broken_by_payload = false;
        }
        // Frames not started never go out: their requests fail now. A write already running finishes (or fails when
        // the connection is closed), since it reads from a caller's buffer.
        lp->writes.clear();
      }
      lp->cv.notify_all();
    }
    {
      std::lock_guard lock(pacer_mutex_);
      for (auto& lp : links_) {
        if (!lp) continue;
        lp->nic_queue.clear();
        lp->release.clear();
        lp->head_reserved = 0;
      }
    }
    pacer_cv_.notify_all();
    if (io_started_) asio::post(io_, [this] { sendAbortNotices(); });
  }

  // Tells every peer why, then closes every connection after a short grace: a peer whose connection cannot take the
  // notice (a frame half written, a stopped peer) sees the connection end instead, which fails it just the same.
  void sendAbortNotices() {
    if (notices_queued_) return;
    notices_queued_ = true;
    std::string reason;
    {
      std::lock_guard lock(abort_mutex_);
      reason = abort_reason_;
    }
    for (auto& lp : links_) {
      if (!lp) continue;
      Link& l = *lp;
      unpark(l, true);  // read on: what follows may be notices
      if (!l.socket || l.closed || l.write_shut || l.bye_queued) continue;
      queueControl(l, kAbortTag, reason);
    }
    abort_grace_.expires_after(std::min<Clock::duration>(heartbeat_period_, std::chrono::seconds(1)));
    abort_grace_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (auto& lp : links_)
        if (lp) closeLink(*lp);
    });
  }

  // ---- emulation --------------------------------------------------------------------------------------------------
  // The rank's NIC (link_emulation.h): reserves the slices of the frames queued on its outgoing links on the link's
  // and the egress port's token buckets, and hands each slice to the link's writer when it has left them, so the bytes
  // reach the peer at the emulated rate. A frame has been sent when its last slice left.
  void pacerLoop() {
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    const uint64_t slice = options_.emulation.slice_bytes;
    std::unique_lock lock(pacer_mutex_);
    while (!pacer_stop_) {
      const Clock::time_point now = Clock::now();
      Clock::time_point wake = Clock::time_point::max();
      // Release the slices that have left.
      for (auto& lp : links_) {
        Link& l = *lp;
        if (l.release.empty()) continue;
        std::vector<WriteItem> ready;
        while (!l.release.empty() && l.release.front().first <= now) {
          ready.push_back(std::move(l.release.front().second));
          l.release.pop_front();
        }
        if (!l.release.empty()) wake = std::min(wake, l.release.front().first);
        if (ready.empty()) continue;
        lock.unlock();
        {
          std::lock_guard link_lock(l.mutex);
          if (l.broken.empty())
            for (auto& w : ready) l.writes.push_back(std::move(w));
        }
        asio::post(io_, [this, link = &l] { pump(*link); });
        lock.lock();
      }
      // Pick the link whose next slice can start first (round robin among equals).
      Link* best = nullptr;
      Clock::time_point best_start{};
      for (int k = 0; k < n_; ++k) {
        const int to = static_cast<int>((pacer_next_ + static_cast<std::size_t>(k)) % static_cast<std::size_t>(n_));
        Link& l = *links_[static_cast<std::size_t>(to)];
        if (l.nic_queue.empty()) continue;
        Clock::time_point start = std::max(l.nic_queue.front()->queued_at, l.wire.busyUntil());
        if (egress_.limited()) start = std::max(start, egress_.busyUntil());
        if (best == nullptr || start < best_start) {
          best = &l;
          best_start = start;
        }
      }
      if (best == nullptr || best_start > now) {
        if (best != nullptr) wake = std::min(wake, best_start);
        if (wake == Clock::time_point::max()) {
          pacer_cv_.wait(lock);
        } else {
          pacer_cv_.wait_until(lock, wake);
        }
        continue;
      }
      Link& l = *best;
      std::shared_ptr<SendOp> head = l.nic_queue.front();
      const uint64_t b = std::min(slice, head->wire_bytes - l.head_reserved);
      Clock::time_point end = l.wire.occupy(best_start, b);
      end = std::max(end, egress_.occupy(best_start, b));
      l.release.emplace_back(end, WriteItem{head, l.head_reserved, l.head_reserved + b});
      l.head_reserved += b;
      l.head_end = std::max(l.head_end, end);
      pacer_next_ = (static_cast<std::size_t>(l.peer) + 1) % static_cast<std::size_t>(n_);
      if (l.head_reserved == head->wire_bytes) {
        const Clock::time_point sent_at = l.head_end;
        l.nic_queue.pop_front();
        l.head_reserved = 0;
        l.head_end = Clock::time_point{};
        lock.unlock();
        {
          std::lock_guard link_lock(l.mutex);
          head->sent_at = sent_at;
          head->scheduled = true;
        }
        l.cv.notify_all();
        lock.lock();
      }
    }
  }

  // ---- setup (io thread) ------------------------------------------------------------------------------------------
  struct Handshake;
  void startAccept();
  void startHandshake(std::shared_ptr<Handshake> h);
  void connectAttempt(int peer, tcp::resolver::results_type endpoints, Clock::time_point deadline,
                      Clock::duration backoff);
  bool registerLink(int peer, std::unique_ptr<tcp::socket> socket, const std::string& label);
  void setSocketOptions(tcp::socket& s);
  void noteError(int peer, const std::string& what) {
    std::lock_guard lock(setup_mutex_);
    last_error_[static_cast<std::size_t>(peer)] = what;
  }
  std::string setupFailure(Store& store, const std::vector<int>& missing, Clock::duration waited);
  void startLinks();
  void shutdown();

  TcpOptions options_;
  JobToken token_;
  int n_;
  int rank_;
  std::string label_;
  std::string who_;
  bool emulated_;
  TrafficCounter counter_;

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread io_thread_;
  bool io_started_ = false;
  tcp::acceptor acceptor_;
  asio::steady_timer heartbeat_;
  asio::steady_timer abort_grace_;
  Clock::duration heartbeat_period_;
  Clock::duration handshake_timeout_;

  // Set once by connect() before the transport is handed out; the links themselves are shared with requests.
  std::vector<std::shared_ptr<Link>> links_;

  std::mutex setup_mutex_;
  std::condition_variable setup_cv_;
  int connected_ = 0;                    // guarded by setup_mutex_
  bool setup_done_ = false;              // guarded by setup_mutex_
  std::vector<std::string> last_error_;  // guarded by setup_mutex_: why the link to each rank is not up yet
  std::size_t pending_handshakes_ = 0;   // io thread only

  std::atomic<bool> aborted_{false};
  std::mutex abort_mutex_;
  std::string abort_reason_;  // guarded by abort_mutex_

  std::atomic<bool> stopping_{false};
  bool notices_queued_ = false;  // io thread only: sendAbortNotices ran
  std::mutex life_mutex_;        // guards Link::read_closed for the destructor's wait
  std::condition_variable life_cv_;

  // Emulation: the rank's egress port and its pacer (guarded by pacer_mutex_), the ingress port (io thread only).
  PacedResource ingress_;
  std::mutex pacer_mutex_;
  std::condition_variable pacer_cv_;
  PacedResource egress_;
  std::size_t pacer_next_ = 0;
  bool pacer_stop_ = false;
  std::thread pacer_;
};

// ---- setup
// ------------------------------------------------------------------------------------------------------------

// One connection in its handshake: the job-token exchange (auth.h), then the hellos. Every step has a deadline; any
// failure drops the connection (accepting side) or retries it (connecting side).
struct TcpTransport::Handshake {
  explicit Handshake(asio::io_context& io) : socket(std::make_unique<tcp::socket>(io)), timer(io) {}
  std::unique_ptr<tcp::socket> socket;
  asio::steady_timer timer;
  std::string remote;  // "127.0.0.1:40000", for messages
  std::array<std::byte, kAuthHelloBytes> auth_hello{};
  std::array<std::byte, kAuthChallengeBytes> auth_challenge{};
  std::array<std::byte, kAuthResponseBytes> auth_response{};
  tcp_wire::HelloBytes hello_out{};
  std::string label_out;
  tcp_wire::HelloBytes hello_in{};
  std::string label_in;
  tcp_wire::Hello peer_hello;
  bool timed_out = false;
};

void TcpTransport::setSocketOptions(tcp::socket& s) {
  boost::system::error_code ignored;
  s.set_option(tcp::no_delay(true), ignored);
  if (options_.socket_buffer_bytes > 0) {
    s.set_option(asio::socket_base::send_buffer_size(options_.socket_buffer_bytes), ignored);
    s.set_option(asio::socket_base::receive_buffer_size(options_.socket_buffer_bytes), ignored);
  }
}

void TcpTransport::startAccept() {
  auto h = std::make_shared<Handshake>(io_);
  acceptor_.async_accept(*h->socket, [this, h](const boost::system::error_code& ec) {
    if (ec) return;  // the acceptor was closed: setup is over
    {
      std::lock_guard lock(setup_mutex_);
      if (setup_done_) return;
    }
    boost::system::error_code rec;
    const auto ep = h->socket->remote_endpoint(rec);
    h->remote = rec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
    // A bound on connections in their handshake, so a connection flood cannot exhaust descriptors or memory.
    if (pending_handshakes_ >= tcp_wire::kMaxPendingHandshakes) {
      TERSE_LOG(LogLevel::kWarn, who_ << ": dropped a connection from " << h->remote << ": too many handshakes");
      boost::system::error_code ignored;
      h->socket->close(ignored);
    } else {
      ++pending_handshakes_;
      startHandshake(h);
    }
    startAccept();
  });
}

void TcpTransport::startHandshake(std::shared_ptr<Handshake> h) {
  setSocketOptions(*h->socket);
  auto server = std::make_shared<AuthServer>(token_, AuthService::kTransport);
  auto done = std::make_shared<bool>(false);
  // Ends the handshake: the connection is dropped (and logged) unless `ok`.
  auto finish = [this, h, done](const std::string& failure) {
    if (*done) return;
    *done = true;
    --pending_handshakes_;
    h->timer.cancel();
    if (!failure.empty()) {
      TERSE_LOG(LogLevel::kWarn, who_ << ": dropped a connection from " << h->remote << " during setup: " << failure);
      boost::system::error_code ignored;
      if (h->socket) h->socket->close(ignored);
    }
  };
  // One deadline per message: a silent peer cannot hold the slot longer than that.
  auto arm = [this, h]() {
    h->timer.expires_after(handshake_timeout_);
    h->timer.async_wait([h](const boost::system::error_code& ec) {
      if (ec || !h->socket) return;
      h->timed_out = true;
      boost::system::error_code ignored;
      h->socket->close(ignored);
    });
  };
  auto fail = [h, finish](const char* step, const boost::system::error_code& ec) {
    finish(std::string(step) + ": " + (h->timed_out ? std::string("no answer within the deadline") : ec.message()));
  };
  arm();
  asio::async_read(
      *h->socket, asio::buffer(h->auth_hello), [=, this](const boost::system::error_code& ec, std::size_t) {
        if (ec) return fail("reading the authentication hello", ec);
        try {
          h->auth_challenge = server->challenge(h->auth_hello);
        } catch (const AuthError& e) {
          return finish(std::string("authentication failed: ") + e.what());
        }
        arm();
        asio::async_write(
            *h->socket, asio::buffer(h->auth_challenge), [=, this](const boost::system::error_code& ec2, std::size_t) {
              if (ec2) return fail("writing the authentication challenge", ec2);
              arm();
              asio::async_read(
                  *h->socket, asio::buffer(h->auth_response),
                  [=, this](const boost::system::error_code& ec3, std::size_t) {
                    if (ec3) return fail("reading the authentication response", ec3);
                    try {
                      server->verify(h->auth_response);
                    } catch (const AuthError& e) {
                      return finish(std::string("authentication failed (wrong job token?): ") + e.what());
                    }
                    arm();
                    asio::async_read(
                        *h->socket, asio::buffer(h->hello_in),
                        [=, this](const boost::system::error_code& ec4, std::size_t) {
                          if (ec4) return fail("reading the hello", ec4);
                          try {
                            h->peer_hello = tcp_wire::decodeHello(h->hello_in, tcp_wire::kHelloMagic);
                          } catch (const InvalidPayload& e) {
                            return finish(e.what());
                          }
                          h->label_in.resize(h->peer_hello.label_bytes);
                          asio::async_read(
                              *h->socket, asio::buffer(h->label_in),
                              [=, this](const boost::system::error_code& ec5, std::size_t) {
                                if (ec5) return fail("reading the hello's host label", ec5);
                                const int peer = static_cast<int>(h->peer_hello.rank);
                                std::string problem;
                                if (h->peer_hello.world_size != static_cast<uint32_t>(n_)) {
                                  problem = "hello from a job of " + std::to_string(h->peer_hello.world_size) +
                                            " ranks, this job has " + std::to_string(n_);
                                } else if (peer <= rank_ || peer >= n_) {
                                  problem = "hello from rank " + std::to_string(h->peer_hello.rank) +
                                            ", but only ranks above this one connect here (" +
                                            std::to_string(rank_ + 1) + ".." + std::to_string(n_ - 1) + ")";
                                } else if (links_[static_cast<std::size_t>(peer)]) {
                                  problem = "hello from rank " + std::to_string(peer) + ", which is already connected";
                                }
                                if (!problem.empty()) return finish(problem);
                                h->hello_out = tcp_wire::encodeHello(tcp_wire::kAckMagic, static_cast<uint32_t>(rank_),
                                                                     static_cast<uint32_t>(n_), label_);
                                h->label_out = label_.substr(0, tcp_wire::kMaxLabelBytes);
                                // The acknowledgement is written before the link is registered: nothing else may write
                                // on the socket while it is in flight.
                                std::array<asio::const_buffer, 2> ack{asio::buffer(h->hello_out),
                                                                      asio::buffer(h->label_out)};
                                asio::async_write(
                                    *h->socket, ack, [=, this](const boost::system::error_code& ec6, std::size_t) {
                                      if (ec6) return fail("writing the acknowledgement", ec6);
                                      if (*done) return;
                                      if (!registerLink(peer, std::move(h->socket), tcp_wire::printable(h->label_in)))
                                        return finish("rank " + std::to_string(peer) +
                                                      " connected twice, or after setup ended");
                                      finish("");
                                    });
                              });
                        });
                  });
            });
      });
}

void TcpTransport::connectAttempt(int peer, tcp::resolver::results_type endpoints, Clock::time_point deadline,
                                  Clock::duration backoff) {
  {
    std::lock_guard lock(setup_mutex_);
    if (setup_done_) return;
  }
  auto h = std::make_shared<Handshake>(io_);
  auto client = std::make_shared<AuthClient>(token_, AuthService::kTransport);
  auto done = std::make_shared<bool>(false);
  // Retries with exponential backoff until the setup deadline; connectTcpTransport reports the last failure.
  auto retry = [this, h, done, peer, endpoints, deadline, backoff](const std::string& failure) {
    if (*done) return;
    *done = true;
    h->timer.cancel();
    boost::system::error_code ignored;
    if (h->socket) h->socket->close(ignored);
    noteError(peer, failure);
    TERSE_LOG(LogLevel::kDebug, who_ << ": connecting to rank " << peer << ": " << failure);
    if (Clock::now() + backoff >= deadline) return;
    auto t = std::make_shared<asio::steady_timer>(io_, backoff);
    t->async_wait([this, t, peer, endpoints, deadline, backoff](const boost::system::error_code& ec) {
      if (ec) return;
      connectAttempt(peer, endpoints, deadline, std::min<Clock::duration>(backoff * 2, std::chrono::seconds(1)));
    });
  };
  auto arm = [this, h]() {
    h->timer.expires_after(handshake_timeout_);
    h->timer.async_wait([h](const boost::system::error_code& ec) {
      if (ec || !h->socket) return;
      h->timed_out = true;
      boost::system::error_code ignored;
      h->socket->close(ignored);
    });
  };
  auto fail = [h, retry](const char* step, const boost::system::error_code& ec) {
    retry(std::string(step) + ": " + (h->timed_out ? std::string("no answer within the deadline") : ec.message()));
  };
  arm();
  asio::async_connect(*h->socket, endpoints, [=, this](const boost::system::error_code& ec, const tcp::endpoint& ep) {
    if (ec) return fail("connecting", ec);
    h->remote = ep.address().to_string() + ":" + std::to_string(ep.port());
    setSocketOptions(*h->socket);
    h->auth_hello = client->hello();
    arm();
    asio::async_write(
        *h->socket, asio::buffer(h->auth_hello), [=, this](const boost::system::error_code& ec2, std::size_t) {
          if (ec2) return fail("writing the authentication hello", ec2);
          asio::async_read(
              *h->socket, asio::buffer(h->auth_challenge),
              [=, this](const boost::system::error_code& ec3, std::size_t) {
                if (ec3)
                  return fail("reading the authentication challenge (a wrong job token is refused this way)", ec3);
                try {
                  h->auth_response = client->answer(h->auth_challenge);
                } catch (const AuthError& e) {
                  return retry(std::string("authentication failed: ") + e.what());
                }
                h->hello_out = tcp_wire::encodeHello(tcp_wire::kHelloMagic, static_cast<uint32_t>(rank_),
                                                     static_cast<uint32_t>(n_), label_);
                h->label_out = label_.substr(0, tcp_wire::kMaxLabelBytes);
                std::array<asio::const_buffer, 3> out{asio::buffer(h->auth_response), asio::buffer(h->hello_out),
                                                      asio::buffer(h->label_out)};
                arm();
                asio::async_write(*h->socket, out, [=, this](const boost::system::error_code& ec4, std::size_t) {
                  if (ec4) return fail("writing the hello", ec4);
                  asio::async_read(*h->socket, asio::buffer(h->hello_in),
                                   [=, this](const boost::system::error_code& ec5, std::size_t) {
                                     if (ec5) return fail("reading the acknowledgement (refused by the peer?)", ec5);
                                     try {
                                       h->peer_hello = tcp_wire::decodeHello(h->hello_in, tcp_wire::kAckMagic);
                                     } catch (const InvalidPayload& e) {
                                       return retry(e.what());
                                     }
                                     if (h->peer_hello.rank != static_cast<uint32_t>(peer) ||
                                         h->peer_hello.world_size != static_cast<uint32_t>(n_))
                                       return retry("the listener at " + h->remote + " is rank " +
                                                    std::to_string(h->peer_hello.rank) + " of " +
                                                    std::to_string(h->peer_hello.world_size) + ", expected rank " +
                                                    std::to_string(peer) + " of " + std::to_string(n_));
                                     h->label_in.resize(h->peer_hello.label_bytes);
                                     asio::async_read(*h->socket, asio::buffer(h->label_in),
                                                      [=, this](const boost::system::error_code& ec6, std::size_t) {
                                                        if (ec6)
                                                          return fail("reading the acknowledgement's host label", ec6);
                                                        if (*done) return;
                                                        *done = true;
                                                        h->timer.cancel();
                                                        if (!registerLink(peer, std::move(h->socket),
                                                                          tcp_wire::printable(h->label_in)))
                                                          noteError(peer, "connected after setup ended");
                                                      });
                                   });
                });
              });
        });
  });
}

bool TcpTransport::registerLink(int peer, std::unique_ptr<tcp::socket> socket, const std::string& label) {
  {
    std::lock_guard lock(setup_mutex_);
    if (setup_done_ || links_[static_cast<std::size_t>(peer)]) {
      boost::system::error_code ignored;
      if (socket) socket->close(ignored);
      return false;
    }
  }
  auto l = std::make_shared<Link>();
  l->peer = peer;
  l->who = "rank " + std::to_string(peer) + " (host " + label + ")";
  l->socket = std::move(socket);
  l->spec = options_.emulation.linkSpec(rank_, peer);
  l->wire = PacedResource(l->spec.bandwidth_bps);
  links_[static_cast<std::size_t>(peer)] = std::move(l);
  {
    std::lock_guard lock(setup_mutex_);
    ++connected_;
  }
  setup_cv_.notify_all();
  return true;
}

// Runs on the io thread once every link is up: nothing was read from an established link before.
void TcpTransport::startLinks() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  const Clock::time_point now = Clock::now();
  for (auto& lp : links_) {
    Link& l = *lp;
    if (!l.socket) continue;
    l.last_heard = now;
    l.last_sent = now;
    l.reading = true;
    readHeader(l);
    pump(l);
  }
  armHeartbeat();
}

std::string TcpTransport::setupFailure(Store& store, const std::vector<int>& missing, Clock::duration waited) {
  std::ostringstream m;
  m << who_ << ": tcp transport setup timed out after " << secondsText(waited) << ": not connected to ";
  bool first = true;
  for (int r : missing) {
    m << (first ? "" : "; ") << "rank " << r;
    first = false;
    std::string host, addr;
    try {
      if (store.check(key("host", r))) host = tcp_wire::printable(store.get(key("host", r), std::chrono::seconds(1)));
      if (store.check(key("addr", r))) addr = tcp_wire::printable(store.get(key("addr", r), std::chrono::seconds(1)));
    } catch (const std::exception&) {
    }
    if (addr.empty()) {
      m << " (never published its address under '" << key("addr", r) << "': not started, or a different store/prefix)";
    } else {
      m << " (host " << (host.empty() ? "?" : host) << ", listening at " << addr;
      std::lock_guard lock(setup_mutex_);
      const std::string& e = last_error_[static_cast<std::size_t>(r)];
      if (!e.empty()) m << ", last error: " << e;
      m << ")";
    }
  }
  return m.str();
}

void TcpTransport::connect(Store& store) {
  const Clock::time_point begin = Clock::now();
  const Clock::time_point deadline = begin + options_.timeout;
  if (n_ == 1) return;  // frames to itself cross no socket and are not emulated

  tcp::endpoint bind_ep;
  try {
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(options_.bind_address, std::to_string(options_.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service);
    TERSE_CHECK(!results.empty(), InvalidArgument,
                "tcp transport: bind address '" << options_.bind_address << "' does not resolve");
    bind_ep = results.begin()->endpoint();
  } catch (const boost::system::system_error& e) {
    TERSE_THROW(InvalidArgument,
                "tcp transport: bind address '" << options_.bind_address << "' does not resolve: " << e.what());
  }
  try {
    acceptor_.open(bind_ep.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    if (options_.socket_buffer_bytes > 0)  // accepted sockets inherit it, before the window is negotiated
      acceptor_.set_option(asio::socket_base::receive_buffer_size(options_.socket_buffer_bytes));
    acceptor_.bind(bind_ep);
    acceptor_.listen();
  } catch (const boost::system::system_error& e) {
    TERSE_THROW(CommError, who_ << ": tcp transport cannot listen on " << options_.bind_address << ":" << options_.port
                                << ": " << e.what());
  }
  const uint16_t port = acceptor_.local_endpoint().port();
  std::string advertise = options_.advertise_address;
  if (advertise.empty()) {
    advertise = options_.bind_address;
    if (bind_ep.address().is_unspecified()) {
      // Bound to every interface: advertise the address the host name resolves to (what peers on other hosts use).
      try {
        tcp::resolver resolver(io_);
        // Debian maps the host name to 127.0.1.1 in /etc/hosts: prefer an address other hosts can reach.
        advertise = asio::ip::host_name();
        bool found_remote = false;
        for (const auto& e : resolver.resolve(asio::ip::host_name(), "0")) {
          if (found_remote) break;
          const auto addr = e.endpoint().address();
          if (!addr.is_loopback() && !(addr.is_v4() && (addr.to_v4().to_uint() >> 24) == 127)) {
            advertise = addr.to_string();
            found_remote = true;
          }
        }
      } catch (const boost::system::system_error&) {
        advertise = asio::ip::host_name();
      }
    }
  }
  const std::string published =
      (advertise.find(':') != std::string::npos ? "[" + advertise + "]" : advertise) + ":" + std::to_string(port);

  work_.emplace(io_.get_executor());
  io_thread_ = std::thread([this] { io_.run(); });
  io_started_ = true;
  if (rank_ < n_ - 1) asio::post(io_, [this] { startAccept(); });

  // The host first, so whoever sees the address can name the host too.
  store.set(key("host", rank_), label_);
  store.set(key("addr", rank_), published);
  TERSE_LOG(LogLevel::kDebug, who_ << ": tcp transport listening at " << published);

  for (int peer = 0; peer < rank_; ++peer) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    std::string addr;
    try {
      addr = store.get(key("addr", peer), std::chrono::duration_cast<std::chrono::milliseconds>(left));
    } catch (const CommError& e) {
      noteError(peer, e.what());
      continue;
    }
    const auto colon = addr.rfind(':');
    std::string host = colon == std::string::npos ? addr : addr.substr(0, colon);
    const std::string service = colon == std::string::npos ? "" : addr.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    try {
      tcp::resolver resolver(io_);
      auto endpoints = resolver.resolve(host, service, tcp::resolver::numeric_service);
      asio::post(io_, [this, peer, endpoints, deadline] {
        connectAttempt(peer, endpoints, deadline, std::chrono::milliseconds(20));
      });
    } catch (const boost::system::system_error& e) {
      noteError(peer, "address '" + tcp_wire::printable(addr) + "' does not resolve: " + e.what());
    }
  }

  std::vector<int> missing;
  {
    std::unique_lock lock(setup_mutex_);
    setup_cv_.wait_until(lock, deadline, [&] { return connected_ == n_ - 1; });
    // From here on the io thread registers no more links (a late handshake sees setup_done_).
    setup_done_ = true;
  }
  // Settle on the io thread: what registered by now is final.
  {
    std::promise<void> settled;
    asio::post(io_, [&] {
      for (int r = 0; r < n_; ++r)
        if (!links_[static_cast<std::size_t>(r)]) missing.push_back(r);
      if (missing.empty()) startLinks();
      settled.set_value();
    });
    settled.get_future().wait();
  }
  if (!missing.empty()) TERSE_THROW(CommError, setupFailure(store, missing, Clock::now() - begin));
  // The pacer walks every link: it starts once they all exist.
  if (emulated_) pacer_ = std::thread([this] { pacerLoop(); });
}

// Goodbye to every peer (so its end of file is not taken for a crash), then wait, bounded, until every peer answered
// with its own end of file, and stop the threads.
void TcpTransport::shutdown() {
  stopping_.store(true);
  if (io_started_) {
    asio::post(io_, [this] {
      // The abort's own post may still be queued behind this one (it was posted from a handler): the notices must be
      // queued before the connections are closed.
      if (aborted_.load()) sendAbortNotices();
      for (auto& lp : links_) {
        if (!lp) continue;
        Link& l = *lp;
        unpark(l, true);  // read on to the peer's goodbye
        if (!l.socket || l.closed || l.bye_queued || l.write_shut || !l.reading) continue;
        if (aborted_.load()) {
          // Closed once the abort notice is out (onWritten), or now when there is nothing left to tell.
          bool idle = false;
          {
            std::lock_guard lock(l.mutex);
            idle = !l.writing && l.controls.empty();
          }
          if (l.notice_sent || idle) closeLink(l);
          continue;
        }
        l.bye_queued = true;
        queueControl(l, kByeTag, {});
      }
    });
    {
      const Clock::time_point limit =
          Clock::now() + std::min<Clock::duration>(options_.timeout, std::chrono::seconds(5));
      std::unique_lock lock(life_mutex_);
      life_cv_.wait_until(lock, limit, [&] {
        for (auto& lp : links_)
          if (lp && lp->socket && lp->reading && !lp->read_closed) return false;
        return true;
      });
    }
    asio::post(io_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      heartbeat_.cancel();
      abort_grace_.cancel();
      for (auto& lp : links_)
        if (lp) closeLink(*lp);
      work_.reset();
      // Handlers still pending (retry and handshake timers, operations on closed sockets) are dropped, not run: the
      // buffers they could touch are released below.
      io_.stop();
    });
    io_thread_.join();
    for (auto& lp : links_)
      if (lp) lp->socket.reset();  // a socket must not outlive its io_context; requests may keep the link
  }
  if (pacer_.joinable()) {
    {
      std::lock_guard lock(pacer_mutex_);
      pacer_stop_ = true;
    }
    pacer_cv_.notify_all();
    pacer_.join();
  }
  // Requests may outlive the transport: they fail from now on, and nothing writes into their buffers any more.
  const std::string message = who_ + ": the tcp transport was destroyed";
  for (auto& lp : links_) {
    if (!lp) continue;
    {
      std::lock_guard lock(lp->mutex);
      if (lp->broken.empty()) lp->broken = message;
      for (auto& r : lp->posted) r->io_active = false;
      if (lp->cur_recv) lp->cur_recv->io_active = false;
      for (auto& w : lp->writes) w.op->io_active = false;
      lp->writes.clear();
    }
    lp->cv.notify_all();
  }
}

}  // namespace

std::unique_ptr<Transport> connectTcpTransport(const TcpOptions& options, const JobToken& token, Store& store) {
  TERSE_CHECK(options.world_size >= 1, InvalidArgument,
              "tcp transport: world size must be >= 1, got " << options.world_size);
  TERSE_CHECK(options.rank >= 0 && options.rank < options.world_size, InvalidArgument,
              "tcp transport: rank must be in [0, " << options.world_size << "), got " << options.rank);
  TERSE_CHECK(options.timeout.count() > 0, InvalidArgument, "tcp transport: timeout must be > 0");
  TERSE_CHECK(options.max_frame_bytes > 0, InvalidArgument, "tcp transport: max_frame_bytes must be > 0");
  TERSE_CHECK(options.socket_buffer_bytes >= 0, InvalidArgument,
              "tcp transport: socket_buffer_bytes must be >= 0, got " << options.socket_buffer_bytes);
  options.emulation.validate(options.world_size);
  auto t = std::make_unique<TcpTransport>(options, token);
  t->connect(store);
  return t;
}

}  // namespace terse::comm
