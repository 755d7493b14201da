#include "core/common/subprocess.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "core/common/error.h"

namespace terse {

ForkedChild forkWithPipe(const char* what, const std::function<void(int write_fd)>& child) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  int fds[2];
  TERSE_CHECK(::pipe2(fds, O_CLOEXEC) == 0, InternalError, what << ": pipe() failed: " << std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    TERSE_THROW(InternalError, what << ": fork() failed: " << std::strerror(err));
  }
  if (pid == 0) {
    ::close(fds[0]);
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
  ChildExit got;
  got.report = readAll(child.read_fd);
  ::close(child.read_fd);
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
