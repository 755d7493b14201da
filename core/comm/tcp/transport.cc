// The tcp transport's life (transport.h): the object and its threads, setup of the full mesh through the connector
// (connect.h) up to the point where every link reads, and the orderly end.
#include <sys/eventfd.h>

#include <algorithm>
#include <charconv>
#include <future>
#include <thread>

#include "core/comm/tcp/transport_detail.h"
#include "core/comm/tcp/wire.h"

namespace terse::comm {
namespace tcp {

using tcp_wire::kByeTag;

TcpTransport::TcpTransport(const TcpOptions& options, const JobToken& token)
    : options_(options),
      token_(token),
      n_(options.world_size),
      rank_(options.rank),
      label_(options.host_label.empty() ? asio::ip::host_name() : options.host_label),
      who_("rank " + std::to_string(options.rank) + " (host " + label_ + ")"),
      emulated_(options.emulation.enabled()),
      busy_poll_(std::chrono::microseconds(resolveBusyPollUs(options, processEnv()))),
      caller_reads_(resolveCallerReads(options, processEnv())),
      caller_spin_(std::chrono::microseconds(resolveCallerSpinUs(options, processEnv()))),
      caller_frame_bytes_(caller_spin_ > Clock::duration::zero() ? kSpinningCallerFrameBytes : kCallerFrameBytes),
      counter_(options.rank),
      connector_(io_, options_, token_, label_, who_, links_),
      heartbeat_(io_),
      abort_grace_(io_),
      write_grace_(io_),
      caller_tick_(io_),
      heartbeat_period_(std::max<Clock::duration>(options.timeout / 4, std::chrono::milliseconds(1))),
      liveness_tick_(
          std::max<Clock::duration>(options.timeout / kLivenessTicksPerTimeout, std::chrono::milliseconds(1))),
      ingress_(options.emulation.nic_ingress_bps),
      pacer_(options.emulation) {
  links_.resize(static_cast<std::size_t>(n_));
  auto self = std::make_shared<Link>();
  self->peer = rank_;
  self->who = who_;
  links_[static_cast<std::size_t>(rank_)] = std::move(self);
}

void TcpTransport::connect(Store& store) {
  const Clock::time_point begin = Clock::now();
  const Clock::time_point deadline = begin + options_.timeout;
  if (n_ == 1) return;  // frames to itself cross no socket and are not emulated

  const std::string published = connector_.listen();
  work_.emplace(io_.get_executor());
  io_thread_ = std::thread([this] { runIo(); });
  io_started_ = true;
  startBulkWriter();
  connector_.meet(store, published, deadline);

  // Settle on the io thread: what registered by now is final.
  std::vector<int> missing;
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
  if (!missing.empty()) TERSE_THROW(CommError, connector_.failure(store, missing, Clock::now() - begin));
  // The pacer walks every link: it starts once they all exist.
  if (emulated_) pacer_.start(links_, [this](Link& l) { asio::post(io_, [this, link = &l] { pump(*link); }); });
}

void TcpTransport::runIo() {
  if (busy_poll_ <= Clock::duration::zero()) {
    io_.run();
    return;
  }
  // run_one blocks in epoll (or on a timer) as run() does; after a handler ran, the next frame usually follows within
  // microseconds (the peer's next ring step, the answer to what was just sent), so the loop polls -- epoll with no
  // timeout -- instead of sleeping, until busy_poll_ has passed without a handler. Timers are due in either. stop()
  // (shutdown) ends both: run_one then returns 0, and poll does too with stopped() set.
  while (io_.run_one() != 0) {
    Clock::time_point last = Clock::now();
    for (;;) {
      if (io_.poll() != 0) {
        last = Clock::now();
      } else if (io_.stopped() || Clock::now() - last >= busy_poll_) {
        break;
      } else {
        cpuRelax();
      }
    }
  }
}

// Runs on the io thread once every link is up: nothing was read from an established link before.
void TcpTransport::startLinks() {
  connector_.closeListener();
  const Clock::time_point now = Clock::now();
  for (auto& lp : links_) {
    Link& l = *lp;
    if (!l.socket) continue;
    l.last_heard = now;
    l.last_sent = now;
    l.reading = true;
    l.raw_fd = l.socket->native_handle();
    l.protocol = l.socket->local_endpoint().protocol();
    if (!emulated_) {
      // From now on a caller may write on an idle link itself (requests.cc), and read it (caller_read.cc); emulated
      // frames go through the pacer, and their delivery times through the io thread.
      const int wake = caller_reads_ ? ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) : -1;
      std::lock_guard lock(l.mutex);
      l.fd = l.socket->native_handle();
      l.wake_fd = wake;
      l.callers_may_read = wake >= 0;  // without an eventfd (out of descriptors), the io thread reads, as it can
    }
    readHeader(l);
    pump(l);
  }
  armHeartbeat(now + liveness_tick_);
}

// Goodbye to every peer (so its end of file is not taken for a crash), then wait, bounded, until every peer answered
// with its own end of file, and stop the threads.
void TcpTransport::shutdown() {
  stopping_.store(true);
  // No caller reads from now on (a reading one is woken and gives its link back): the io thread reads on to every
  // peer's goodbye, and this object may go once it has closed the links.
  for (auto& lp : links_) {
    if (!lp) continue;
    {
      std::lock_guard lock(lp->mutex);
      lp->callers_may_read = false;
    }
    lp->notifyWaiters();
  }
  if (io_started_) {
    asio::post(io_, [this] {
      watchIdleLinks();
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
      connector_.closeListener();
      heartbeat_.cancel();
      abort_grace_.cancel();
      write_grace_.cancel();
      caller_tick_.cancel();
      for (auto& lp : links_)
        if (lp) closeLink(*lp);
      work_.reset();
      // Handlers still pending (retry and handshake timers, operations on closed sockets) are dropped, not run: the
      // buffers they could touch are released below.
      io_.stop();
    });
    io_thread_.join();
    stopBulkWriter();
    for (auto& lp : links_)
      if (lp) lp->socket.reset();  // a socket must not outlive its io_context; requests may keep the link
  }
  pacer_.stop();
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
    lp->notifyWaiters();
  }
}

}  // namespace tcp

