#include "core/common/subprocess.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace terse
