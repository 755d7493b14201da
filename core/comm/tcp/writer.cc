// The write half of the tcp transport's links, on the io thread (transport.h, "Data path"): each frame's header and the
// caller's payload in one scatter-gather write, control frames between data frames, and the goodbye last.
#include <algorithm>
#include <array>
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
    bufs[0] = asio::buffer(op.header.data() + item.begin, std::min<uint64_t>(item.end, kFrameHeaderBytes) - item.begin);
  if (item.end > kFrameHeaderBytes) {
    const uint64_t b = std::max<uint64_t>(item.begin, kFrameHeaderBytes) - kFrameHeaderBytes;
    bufs[1] = asio::buffer(op.data.data() + b, item.end - kFrameHeaderBytes - b);
  }
  l.writing = true;
  asio::async_write(*l.socket, bufs,
                    [this, &l, item](const boost::system::error_code& ec, std::size_t) { onWritten(l, item, ec); });
}

void TcpTransport::onWritten(Link& l, const WriteItem& item, const boost::system::error_code& ec) {
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
