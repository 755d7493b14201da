// The write half of the tcp transport's links, on the io thread (transport.h, "Data path"): each frame's header and the
// caller's payload in one scatter-gather write, control frames between data frames, and the goodbye last.
#include <sys/socket.h>
#include <sys/uio.h>

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
  if (l.closed || l.write_shut || !l.socket) return;
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

void TcpTransport::writeDirect(Link& l, const std::shared_ptr<SendOp>& op) {
  // The caller holds l.writing and l.direct, so l.fd stays open and no other write interleaves. Non-blocking: a full
  // socket buffer (the peer reads slower) ends the attempt, and an error is left for the io thread to meet again on
  // the same socket and report as it reports every failed write.
  uint64_t off = 0;
  for (;;) {
    iovec iov[2];
    int parts = 0;
    if (off < kFrameHeaderBytes) iov[parts++] = iovec{op->header.data() + off, kFrameHeaderBytes - off};
    const uint64_t body = std::max<uint64_t>(off, kFrameHeaderBytes) - kFrameHeaderBytes;
    if (body < op->data.size())
      iov[parts++] = iovec{const_cast<std::byte*>(op->data.data()) + body, op->data.size() - body};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(parts);
    const ssize_t w = ::sendmsg(l.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      off += static_cast<uint64_t>(w);
      if (off == op->wire_bytes) break;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  bool post = false;
  {
    std::lock_guard lock(l.mutex);
    l.direct = false;
    l.writing = false;
    op->io_active = false;
    if (off == op->wire_bytes) {
      op->done = true;
    } else {
      // The rest goes first, before any control frame (mid_frame), exactly as if the io thread had started it.
      l.writes.push_front(WriteItem{op, off, op->wire_bytes});
      l.mid_frame = off != 0;
    }
    if (!l.writes.empty() || !l.controls.empty()) {
      post = !l.pump_posted;
      l.pump_posted = true;
    }
  }
  l.direct_sent.store(Clock::now().time_since_epoch().count());
  l.notifyWaiters();
  if (post) postPump(l);
}

void TcpTransport::onWritten(Link& l, const WriteItem& item, const boost::system::error_code& ec) {
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
    // A reset or broken pipe on write is how a killed peer shows up when our write races its death.
    if (!l.closed)
      linkFailed(l, "connection failed while writing (" + ec.message() + "): the process died or the network is down");
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
