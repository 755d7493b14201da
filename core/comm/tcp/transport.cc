// The tcp transport's life (transport.h): the object and its threads, setup of the full mesh through the connector
// (connect.h) up to the point where every link reads, and the orderly end.
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <functional>
#include <future>
#include <optional>
#include <string_view>
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
      busy_poll_(std::chrono::microseconds(resolveBusyPollUs(options, processEnv(), usableCpuCount()))),
      counter_(options.rank),
      connector_(io_, options_, token_, label_, who_, links_),
      heartbeat_(io_),
      abort_grace_(io_),
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
    if (!emulated_) {
      // From now on a caller may write on an idle link itself (requests.cc); emulated frames go through the pacer.
      std::lock_guard lock(l.mutex);
      l.fd = l.socket->native_handle();
    }
    readHeader(l);
    pump(l);
  }
  armHeartbeat();
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
      connector_.closeListener();
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

int autoBusyPollUs(int cpus, int local_ranks) {
  // Every rank spins two threads while it waits (a request's caller and the io thread). A spinner that shares its CPU
  // delays the thread it waits for by a whole time slice (milliseconds, where the spin saves microseconds), so each
  // needs a CPU of its own; and the ranks' other threads (compute, a trainer's workers, the OS) need as many again,
  // or spinning steals from them what it saves in wake-ups: 2 CPUs x 2 spinners x local ranks. On the 16-core machine
  // of issue 22 that admits up to 4 ranks; on 2 CPUs none.
  return cpus >= 4 * std::max(local_ranks, 1) ? kAutoBusyPollUs : 0;
}

int resolveBusyPollUs(const TcpOptions& options, const EnvLookup& env, int cpus) {
  TERSE_CHECK(options.busy_poll_us >= -1 && options.busy_poll_us <= kMaxBusyPollUs, InvalidArgument,
              "tcp transport: busy_poll_us must be -1 (automatic), 0 (off) or 1.."
                  << kMaxBusyPollUs << " microseconds, got " << options.busy_poll_us);
  TERSE_CHECK(options.local_ranks >= 0, InvalidArgument,
              "tcp transport: local_ranks must be >= 0 (0 = from the job's environment), got " << options.local_ranks);
  int us = options.busy_poll_us;
  if (us < 0) {
    if (const auto text = env("TERSE_TCP_BUSY_POLL_US")) {
      int64_t v = 0;
      const char* end = text->data() + text->size();
      const auto [ptr, ec] = std::from_chars(text->data(), end, v);
      TERSE_CHECK(!text->empty() && ec == std::errc() && ptr == end && v >= -1 && v <= kMaxBusyPollUs, InvalidArgument,
                  "TERSE_TCP_BUSY_POLL_US='" << *text << "': expected -1 (automatic), 0 (off) or 1.." << kMaxBusyPollUs
                                             << " (microseconds to spin before sleeping)");
      us = static_cast<int>(v);
    }
  }
  // Emulated links take their times from the pacer: spinning would only burn CPU (and the env var is checked first,
  // so a bad value is reported there too).
  if (options.emulation.enabled()) return 0;
  if (us >= 0) return us;
  int local = options.local_ranks;
  if (local == 0) {
    const std::optional<JobEnv> job = detectJobEnv(env);
    local = job ? job->local_world_size : 1;
  }
  return autoBusyPollUs(cpus, local);
}

int quotaCpus(int64_t quota_us, int64_t period_us) {
  if (quota_us <= 0 || period_us <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((quota_us + period_us - 1) / period_us, 1 << 20));
}

namespace {

std::optional<std::string> cgroupReadLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text;
  std::getline(in, text);
  return text;
}

std::optional<int64_t> cgroupNumber(std::string_view text) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

// The tightest CPU quota on the way from this process's cgroup up to the root of the hierarchy mounted at `mount`
// (a container usually sees its own cgroup as that root); 0 for none. `read(dir)` gives the (quota, period) of one
// cgroup directory, if it sets one.
int cgroupTightestQuota(const std::string& mount, std::string path,
                        const std::function<std::optional<std::pair<int64_t, int64_t>>(const std::string&)>& read) {
  int best = 0;
  for (;;) {
    if (const auto q = read(mount + path)) {
      const int cpus = quotaCpus(q->first, q->second);
      if (cpus > 0) best = best == 0 ? cpus : std::min(best, cpus);
    }
    if (path.empty() || path == "/") break;
    const auto slash = path.rfind('/');
    path = slash == std::string::npos ? std::string() : path.substr(0, slash);
  }
  return best;
}

}  // namespace

int cgroupCpuQuota(const std::string& cgroup_file, const std::string& cgroup_root) {
  std::ifstream in(cgroup_file);
  std::string line;
  int best = 0;
  const auto tighter = [&](int cpus) {
    if (cpus > 0) best = best == 0 ? cpus : std::min(best, cpus);
  };
  while (std::getline(in, line)) {
    const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      tighter(cgroupTightestQuota(cgroup_root, path, [](const std::string& dir) {
        std::optional<std::pair<int64_t, int64_t>> q;
        if (const auto text = cgroupReadLine(dir + "/cpu.max")) {
          const auto space = text->find(' ');
          const auto quota = cgroupNumber(std::string_view(*text).substr(0, space));
          const auto period =
              space == std::string::npos ? std::nullopt : cgroupNumber(std::string_view(*text).substr(space + 1));
          if (quota && period) q.emplace(*quota, *period);  // "max" parses as no quota
        }
        return q;
      }));
      continue;
    }
    std::string_view rest = controllers;
    bool has_cpu = false;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      has_cpu = has_cpu || rest.substr(0, comma) == "cpu";
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    if (!has_cpu) continue;
    for (const std::string& mount : {cgroup_root + "/cpu", cgroup_root + "/" + controllers}) {
      tighter(cgroupTightestQuota(mount, path, [](const std::string& dir) {
        std::optional<std::pair<int64_t, int64_t>> q;
        const auto quota = cgroupReadLine(dir + "/cpu.cfs_quota_us");
        const auto period = cgroupReadLine(dir + "/cpu.cfs_period_us");
        const auto qv = quota ? cgroupNumber(*quota) : std::nullopt;
        const auto pv = period ? cgroupNumber(*period) : std::nullopt;
        if (qv && pv) q.emplace(*qv, *pv);
        return q;
      }));
    }
  }
  return best;
}

int usableCpuCount() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  const int quota = cgroupCpuQuota("/proc/self/cgroup", "/sys/fs/cgroup");
  if (quota > 0) cpus = std::min(cpus, quota);
  return std::max(cpus, 1);
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
