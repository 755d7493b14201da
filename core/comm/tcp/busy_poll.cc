// The tcp transport's busy-poll budget (transport.h, "Busy polling"): the automatic rule, how an option, the
// environment and the rule combine, and the CPUs this process may use (affinity mask and cgroup CPU quota).
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "core/comm/job.h"
#include "core/comm/tcp/transport.h"
#include "core/common/error.h"

namespace terse::comm {

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

}  // namespace terse::comm