namespace {

// A budget in microseconds from `name`'s value, or from `option` when that is set (>= 0); `fallback` when neither is.
int resolveMicroseconds(int option, const char* field, const char* name, const EnvLookup& env, int fallback,
                        const char* meaning) {
  return resolveSpinMicroseconds(option, "tcp transport", field, name, env, fallback, meaning);
}

}  // namespace

int resolveBusyPollUs(const TcpOptions& options, const EnvLookup& env) {
  const int us = resolveMicroseconds(options.busy_poll_us, "busy_poll_us", "TERSE_TCP_BUSY_POLL_US", env, 0,
                                     "microseconds to spin before sleeping");
  // Emulated links take their times from the pacer: spinning would only burn CPU (the variable is checked first, so a
  // bad value is reported there too).
  return options.emulation.enabled() ? 0 : us;
}

int resolveCallerSpinUs(const TcpOptions& options, const EnvLookup& env) {
  const int us = resolveMicroseconds(options.caller_spin_us, "caller_spin_us", "TERSE_TCP_CALLER_SPIN_US", env,
                                     kDefaultCallerSpinUs, "microseconds a reading caller retries before sleeping");
  // Emulated links have no caller reads (the variable is checked first, so a bad value is reported there too).
  return options.emulation.enabled() ? 0 : us;
}

bool resolveCallerReads(const TcpOptions& options, const EnvLookup& env) {
  TERSE_CHECK(options.caller_reads >= -1 && options.caller_reads <= 1, InvalidArgument,
              "tcp transport: caller_reads must be -1 (unset), 0 (off) or 1 (on), got " << options.caller_reads);
  bool on = options.caller_reads != 0;
  if (options.caller_reads < 0) {
    if (const auto text = env("TERSE_TCP_CALLER_READS")) {
      TERSE_CHECK(*text == "0" || *text == "1", InvalidArgument,
                  "TERSE_TCP_CALLER_READS='" << *text << "': expected 0 (the io thread reads every frame) or 1");
      on = *text == "1";
    }
  }
  // Emulated links deliver at times the io thread computes (the receiver's ingress port).
  return on && !options.emulation.enabled();
}

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
  auto t = std::make_unique<tcp::TcpTransport>(options, token);
  t->connect(store);
  return t;
}

}  // namespace terse::comm
