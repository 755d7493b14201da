// The write half of the tcp transport's links, on the io thread (transport.h, "Data path"): each frame's header and the
// caller's payload in one scatter-gather write, control frames between data frames, and the goodbye last.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "core/comm/tcp/transport_detail.h"
#include "core/comm/tcp/wire.h"

namespace terse::comm::tcp {

using asio::ip::tcp;
using tcp_wire::kAbortTag;
using tcp_wire::kByeTag;
using tcp_wire::kHeartbeatTag;
using tcp_wire::kMaxControlBytes;

void TcpTransport::queueControl(Link& l, Tag tag, std::string_view payload) {
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

void TcpTransport::pump(Link& l) {
  if (l.closed || l.write_shut || l.write_failed || !l.socket) return;
  {
    std::lock_guard lock(l.mutex);
    if (l.writing || (l.controls.empty() && l.writes.empty())) return;
  }
  // The io thread's writes go through the socket object: back into the epoll set first (caller reads took it out).
  if (!watch(l)) return;
  WriteItem item;
  {
    std::lock_guard lock(l.mutex);
    if (l.writing) return;  // the io thread's own write, or a caller's direct one, which pumps again when it ends
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
    l.writing = true;
  }
  // Scatter-gather: the header (or its remaining part) and the caller's payload go out in one write, no copy.
  const SendOp& op = *item.op;
  std::array<asio::const_buffer, 2> bufs{};
  if (item.begin < kFrameHeaderBytes)
    bufs[0] = asio::buffer(op.header.data() + item.begin, std::min<uint64_t>(item.end, kFrameHeaderBytes) - item.begin);
  if (item.end > kFrameHeaderBytes) {
    const uint64_t b = std::max<uint64_t>(item.begin, kFrameHeaderBytes) - kFrameHeaderBytes;
    bufs[1] = asio::buffer(op.data.data() + b, item.end - kFrameHeaderBytes - b);
  }
  l.io_writing = true;
  asio::async_write(*l.socket, bufs,
                    [this, &l, item](const boost::system::error_code& ec, std::size_t) { onWritten(l, item, ec); });
}

void TcpTransport::postPump(Link& l) {
  asio::post(io_, [this, link = &l] {
    {
      std::lock_guard lock(link->mutex);
      link->pump_posted = false;
    }
    pump(*link);
  });
}

// Writes wire bytes [item.begin, item.end) of item.op on fd, non-blocking, advancing item.begin; 0 when the socket took
// all of them or is full (EAGAIN), else the errno that ended the attempt.
static int writeNonBlocking(int fd, WriteItem& item) {
  const SendOp& op = *item.op;
  while (item.begin < item.end) {
    iovec iov[2];
    int parts = 0;
    if (item.begin < kFrameHeaderBytes)
      iov[parts++] = iovec{const_cast<std::byte*>(op.header.data()) + item.begin,
                           static_cast<std::size_t>(std::min<uint64_t>(item.end, kFrameHeaderBytes) - item.begin)};
    if (item.end > kFrameHeaderBytes) {
      const uint64_t b = std::max<uint64_t>(item.begin, kFrameHeaderBytes) - kFrameHeaderBytes;
      iov[parts++] =
          iovec{const_cast<std::byte*>(op.data.data()) + b, static_cast<std::size_t>(item.end - kFrameHeaderBytes - b)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(parts);
    const ssize_t w = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      item.begin += static_cast<uint64_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return 0;
    } else {
      return w < 0 ? errno : EPIPE;
    }
  }
  return 0;
}

// Frames from this size up that a direct write leaves unfinished go to the bulk writer; smaller ones to the io thread,
// as before the bulk writer. With every frame handed over, a 1 MiB allreduce (segments of 512 KiB at 2 ranks, 256 KiB
// at 4) ran 1.2-1.5x slower than without the bulk writer on a 16-core machine, presumably because the hand-over wakes a
// sleeping thread where the io thread is usually awake already (reading the peer's half of the exchange); at 64 MiB
// (1 MiB segments, a ring step's backlog of them) it made 4 ranks 1.68x faster there and 1.1x on 2 vCPUs. The default
// ring segment is 1 MiB, so this keeps the bulk writer for a large message's pipeline. Whether the small sizes are then
// as fast as before on the 16-core machine has not been measured (results/reference/gpu/README.md).
constexpr std::size_t kBulkMinFrameBytes = std::size_t{1} << 20;

void TcpTransport::writeDirect(Link& l, const std::shared_ptr<SendOp>& op) {
  // The caller holds l.writing and l.direct, so l.fd stays open and no other write interleaves. Non-blocking: a full
  // socket buffer (the peer reads slower) ends the attempt. The rest goes to the bulk writer, whose thread finishes it
  // (and the frames queued behind it) as the peer reads; an error is left for the io thread to meet again on the same
  // socket and report as it reports every failed write.
  WriteItem item{op, 0, op->wire_bytes};
  const int err = writeNonBlocking(l.fd, item);
  bool post = false;
  bool bulk = false;
  {
    std::lock_guard lock(l.mutex);
    l.direct = false;
    op->io_active = false;
    if (item.begin == op->wire_bytes) {
      op->done = true;
    } else {
      // The rest goes first, before any control frame (mid_frame), exactly as if the io thread had started it.
      l.writes.push_front(item);
      l.mid_frame = item.begin != 0;
    }
    // The rest, or frames other threads queued meanwhile: the bulk writer keeps l.writing, it is the link's writer now
    // -- for a large frame only (kBulkMinFrameBytes).
    bulk = err == 0 && bulk_wake_fd_ >= 0 && !l.writes.empty() && op->data.size() >= kBulkMinFrameBytes;
    if (!bulk) l.writing = false;
    if (!bulk && (!l.writes.empty() || !l.controls.empty())) {
      post = !l.pump_posted;
      l.pump_posted = true;
    }
  }
  l.direct_sent.store(Clock::now().time_since_epoch().count());
  l.notifyWaiters();
  if (bulk) {
    {
      std::lock_guard lock(bulk_mutex_);
      bulk_incoming_.push_back(&l);
    }
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(bulk_wake_fd_, &one, sizeof one);
  }
  if (post) postPump(l);
}

// ---- the bulk writer ------------------------------------------------------------------------------------------------
// A frame that a caller's direct write could not finish (the peer's receive window is full: it reads, and adds, slower
// than this rank writes) used to go to the io thread, which then wrote it -- and every frame queued behind it -- in
// pieces of one window opening each (about 60 KiB on loopback), between the reads and additions of every link: a ring
// step posts all of its segments at once, so most of an allreduce's bytes went out that way and the io thread did both
// halves of the copying. The bulk writer is a thread of its own for them; it owns the link (l.writing) until its queue
// is empty, writes as the socket takes bytes (poll on every link it owns, so one slow peer holds up no other link),
// and hands the link back to the io thread for what the io thread must do itself: an abort notice, the goodbye (after
// which it shuts the socket down), an error (which it reports). Heartbeats it writes between frames like the io thread.

void TcpTransport::startBulkWriter() {
  if (emulated_ || n_ < 2) return;
  bulk_wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (bulk_wake_fd_ < 0) return;  // the io thread writes the backlog, as it can
  bulk_thread_ = std::thread([this] { bulkWriterLoop(); });
}

void TcpTransport::stopBulkWriter() {
  if (!bulk_thread_.joinable()) return;
  {
    std::lock_guard lock(bulk_mutex_);
    bulk_stop_ = true;
  }
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(bulk_wake_fd_, &one, sizeof one);
  bulk_thread_.join();
  ::close(bulk_wake_fd_);
  bulk_wake_fd_ = -1;
}

bool TcpTransport::bulkWrite(Link& l) {
  for (;;) {
    WriteItem item;
    int fd = -1;
    bool post = false;
    {
      std::lock_guard lock(l.mutex);
      // Back to the io thread, which pumps what is left (or meets the link's end).
      auto giveBack = [&] {
        l.writing = false;
        if (!l.writes.empty() || !l.controls.empty()) {
          post = !l.pump_posted;
          l.pump_posted = true;
        }
      };
      if (!l.broken.empty() || l.fd < 0) {
        giveBack();
      } else if (!l.mid_frame && !l.controls.empty()) {
        if (l.controls.front()->control_tag == kHeartbeatTag) {
          item = WriteItem{l.controls.front(), 0, l.controls.front()->wire_bytes};
          l.controls.pop_front();
        } else {
          giveBack();
        }
      } else if (!l.writes.empty() && l.writes.front().op->control_tag != kByeTag) {
        item = std::move(l.writes.front());
        l.writes.pop_front();
      } else {
        giveBack();
      }
      if (item.op) {
        item.op->io_active = true;
        l.direct = true;
        fd = l.fd;
      }
    }
    if (!item.op) {
      l.notifyWaiters();
      if (post) postPump(l);
      return false;
    }
    const int err = writeNonBlocking(fd, item);
    {
      std::lock_guard lock(l.mutex);
      l.direct = false;
      item.op->io_active = false;
      if (item.begin == item.end) {
        item.op->done = true;
        l.mid_frame = false;
      } else {
        l.mid_frame = item.begin != 0;
        l.writes.push_front(item);
      }
      if (err != 0) {
        // The io thread writes the rest: its write meets the same error and reports it (onWritten).
        l.writing = false;
        post = !l.pump_posted;
        l.pump_posted = true;
      }
    }
    l.direct_sent.store(Clock::now().time_since_epoch().count());
    l.notifyWaiters();
    if (err != 0) {
      postPump(l);
      return false;
    }
    if (item.begin != item.end) return true;  // the socket is full: wait until it takes more
  }
}

void TcpTransport::bulkWriterLoop() {
  std::vector<Link*> owned;
  std::vector<pollfd> fds;
  for (;;) {
    {
      std::lock_guard lock(bulk_mutex_);
      if (bulk_stop_) break;
      owned.insert(owned.end(), bulk_incoming_.begin(), bulk_incoming_.end());
      bulk_incoming_.clear();
    }
    std::erase_if(owned, [&](Link* l) { return !bulkWrite(*l); });
    fds.assign(1, pollfd{bulk_wake_fd_, POLLIN, 0});
    for (Link* l : owned) {
      std::lock_guard lock(l->mutex);
      fds.push_back(pollfd{l->fd, POLLOUT, 0});
    }
    // The timeout only bounds how long a link that was closed under a poll (which then never reports it) stays owned.
    const int r = ::poll(fds.data(), fds.size(), owned.empty() ? -1 : 100);
    if (r > 0 && (fds[0].revents & POLLIN) != 0) {
      uint64_t count = 0;
      [[maybe_unused]] const ssize_t n = ::read(bulk_wake_fd_, &count, sizeof count);
    }
  }
  // The io thread has stopped (shutdown): hand the links back; shutdown() fails what they still hold.
  for (Link* l : owned) {
    {
      std::lock_guard lock(l->mutex);
      l->writing = false;
    }
    l->notifyWaiters();
  }
}

void TcpTransport::onWritten(Link& l, const WriteItem& item, const boost::system::error_code& ec) {
  l.io_writing = false;
  {
    std::lock_guard lock(l.mutex);
    l.writing = false;
    item.op->io_active = false;
    if (!ec) {
      l.mid_frame = item.end != item.op->wire_bytes;
      if (!l.mid_frame) item.op->done = true;
    }
  }
  l.notifyWaiters();
  if (ec) {
    // A reset or broken pipe on write is how a killed peer shows up when our write races its death -- and how a peer
    // that aborted and closed shows up before its notice is read (writeFailed).
    writeFailed(l, "connection failed while writing (" + ec.message() + "): the process died or the network is down");
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

}  // namespace terse::comm::tcp
