// A rank's control channel to `terse launch` (experiments/cli/launch_command.cc): short one-line messages that tell the
// launcher what the rank's exit status cannot, or cannot yet -- that the study is complete (so a rank that never ends,
// e.g. a stopped parameter-server worker the shards already dropped, is terminated instead of waited on forever), why
// a run failed, or in which plugin a fatal signal struck.
//
// The channel. The launcher gives each rank its own Unix socket (socketpair, SOCK_SEQPACKET) and names the rank's end
// in TERSE_LAUNCH_NOTIFY_FD; the descriptor survives exec, so a rank that is a shell script passes it on to the terse
// it runs. SOCK_SEQPACKET keeps each send one message (a line never interleaves with another process's), and a socket
// takes send(MSG_NOSIGNAL): a launcher that is gone makes the send fail with EPIPE instead of raising SIGPIPE, which a
// fatal-signal handler could neither block (it must not change the signal mask) nor survive. Without the variable
// (ranks started by srun, mpirun or by hand) every call here does nothing.
//
// Messages, one line each, at most kLaunchNotifyMaxBytes with the newline:
//   study-done                              the study completed (sent by the rank that writes its results)
//   failed <reason>                         this rank's run failed; it exits non-zero next
//   crashed <SIGNAME> [plugin=<name> path=<path>]   sent from a fatal-signal handler before the rank dies
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace terse {

inline constexpr char kLaunchNotifyFdEnv[] = "TERSE_LAUNCH_NOTIFY_FD";
// The longest message sent, its newline included; longer ones are cut and end in "...". Well under PIPE_BUF and the
// socket's buffer, so one send carries the whole line.
inline constexpr std::size_t kLaunchNotifyMaxBytes = 1024;

// Reads TERSE_LAUNCH_NOTIFY_FD and caches the descriptor when it names a Unix SOCK_SEQPACKET socket (anything else --
// unset, not a number, a descriptor this process does not have or one reused for a file -- leaves the channel off, so
// a variable inherited by a process that lacks the socket writes nothing anywhere). It runs once before main (a static
// initializer in launch_notify.cc, which every program that calls notifyLauncher links), so the senders below only
// read a lock-free atomic. Calling it again re-reads the environment (tests); it is not async-signal-safe.
void initLauncherNotify() noexcept;

// True when this process has a launcher to tell.
bool launcherNotifyEnabled() noexcept;

// Sends `line` (a newline is added; control characters become spaces). Async-signal-safe: no allocation, no lock, one
// send(2) with MSG_NOSIGNAL | MSG_DONTWAIT (a full or closed channel drops the message rather than blocking or raising
// SIGPIPE), errno preserved. Errors (EPIPE, EBADF, EAGAIN) are ignored: telling the launcher is best effort.
void notifyLauncher(std::string_view line) noexcept;

// The same for a line given in parts, joined into a buffer on the stack, e.g. from a signal handler:
//   notifyLauncherParts({"crashed ", "SIGSEGV", " plugin=", name, " path=", path});
void notifyLauncherParts(std::initializer_list<std::string_view> parts) noexcept;

}  // namespace terse
