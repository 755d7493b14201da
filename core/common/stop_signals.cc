#include "core/common/stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <mutex>
#include <thread>

#include "core/common/error.h"

namespace terse::stop {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr auto kSigintOwnGrace = std::chrono::seconds(2);
// Those of kSignals this process takes: not one it was started with ignored (nohup's SIGHUP, a shell's SIGINT for a
// background job), which the user meant to have no effect. Set by install() before the waiter starts.
bool g_taken[std::size(kSignals)] = {};

std::atomic<bool> g_install_called{false};
std::atomic<bool> g_installed{false};  // published once the set, the waiter and the handler are in place
std::atomic<int> g_received{0};
std::atomic<pid_t> g_waiter_tid{0};
// Set once by install(), before the waiter starts; never destroyed, since the waiter may still run during exit().
const std::function<void(int)>* g_record = nullptr;

// The one Delegate alive (the PyTorch driver, a simulation's process), and whether its owner is done with it.
std::mutex g_delegate_mutex;
std::condition_variable g_delegate_done;
pid_t g_delegate_pid = 0;  // 0: none, or its child has ended
bool g_delegate_alive = false;

sigset_t stopSet() {
  sigset_t set;
  sigemptyset(&set);
  for (std::size_t i = 0; i < std::size(kSignals); ++i)
    if (g_taken[i]) sigaddset(&set, kSignals[i]);
  return set;
}

// On a thread that did not block the signals (one started before install()): the signal is the waiter's.
void forward(int sig) {
  const int saved_errno = errno;
  const pid_t tid = g_waiter_tid.load(std::memory_order_acquire);
  if (tid != 0) ::syscall(SYS_tgkill, ::getpid(), tid, sig);
  errno = saved_errno;
}

void say(const std::string& line) {
  std::fflush(nullptr);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

// Whether a second SIGINT or SIGTERM has come (taken here, so it is not left pending). The signals stay blocked in
// every thread of this process: only this thread can see them, and it does so between the slices of its waits. A
// SIGHUP is taken and dropped: a closed terminal sends it twice within milliseconds (the shell to its jobs, the kernel
// to the foreground group), which is no user asking twice.
bool secondSignal() {
  const sigset_t set = stopSet();
  const timespec now{};
  for (;;) {
    const int sig = ::sigtimedwait(&set, nullptr, &now);
    if (sig <= 0) return false;
    if (sig != SIGHUP) return true;
  }
}

enum class Wait { kOwnerDone, kTimedOut, kSecondSignal };

// Waits up to `limit` for the Delegate's owner to be done with it, or for a second stop signal: the user who presses
// Ctrl-C again, or a scheduler's repeated SIGTERM, wants the process ended now rather than after the grace.
Wait waitForOwner(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds limit) {
  constexpr std::chrono::milliseconds kSlice{100};
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (g_delegate_done.wait_for(lock, std::min(kSlice, std::max(left, std::chrono::milliseconds(0))),
                                 [] { return !g_delegate_alive; }))
      return Wait::kOwnerDone;
    if (secondSignal()) return Wait::kSecondSignal;
    if (std::chrono::steady_clock::now() >= deadline) return Wait::kTimedOut;
  }
}

// Step 2 (stop_signals.h): the child that keeps the folder gets the signal, and its owner the grace to settle it.
void handOverToDelegate(int sig) {
  std::unique_lock lock(g_delegate_mutex);
  if (!g_delegate_alive) return;
  // Ctrl-C reaches the child's whole process group from the terminal itself, and the PyTorch driver, interrupted,
  // ends its ranks (it ignores SIGINT from then on: a second one would break that off). So SIGINT is passed on only to
  // a child still there after kSigintOwnGrace: one sent to this process alone.
  Wait waited = sig == SIGINT ? waitForOwner(lock, kSigintOwnGrace) : Wait::kTimedOut;
  if (waited == Wait::kTimedOut) {
    if (g_delegate_pid != 0) ::kill(g_delegate_pid, sig);
    waited = waitForOwner(lock, kDelegateGrace);
  }
  if (waited == Wait::kOwnerDone) return;
  say(waited == Wait::kSecondSignal
          ? std::string("terse: a second stop signal: not waiting for the child process; killing it\n")
          : "terse: the child process still runs " + std::to_string(kDelegateGrace.count()) + " s after " +
                signalName(sig) + "; killing it\n");
  if (g_delegate_pid != 0) ::kill(g_delegate_pid, SIGKILL);
  // Its owner settles the folder once it sees the child gone; record() marks it failed should the owner not get to.
  if (waited == Wait::kSecondSignal) g_delegate_done.wait_for(lock, kSigintOwnGrace, [] { return !g_delegate_alive; });
}

[[noreturn]] void endBy(int sig) {
  std::fflush(nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  // Pending first, then unblocked on this thread: the default action ends the whole process.
  ::raise(sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  // Not reached; should the signal not end the process, the status a shell would have seen.
  ::_exit(128 + sig);
}

void waiterLoop() {
  g_waiter_tid.store(static_cast<pid_t>(::syscall(SYS_gettid)), std::memory_order_release);
  const sigset_t set = stopSet();
  int sig = 0;
  while (::sigwait(&set, &sig) != 0 || sig == 0) {
  }
  g_received.store(sig, std::memory_order_release);
  handOverToDelegate(sig);
  try {
    (*g_record)(sig);
  } catch (const std::exception& e) {
    say(std::string("terse: recording the stop by ") + signalName(sig) + " failed: " + e.what() + "\n");
  }
  endBy(sig);
}

}  // namespace

void install(std::function<void(int sig)> record) {
  TERSE_CHECK(!g_install_called.exchange(true), InternalError, "stop signals installed twice");
  g_record = new std::function<void(int)>(std::move(record));
  for (std::size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction now {};
    g_taken[i] = ::sigaction(kSignals[i], nullptr, &now) == 0 && now.sa_handler != SIG_IGN;
  }
  const sigset_t set = stopSet();
  const int rc = ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  TERSE_CHECK(rc == 0, InternalError, "pthread_sigmask: " << std::strerror(rc));
  // Detached: it ends the process, or lives as long as it.
  std::thread(waiterLoop).detach();
  while (g_waiter_tid.load(std::memory_order_acquire) == 0) std::this_thread::yield();
  struct sigaction sa {};
  sa.sa_handler = &forward;
  sa.sa_flags = SA_RESTART;
  sigfillset(&sa.sa_mask);
  for (std::size_t i = 0; i < std::size(kSignals); ++i) {
    if (!g_taken[i]) continue;
    TERSE_CHECK(::sigaction(kSignals[i], &sa, nullptr) == 0, InternalError,
                "sigaction(" << signalName(kSignals[i]) << "): " << std::strerror(errno));
  }
  g_installed.store(true, std::memory_order_release);
}

bool installed() noexcept {
  return g_installed.load(std::memory_order_acquire);
}

int received() noexcept {
  return g_received.load(std::memory_order_acquire);
}

int receivedOrPending() noexcept {
  if (const int sig = received(); sig != 0) return sig;
  if (!installed()) return 0;
  sigset_t pending;
  if (::sigpending(&pending) != 0) return 0;
  for (std::size_t i = 0; i < std::size(kSignals); ++i)
    if (g_taken[i] && sigismember(&pending, kSignals[i]) == 1) return kSignals[i];
  return received();
}

void parkIfStopping() {
  if (received() == 0) return;
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

const char* signalName(int sig) noexcept {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

std::string describe(int sig) {
  if (sig == SIGINT) return "interrupted (SIGINT)";
  return std::string("terminated by ") + signalName(sig);
}

void resetInChild() noexcept {
  if (!g_installed.load(std::memory_order_acquire)) return;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (std::size_t i = 0; i < std::size(kSignals); ++i)
    if (g_taken[i]) ::sigaction(kSignals[i], &dfl, nullptr);
  const sigset_t set = stopSet();
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

Delegate::Delegate(pid_t pid) {
  std::lock_guard lock(g_delegate_mutex);
  g_delegate_pid = pid;
  g_delegate_alive = true;
}

Delegate::~Delegate() {
  {
    std::lock_guard lock(g_delegate_mutex);
    g_delegate_pid = 0;
    g_delegate_alive = false;
  }
  g_delegate_done.notify_all();
}

void Delegate::childEnded() noexcept {
  std::lock_guard lock(g_delegate_mutex);
  g_delegate_pid = 0;
}

}  // namespace terse::stop
