// A forked child with a pipe back to its parent: what the simulation (core/sim: one SimGrid engine per process) and
// the conformance suite (core/conformance: a crashing plugin takes only its check down) both start.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>

namespace terse {

struct ForkedChild {
  pid_t pid = -1;
  int read_fd = -1;  // the parent's end of the pipe; the parent closes it
};

// Flushes stdio and iostreams (output the parent buffered must not be written twice), makes a close-on-exec pipe and
// forks. The child closes the read end and runs child(write_fd), which must not return (it ends with _exit). Throws
// InternalError naming `what` when pipe() or fork() fails.
ForkedChild forkWithPipe(const char* what, const std::function<void(int write_fd)>& child);

// Writes all of `bytes`, retrying on EINTR. Gives up silently when the reader is gone: a child reporting to a parent
// that stopped listening has nobody left to tell.
void writeAll(int fd, std::string_view bytes);

// Reads `fd` to its end (EOF or an error), retrying on EINTR.
std::string readAll(int fd);

// What a child sent and how it ended: reads its pipe to the end, closes it and reaps the child. In a process that
// records its stop (core/common/stop_signals.h) a stop meanwhile is sent to the child, and is recorded once the child
// has ended; forkWithPipe's child then takes the stop signals at their default action and ends with its parent.
struct ChildExit {
  std::string report;
  int status = 0;  // waitpid's
};
ChildExit awaitChild(const ForkedChild& child);

// "SIGSEGV (Segmentation fault)", or "signal N" where the C library cannot name it.
std::string signalText(int sig);
// How a child ended, for messages: "died of SIGSEGV (Segmentation fault)" or "exited with status 3".
std::string exitText(int status);

}  // namespace terse
