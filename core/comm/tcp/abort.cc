// A failure of the tcp transport made job-wide (transport.h, "Errors"): the first abort reason fails every request of
// this rank, travels to every peer as an abort notice, and closes the connections after a short grace; a protocol
// error on a connection is one such failure.
#include "core/comm/tcp/transport_detail.h"
#include "core/comm/tcp/wire.h"
#include "core/common/log.h"

namespace terse::comm::tcp {

using tcp_wire::kAbortTag;

// `bad_link` (a protocol error) fails with InvalidPayload(bad_message) instead; it is marked under the same
// ordering as the others, after aborted() turned true, so whoever sees the failure also sees the abort.
void TcpTransport::abortJob(const std::string& reason, Link* bad_link, const std::string& bad_message) {
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
    bad_link->notifyWaiters();
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
    lp->notifyWaiters();
  }
  pacer_.dropAll(links_);
  if (io_started_) asio::post(io_, [this] { sendAbortNotices(); });
}

// Tells every peer why, then closes every connection after a short grace: a peer whose connection cannot take the
// notice (a frame half written, a stopped peer) sees the connection end instead, which fails it just the same.
void TcpTransport::sendAbortNotices() {
  if (notices_queued_) return;
  notices_queued_ = true;
  std::string reason;
  {
    std::lock_guard lock(abort_mutex_);
    reason = abort_reason_;
  }
  watchIdleLinks();  // read on, callers' links too: what follows may be notices
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

void TcpTransport::protocolError(Link& l, const std::string& what) {
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

}  // namespace terse::comm::tcp
