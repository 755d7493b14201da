// The sending side of the launcher's control channel (core/common/launch_notify.h): lines arrive whole, one message per
// call, cut to size and kept on one line; without a channel, or with a variable naming something else, nothing is
// written anywhere; a closed channel neither raises SIGPIPE nor fails the caller.
#include "core/common/launch_notify.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

namespace terse {
namespace {

// A channel like the launcher's, named in the environment of this process.
class Channel {
 public:
  Channel() {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds_), 0);
    ::setenv(kLaunchNotifyFdEnv, std::to_string(fds_[1]).c_str(), 1);
    initLauncherNotify();
  }
  ~Channel() {
    ::unsetenv(kLaunchNotifyFdEnv);
    initLauncherNotify();
    if (fds_[0] >= 0) ::close(fds_[0]);
    ::close(fds_[1]);
  }
  // The next message, "" when none is waiting.
  std::string next() {
    char buf[4 * kLaunchNotifyMaxBytes];
    const ssize_t n = ::recv(fds_[0], buf, sizeof(buf), MSG_DONTWAIT);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  }
  void closeLauncherEnd() {
    ::close(fds_[0]);
    fds_[0] = -1;
  }

 private:
  int fds_[2] = {-1, -1};
};

TEST(LaunchNotify, SendsOneMessagePerLine) {
  Channel ch;
  ASSERT_TRUE(launcherNotifyEnabled());
  notifyLauncher("study-done");
  notifyLauncherParts({"crashed ", "SIGSEGV", " plugin=", "hang-decomp", " path=", "/p/libx.so"});
  EXPECT_EQ(ch.next(), "study-done\n");
  EXPECT_EQ(ch.next(), "crashed SIGSEGV plugin=hang-decomp path=/p/libx.so\n");
  EXPECT_EQ(ch.next(), "");
}

TEST(LaunchNotify, KeepsALineOnOneLineAndCutsItToSize) {
  Channel ch;
  notifyLauncher("failed rank 1: first\nsecond\tthird\r");
  EXPECT_EQ(ch.next(), "failed rank 1: first second third \n");
  const std::string reason(3 * kLaunchNotifyMaxBytes, 'x');
  notifyLauncherParts({"failed ", reason});
  const std::string got = ch.next();
  ASSERT_EQ(got.size(), kLaunchNotifyMaxBytes);
  EXPECT_EQ(got.substr(0, 8), "failed x");
  EXPECT_EQ(got.substr(got.size() - 4), "...\n");
  // Exactly the room there is: not cut.
  const std::string fits(kLaunchNotifyMaxBytes - 1, 'y');
  notifyLauncher(fits);
  EXPECT_EQ(ch.next(), fits + "\n");
  notifyLauncher("");  // nothing to say: no empty line
  EXPECT_EQ(ch.next(), "");
}

TEST(LaunchNotify, ClosedChannelRaisesNoSigpipeAndKeepsErrno) {
  Channel ch;
  ch.closeLauncherEnd();
  // SIGPIPE at its default would end this process, which is what a rank's crash handler cannot risk.
  struct sigaction old {
  }, dfl{};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, &old);
  errno = 1234;
  notifyLauncher("study-done");
  EXPECT_EQ(errno, 1234);
  ::sigaction(SIGPIPE, &old, nullptr);
}

TEST(LaunchNotify, OffWithoutTheVariableOrWithSomethingElseInIt) {
  ::unsetenv(kLaunchNotifyFdEnv);
  initLauncherNotify();
  EXPECT_FALSE(launcherNotifyEnabled());
  notifyLauncher("study-done");  // nowhere to go: nothing happens

  // A descriptor reused for a file (the variable outlived the socket) must never receive a line.
  const int file = ::memfd_create("not-the-channel", MFD_CLOEXEC);
  ASSERT_GE(file, 0);
  for (const std::string& value : {std::to_string(file), std::string("1"), std::string("12abc"), std::string(""),
                                   std::string("999999"), std::string("-4")}) {
    ::setenv(kLaunchNotifyFdEnv, value.c_str(), 1);
    initLauncherNotify();
    EXPECT_FALSE(launcherNotifyEnabled()) << "TERSE_LAUNCH_NOTIFY_FD=" << value;
    notifyLauncher("study-done");
  }
  struct stat st {};
  ASSERT_EQ(::fstat(file, &st), 0);
  EXPECT_EQ(st.st_size, 0);
  ::close(file);

  // A stream socket is not the launcher's either.
  int stream[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, stream), 0);
  ::setenv(kLaunchNotifyFdEnv, std::to_string(stream[1]).c_str(), 1);
  initLauncherNotify();
  EXPECT_FALSE(launcherNotifyEnabled());
  ::close(stream[0]);
  ::close(stream[1]);
  ::unsetenv(kLaunchNotifyFdEnv);
  initLauncherNotify();
}

}  // namespace
}  // namespace terse
