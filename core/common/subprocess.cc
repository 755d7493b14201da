#include "core/common/subprocess.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

#include "core/common/error.h"
#include "core/common/stop_signals.h"

namespace terse {

ForkedChild forkWithPipe(const char* what, const std::function<void(int write_fd)>& child) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  int fds[2];
  TERSE_CHECK(::pipe2(fds, O_CLOEXEC) == 0, InternalError, what << ": pipe() failed: " << std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    TERSE_THROW(InternalError, what << ": fork() failed: " << std::strerror(err));
  }
  if (pid == 0) {
    ::close(fds[0]);
    // In a process that records its stop (`terse run`, stop_signals.h): the child takes the stop signals as a process
    // without terse would, and ends with this process, which records the stop for it (a SIGTERM to the parent alone
    // must not leave a simulation appending records to a folder marked failed). Forked by the thread that waits for it
    // (awaitChild), so the thread's end, which also sends PR_SET_PDEATHSIG's signal, is the process's.
    if (stop::installed()) {
      stop::resetInChild();
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) std::_Exit(128 + SIGKILL);
    }
    child(fds[1]);
    std::_Exit(127);  // the contract is that child() never returns; if it does, the parent sees no result
  }
  ::close(fds[1]);
  return ForkedChild{pid, fds[0]};
}

void writeAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string readAll(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

ChildExit awaitChild(const ForkedChild& child) {
  // A stop of this process goes to the child first and waits for its end (stop_signals.h): a simulation's child
  // appends records, and the stop's status must count them all.
  std::optional<stop::Delegate> delegate;
  if (stop::installed()) delegate.emplace(child.pid);
  ChildExit got;
  got.report = readAll(child.read_fd);
  ::close(child.read_fd);
  // Waited for without reaping first: until reaped, the pid is still the child's, and the delegate may signal it.
  siginfo_t ended{};
  while (::waitid(P_PID, static_cast<id_t>(child.pid), &ended, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  if (delegate) delegate->childEnded();
  while (::waitpid(child.pid, &got.status, 0) < 0 && errno == EINTR) {
  }
  return got;
}

std::string signalText(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* abbrev = ::sigabbrev_np(sig)) return "SIG" + std::string(abbrev) + " (" + ::strsignal(sig) + ")";
#endif
  return "signal " + std::to_string(sig);
}

std::string exitText(int status) {
  if (WIFSIGNALED(status)) return "died of " + signalText(WTERMSIG(status));
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended with wait status " + std::to_string(status);
}

}  // namespace terse
