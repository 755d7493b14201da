// Running one conformance check (check_runner.h): in process with every exception caught, or in a forked child whose
// result comes back over a pipe, so that a segfault, an abort or an endless loop inside a plugin is one FAIL line.
#include "core/conformance/check_runner.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/syscall.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/common/subprocess.h"
#include "core/common/watchdog.h"
#include "core/conformance/message.h"

namespace terse::conformance {
namespace {

// ---- The child's report: a flat byte string, written once and read to EOF. Both ends are this binary, so host byte
// order and memcpy of trivially copyable structs are the format.

static_assert(std::is_trivially_copyable_v<CompressorCaps> && std::is_trivially_copyable_v<ConformanceShape>);

class Writer {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void putString(std::string_view s) {
    put<uint64_t>(s.size());
    out_.append(s);
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

// Every read is checked: a child that died halfway leaves a truncated report, which must read as "no result".
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <class T>
  bool get(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (in_.size() - at_ < sizeof v) return false;
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return true;
  }
  bool getString(std::string& s) {
    uint64_t n = 0;
    if (!get(n) || in_.size() - at_ < n) return false;
    s.assign(in_.data() + at_, static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return true;
  }
  bool atEnd() const { return at_ == in_.size(); }

 private:
  std::string_view in_;
  std::size_t at_ = 0;
};

// What a report is: the check's Outcome with the context it leaves, or the child's word that the time limit passed
// (only a message: the check is still running, so its context is neither finished nor safe to read).
enum class ReportKind : uint8_t { kOutcome = 0, kTimeLimit = 1 };

// How long the parent waits past the time limit for the child's own report of it before killing the child without
// one. The child's watch thread wakes at the limit and writes a few hundred bytes; a loaded 2-core machine runs it
// within milliseconds, so the wait is slack for a child that cannot report at all (stopped, or its plugin holding the
// allocator's lock).
constexpr double kTimeLimitReportGraceS = 2;

std::string timeLimitText(double timeout_s) {
  return cat("did not finish within the time limit of ", timeout_s,
             " s per check (ConformanceOptions::check_timeout_s, --check-timeout) and was stopped");
}

// Which plugin call the check's thread was in when the limit passed, from the plugin-call watchdog's marks (every call
// the core makes into a plugin sets them: core/common/watchdog.h): "decompress of tensor 12 (round 0, rank 1)".
std::string callText(const watchdog::CallView& v) {
  std::string out = v.call;
  if (v.tensor != watchdog::kNoTensor) out += cat(" of tensor ", v.tensor);
  std::string where;
  if (v.round >= 0) where = cat("round ", v.round);
  if (v.rank >= 0) where += cat(where.empty() ? "" : ", ", "rank ", v.rank);
  return where.empty() ? out : cat(out, " (", where, ")");
}

std::string timeLimitReport(double timeout_s, const watchdog::CallView& v) {
  std::string why;
  if (v.call == nullptr) {
    why = "it had made no plugin call";
  } else if (v.in_call) {
    why = cat("it was inside the plugin's ", callText(v), ", which had not returned");
  } else {
    why = cat("it was not inside a plugin call (the last one, ", callText(v), ", had returned)");
  }
  Writer w;
  w.put(ReportKind::kTimeLimit);
  w.putString(cat(timeLimitText(timeout_s), "; when the limit passed, ", why));
  return w.bytes();
}

std::string encode(const Outcome& o, const Context& ctx) {
  Writer w;
  w.put(ReportKind::kOutcome);
  w.put(static_cast<uint8_t>(o.status));
  w.putString(o.message);
  w.put(static_cast<uint8_t>(ctx.instantiated));
  w.put(ctx.caps);
  w.put<uint64_t>(ctx.shapes.size());
  for (const auto& s : ctx.shapes) w.put(s);
  w.put<uint64_t>(ctx.round_trip_error.size());
  for (const auto& [label, e] : ctx.round_trip_error) {
    w.putString(label);
    w.put(e);
  }
  w.put(ctx.next_tensor_id);
  return w.bytes();
}

// Applies the report to ctx only when all of it reads back; a time limit's report applies nothing.
bool decode(std::string_view bytes, Outcome& o, Context& ctx) {
  Reader r(bytes);
  ReportKind kind = ReportKind::kOutcome;
  if (!r.get(kind)) return false;
  if (kind == ReportKind::kTimeLimit) {
    std::string message;
    if (!r.getString(message) || !r.atEnd()) return false;
    o = fail(std::move(message));
    return true;
  }
  if (kind != ReportKind::kOutcome) return false;
  uint8_t status = 0, instantiated = 0;
  CompressorCaps caps;
  uint64_t count = 0, next_id = 0;
  std::vector<ConformanceShape> shapes;
  std::map<std::string, double> errors;
  if (!r.get(status) || status > static_cast<uint8_t>(CheckStatus::kSkip) || !r.getString(o.message) ||
      !r.get(instantiated) || !r.get(caps) || !r.get(count)) {
    return false;
  }
  for (uint64_t i = 0; i < count; ++i) {
    ConformanceShape s;
    if (!r.get(s)) return false;
    shapes.push_back(s);
  }
  if (!r.get(count)) return false;
  for (uint64_t i = 0; i < count; ++i) {
    std::string label;
    double e = 0;
    if (!r.getString(label) || !r.get(e)) return false;
    errors[label] = e;
  }
  if (!r.get(next_id) || !r.atEnd()) return false;
  o.status = static_cast<CheckStatus>(status);
  ctx.instantiated = instantiated != 0;
  ctx.caps = caps;
  ctx.shapes = std::move(shapes);
  ctx.round_trip_error = std::move(errors);
  ctx.next_tensor_id = next_id;
  return true;
}

// The child's side of the time limit. A hung check cannot say where it hangs, and the parent cannot look into the
// child's memory, so a thread of the child's own waits out the limit beside the check and, when it passes first, reads
// which plugin call the check's thread is in from the watchdog's marks, sends that as the report and ends the process.
// Whichever of the two claims the pipe first writes to it; the other writes nothing.
class TimeLimitWatch {
 public:
  TimeLimitWatch(double timeout_s, int fd) : check_thread_(static_cast<pid_t>(::syscall(SYS_gettid))) {
    if (timeout_s <= 0) return;
    try {
      thread_ = std::thread([this, timeout_s, fd] { watch(timeout_s, fd); });
    } catch (const std::system_error&) {
      // No thread (a process at its limit): the parent's deadline ends a hung check and says it could not be named.
    }
  }
  TimeLimitWatch(const TimeLimitWatch&) = delete;
  TimeLimitWatch& operator=(const TimeLimitWatch&) = delete;

