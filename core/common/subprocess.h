// A forked child with a pipe back to its parent: what the simulation (core/sim: one SimGrid engine per process) and
// the conformance suite (core/conformance: a crashing plugin takes only its check down) both start.
#pragma once

#include <sys/types.h>

#include <functional>

namespace terse {

struct ForkedChild {
  pid_t pid = -1;
  int read_fd = -1;  // the parent's end of the pipe; the parent closes it
};

// Flushes stdio and iostreams (output the parent buffered must not be written twice), makes a close-on-exec pipe and
// forks. The child closes the read end and runs child(write_fd), which must not return (it ends with _exit). Throws
// InternalError naming `what` when pipe() or fork() fails.
ForkedChild forkWithPipe(const char* what, const std::function<void(int write_fd)>& child);

}  // namespace terse
