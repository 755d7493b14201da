// Liveness of the tcp transport's links (transport.h, "Liveness"): heartbeats on idle connections, a silent peer
// declared dead after the timeout, an end of file told apart from the goodbye of an orderly end, and what a lost link
// fails -- the job, or only the operations with an expendable peer.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "core/comm/tcp/transport_detail.h"
#include "core/comm/tcp/wire.h"
#include "core/common/log.h"

namespace terse::comm::tcp {

using asio::ip::tcp;
using tcp_wire::kAbortTag;
using tcp_wire::kByeTag;
using tcp_wire::kHeartbeatTag;

void TcpTransport::armHeartbeat(Clock::time_point at) {
  heartbeat_.expires_at(at);
  heartbeat_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_.load()) return;
    const Clock::time_point now = Clock::now();
    // The next tick, or sooner: the moment the first link's silence would pass the timeout. A silent peer is declared
    // dead at the timeout itself, not up to a tick after it, so the tick's granularity no longer eats into the margin
    // left for the abort to travel and the ranks to exit (transport.h, "Liveness").
    Clock::time_point next = now + liveness_tick_;
    for (auto& lp : links_) {
      Link& l = *lp;
      if (!l.socket || l.closed || l.read_closed) continue;
      bool parked = false;
      {
        std::lock_guard lock(l.mutex);
        parked = l.parked;
      }
      // A parked link is silent because this rank stopped reading it, not because the peer did; a caller may have
      // read the link meanwhile (caller_read.cc).
      if (parked) l.last_heard = now;
      l.last_heard = std::max(l.last_heard, Clock::time_point(Clock::duration(l.caller_heard.load())));
      if (!l.peer_left && !aborted_.load() && now - l.last_heard > options_.timeout) {
        linkFailed(l, "has sent nothing for " + secondsText(now - l.last_heard) + " (heartbeat timeout " +
                          secondsText(options_.timeout) + "): the process is stopped, hung or unreachable");
        continue;
      }
      // The check above is strict: one microsecond past the timeout is the first moment it can hold.
      if (!l.peer_left && !aborted_.load())
        next = std::min(next, l.last_heard + options_.timeout + std::chrono::microseconds(1));
      bool writing = false;
      {
        std::lock_guard lock(l.mutex);
        writing = l.writing;
      }
      const Clock::time_point sent = std::max(l.last_sent, Clock::time_point(Clock::duration(l.direct_sent.load())));
      if (!writing && !l.write_shut && !l.bye_queued && now - sent >= heartbeat_period_)
        queueControl(l, kHeartbeatTag, {});
    }
    // Never sooner than a millisecond from now: a deadline just missed must not spin the io thread.
    armHeartbeat(std::max(next, now + std::chrono::milliseconds(1)));
  });
}

void TcpTransport::handleControl(Link& l) {
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
      l.notifyWaiters();
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

void TcpTransport::readFailed(Link& l, const boost::system::error_code& ec) {
  {
    std::lock_guard lock(l.mutex);
    if (l.cur_recv) l.cur_recv->io_active = false;
  }
  l.notifyWaiters();
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
void TcpTransport::linkFailed(Link& l, const std::string& what) {
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
    l.notifyWaiters();
    pacer_.drop(l);
    return;
  }
  abortJob(who_ + ": " + l.who + " " + what);
}

// How long a link whose write failed is read on before the write's error fails it. Its reader usually settles it at
// once: a killed peer's reset or end of file, or an aborted peer's notice, is already in the socket when the write
// fails. The grace covers what the reader may have to get through first (a parked frame, staged now; frames the peer
// sent before its notice, at most a socket buffer), and is short beside any timeout a job sets.
constexpr auto kWriteGrace = std::chrono::milliseconds(100);

// A failed write does not yet say whose fault it was. A peer that aborts sends its notice and then closes its
// connections, and a connection closed with our bytes unread in its socket is reset: the notice is in this rank's
// socket when the write fails, but Asio runs a socket's write completions ahead of its read completions, so reported
// at once the reset would blame the peer that was only passing the news on -- a 5-rank fault test named the wrong rank
// that way, about once in a few hundred runs. So nothing more is written and the link is read on: the notice aborts the
// job with its own reason, an end of file or error fails the link as it fails a read, and only if the reader meets
// neither within kWriteGrace does the write's error fail it.
void TcpTransport::writeFailed(Link& l, const std::string& what) {
  if (l.closed || l.write_failed) return;
  l.write_failed = true;
  // Nothing to wait for: the peer said goodbye, this rank is leaving or already aborted, or nobody reads the link.
  if (l.peer_left || stopping_.load() || aborted_.load() || l.read_closed || !l.reading) return linkFailed(l, what);
  readOn(l);
  if (l.closed) return;  // the reader got there first (readOn may read at once)
  failed_writes_.push_back(FailedWrite{&l, what, Clock::now() + kWriteGrace});
  if (failed_writes_.size() == 1) failLateWrites();
}

// Fails each link whose grace ended and whose reader did not fail it first, and waits for the next deadline.
void TcpTransport::failLateWrites() {
  const Clock::time_point now = Clock::now();
  while (!failed_writes_.empty() && failed_writes_.front().deadline <= now) {
    FailedWrite f = std::move(failed_writes_.front());
    failed_writes_.pop_front();
    if (!f.link->closed) linkFailed(*f.link, f.what);
  }
  if (failed_writes_.empty()) return;
  write_grace_.expires_at(failed_writes_.front().deadline);
  write_grace_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) failLateWrites();
  });
}

void TcpTransport::markReadClosed(Link& l) {
  {
    std::lock_guard lock(life_mutex_);
    l.read_closed = true;
  }
  life_cv_.notify_all();
}

void TcpTransport::closeLink(Link& l) {
  if (l.closed || !l.socket) return;
  l.closed = true;
  {
    // A caller's direct write (non-blocking, so brief) and a reading caller (woken: it gives the link back) must not
    // see their descriptor closed and perhaps reused.
    std::unique_lock lock(l.mutex);
    l.callers_may_read = false;
    if (l.reader == Link::Reader::kCaller) {
      lock.unlock();
      l.notifyWaiters();
      lock.lock();
    }
    l.cv.wait(lock, [&] { return !l.direct && l.reader != Link::Reader::kCaller; });
    l.fd = -1;
  }
  boost::system::error_code ignored;
  if (l.unwatched) {
    // Out of the epoll set (caller reads): the socket object no longer owns the descriptor.
    ::shutdown(l.raw_fd, SHUT_RDWR);
    ::close(l.raw_fd);
    l.unwatched = false;
  } else {
    l.socket->shutdown(tcp::socket::shutdown_both, ignored);
    l.socket->close(ignored);
  }
  l.raw_fd = -1;
  {
    std::lock_guard lock(life_mutex_);
    l.read_closed = true;
  }
  life_cv_.notify_all();
}

}  // namespace terse::comm::tcp
