// A process stopped by its user or its scheduler leaves a true status (DESIGN.md section 7;
// docs/running-studies.md "When a run is stopped").
//
// SIGTERM (what SLURM, Kubernetes, timeout(1) and systemd send), SIGHUP (a closed terminal or ssh session) and SIGINT
// (Ctrl-C) would end `terse run` at once with their default action, and its results folder would say "running". After
// install() they are blocked in the calling thread and in every thread it starts later, and one thread of their own
// takes them with sigwait(): it does the recording as ordinary code (locks, allocation, files), which a signal handler
// could not. For threads started before install() -- a library's pool, OpenBLAS's, is created when it is loaded --
// the signals are not blocked, so install() also gives them a handler that only passes the signal on to that thread
// (tgkill, async-signal-safe); without it the default action, taken on such a thread, would end the process.
//
// On the first of them the thread
//   1. publishes the signal (received(): a thread about to start new work, a variant, checks it and parks instead);
//   2. when a child process does the work on the folder (a Delegate: the PyTorch driver, a simulation), sends it the
//      signal (SIGINT only when the child has not ended 2 s later: Ctrl-C reaches it from the terminal) and waits, up
//      to kDelegateGrace, for its owner to settle the folder after it ended (the error then starts with describe():
//      results/result_writer.h); a child still there then is killed. A second SIGINT or SIGTERM during these waits
//      (Ctrl-C pressed again, a scheduler's repeated SIGTERM) ends them: the child is killed at once (a repeated
//      SIGHUP does not: a closed terminal sends two);
//   3. calls the `record` function given to install(): the runner's marks every folder still "running" failed;
//   4. ends the process by the same signal with its default action, so the parent shell sees the true cause (exit
//      status 128 + signal, and a shell's own SIGINT handling).
// SIGKILL cannot be caught: a run killed by it still leaves "running".
//
// A child that this process forks or starts (a simulation, a calibration, the PyTorch driver) calls resetInChild()
// first: the blocked mask survives fork and exec, and a child must take these signals as it would have without terse.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>

namespace terse::stop {

// How long a Delegate's owner has, after the child was sent the signal, to settle the folder (the driver's ranks
// record an interrupt within about a second; a driver sent SIGTERM dies at once).
inline constexpr std::chrono::seconds kDelegateGrace{20};

// Blocks SIGINT, SIGTERM and SIGHUP -- each one the process was not started with ignored (nohup's SIGHUP, a
// non-interactive shell's SIGINT for a background job), which keeps its meaning -- in the calling thread, which must be
// the one that starts the process's threads (call it before them), starts the thread that takes them, and installs the
// forwarding handler. `record(sig)` runs on that thread once, before the process ends by `sig`; an exception out of it
// is printed and the process ends anyway. Once per process: a second call throws InternalError.
void install(std::function<void(int sig)> record);

// True once install() ran.
bool installed() noexcept;

// The signal being handled, or 0. Once non-zero the process is ending: work not yet started must not start.
int received() noexcept;

// received(), or else a stop signal pending for the process that the stopping thread has not taken yet: for a thread
// that saw its work end (a child sent the signal by the same `kill` of the process group) before that thread woke.
int receivedOrPending() noexcept;

// Waits for the end of the process when a signal was received (the stopping thread ends it); returns at once
// otherwise. For a thread about to start work that the stop must not see begin (the next variant) or about to end
// the process by another way (returning an exit status from main).
void parkIfStopping();

// "terminated by SIGTERM", "terminated by SIGHUP", "interrupted (SIGINT)": the status's error for a run stopped by
// `sig`.
std::string describe(int sig);
// "SIGTERM" ...: the name written beside it.
const char* signalName(int sig) noexcept;

// In a child just forked (before exec, or before its work): the signals install() took back to their default action
// and unblocked, as before install(). Async-signal-safe (a forked child of a threaded process may call only such
// functions). Does nothing when install() did not run.
void resetInChild() noexcept;

// While it lives, a stop signal goes to child process `pid` first (step 2 above). The owner calls childEnded() once
// the child is known to have ended, before reaping it (waitid WNOWAIT), so that its pid, free again once reaped, is
// never signalled; the destructor, after the owner settled the folder, lets the stopping thread go on.
class Delegate {
 public:
  explicit Delegate(pid_t pid);
  ~Delegate();
  Delegate(const Delegate&) = delete;
  Delegate& operator=(const Delegate&) = delete;
  void childEnded() noexcept;
};

}  // namespace terse::stop