  // Called by the check's thread when the check is over: returns once the pipe is the caller's. When the watch has
  // claimed it, never returns (the watch ends the process once its report is out).
  void claim() {
    {
      std::unique_lock lock(mutex_);
      if (owner_ == Owner::kWatch) {
        lock.unlock();
        for (;;) ::pause();
      }
      owner_ = Owner::kCheck;
    }
    done_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  // The watch's thread: the report of the call in progress, if the check has not claimed the pipe by the limit.
  void watch(double timeout_s, int fd) {
    std::unique_lock lock(mutex_);
    const auto limit = std::chrono::duration<double>(timeout_s);
    if (done_.wait_for(lock, limit, [this] { return owner_ != Owner::kNone; })) return;
    owner_ = Owner::kWatch;
    lock.unlock();
    try {
      writeAll(fd, timeLimitReport(timeout_s, watchdog::callOfThread(check_thread_)));
    } catch (const std::exception&) {
      // No report: the parent's deadline ends the child and says so.
    }
    ::close(fd);
    // The plugin's output so far goes out; a flush that blocks (the hung thread holds a stream's lock) is ended by
    // the parent's deadline, which keeps this report (runCheckInChild).
    std::fflush(nullptr);
    ::_exit(0);
  }

  enum class Owner { kNone, kCheck, kWatch };
  const pid_t check_thread_;
  std::mutex mutex_;
  std::condition_variable done_;
  Owner owner_ = Owner::kNone;
  std::thread thread_;
};

[[noreturn]] void childMain(CheckFn fn, Context& ctx, int fd, double timeout_s) {
  TimeLimitWatch watch(timeout_s, fd);
  Outcome o{CheckStatus::kFail, {}};
  bool ready = true;
  if (ctx.instantiated && !ctx.instance) {
    // The same call instantiate made; a plugin whose init succeeds once and then fails is a FAIL of this check.
    try {
      ctx.instance = ctx.plugin.instantiate(ctx.params);
    } catch (const std::exception& e) {
      o.message = cat("instantiating the plugin again in the check's process failed: ", e.what());
      ready = false;
    }
  }
  if (ready) o = runCheckInProcess(fn, ctx);
  watch.claim();
  writeAll(fd, encode(o, ctx));
  ::close(fd);
  // Whatever the plugin printed goes out; _exit skips atexit handlers and static destructors, which belong to the
  // parent (a gtest or CLI main) and must run once, there.
  std::fflush(nullptr);
  ::_exit(0);
}

}  // namespace

Outcome runCheckInProcess(CheckFn fn, Context& ctx) {
  Outcome o{CheckStatus::kFail, {}};
  try {
    o = fn(ctx);
  } catch (const Violation& v) {
    o.message = v.what();
  } catch (const Error& e) {
    o.message = e.what();
  } catch (const std::exception& e) {
    o.message = cat("unexpected exception: ", e.what());
  } catch (...) {
    o.message = "unexpected exception of unknown type";
  }
  ctx.instantiated = ctx.instance != nullptr;
  return o;
}

Outcome runCheckInChild(CheckFn fn, Context& ctx, double timeout_s) {
  const ForkedChild child = forkWithPipe("conformance: a check's child process",
                                         [&](int write_fd) { childMain(fn, ctx, write_fd, timeout_s); });
  const pid_t pid = child.pid;
  const int fd = child.read_fd;

  // The child reports its own time limit, naming the call it was in (TimeLimitWatch); this deadline, later by the
  // grace, ends a child that could not.
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                           timeout_s > 0 ? timeout_s + kTimeLimitReportGraceS : 0.0));
  std::string report;
  bool timed_out = false;
  char buffer[1 << 16];
  for (;;) {
    int wait_ms = -1;
    if (timeout_s > 0) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        timed_out = true;
        break;
      }
      wait_ms = static_cast<int>(std::min<long long>(left, 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the loop head sees the deadline
    if (ready < 0) break;
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child closed its end, by finishing or by dying
    report.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  // A child that closed its end is leaving; one that does not leave by the deadline (its time-limit report is out,
  // but its flush waits on a stream the hung check holds) is ended too, and its report read as written: a hung plugin
  // must never hang the suite.
  bool lingered = false;
  for (;;) {
    const bool bounded = timeout_s > 0 && !timed_out && !lingered;
    const pid_t r = ::waitpid(pid, &status, bounded ? WNOHANG : 0);
    if (r < 0 && errno == EINTR) continue;
    if (r != 0) break;
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      lingered = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  Outcome o{CheckStatus::kFail, {}};
  if (timed_out) {
    o.message = cat(timeLimitText(timeout_s), "; its process did not say which plugin call it was in within ",
                    kTimeLimitReportGraceS, " s more");
  } else if (lingered) {
    if (!decode(report, o, ctx)) {
      o = Outcome{CheckStatus::kFail, cat(timeLimitText(timeout_s),
                                          "; its process closed its report unfinished and "
                                          "did not exit, so it was ended")};
    }
  } else if (WIFSIGNALED(status)) {
    o.message = cat("crashed with ", signalText(WTERMSIG(status)),
                    " (the check ran in a process of its own; the other checks are unaffected)");
  } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0 && decode(report, o, ctx))) {
    o.message = cat("the check's process exited with status ", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                    " before reporting a result (a sanitizer's report or the plugin's own message above says why)");
  }
  return o;
}

}  // namespace terse::conformance
