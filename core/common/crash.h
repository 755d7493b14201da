// A rank that dies of a fatal signal leaves a true status (DESIGN.md section 7, "A plugin that hangs or crashes").
//
// install() puts one handler on SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT. When it runs it
//   - names the plugin call the crashing thread was in (watchdog.h keeps the marks), or the one it returned from last
//     (a plugin that writes past its output corrupts the heap, and glibc aborts later, in the core's free), or the
//     shared object the faulting instruction lies in (dladdr) when no plugin call is known;
//   - rewrites every registered status file (a results folder's status.json) as failed with that message and the
//     signal, keeping the record count the writer last reported: the records in metrics.jsonl are not touched;
//   - prints the message on stderr, tells `terse launch` (launch_notify.h), and dies of the same signal, so the exit
//     status and a core dump are what they would have been.
// Everything it does is async-signal-safe: the JSON around the message is laid out when a file is registered, the
// message is assembled in static storage, and the files are written with open/write/rename.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace terse::crash {

// Idempotent. Also gives the calling thread an alternate signal stack, so that a stack overflow on it (a deeply
// nested input) is reported too.
void install();
// The rank of this process, for processes that run one rank (tcp); in-process runs name the rank from the plugin
// call's mark. -1 (the default): unknown.
void setProcessRank(int rank) noexcept;

// A file to create (O_EXCL: the first failing rank's stays) with the handler's one-line message, for a parent that
// reports a child's failure from such a file (terse run's PyTorch driver). "" = none.
void setErrorFile(std::string_view path);

// A status.json to rewrite as failed should the process die of a signal while this object lives.
class StatusFile {
 public:
  StatusFile(std::string_view path, std::string_view started);
  ~StatusFile();
  StatusFile(const StatusFile&) = delete;
  StatusFile& operator=(const StatusFile&) = delete;
  void setRecords(int64_t records) noexcept;

 private:
  int slot_ = -1;
};

// Rewrites every registered status file as failed with `error` (and `plugin`, when not empty), as the signal handler
// would: for a process that must end without unwinding (watchdog.h: a hung plugin call). Returns the files written.
std::vector<std::string> failRegistered(std::string_view error, std::string_view plugin);

// Writes `message` as the error file's one line (setErrorFile; O_EXCL, so a first failing rank's stays), as the
// handler would: for a process that must end without a signal (terse.torch: a hung plugin call on a thread that cannot
// be abandoned). Returns whether it wrote the file.
bool writeErrorFile(std::string_view message);

// The handler's message for `sig` as it would be written now for the calling thread (tests check it without dying).
// Not async-signal-safe: it allocates the returned string.
std::string describeForTest(int sig);

}  // namespace terse::crash
