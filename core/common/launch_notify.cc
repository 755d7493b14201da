// The sending side of the launcher's control channel (launch_notify.h).
#include "core/common/launch_notify.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>

namespace terse {
namespace {

// The channel's descriptor, -1 when there is none. Constant-initialised and lock-free, so a signal handler may read it
// at any moment, even before the initializer below ran (it then sees no channel).
std::atomic<int> g_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free);

// Only the socket the launcher made: a stale variable must never send a line into a file that reuses the number.
bool isChannel(int fd) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  int type = 0, domain = 0;
  socklen_t len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) return false;
  len = sizeof(domain);
  return ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_UNIX;
}

// Before main, while the process has one thread: getenv and the checks above are not async-signal-safe.
[[maybe_unused]] const bool g_initialised = (initLauncherNotify(), true);

}  // namespace

void initLauncherNotify() noexcept {
  const int saved = errno;
  int fd = -1;
  if (const char* text = std::getenv(kLaunchNotifyFdEnv); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    // 0..2 are the standard streams, never the channel.
    if (*end == '\0' && v > 2 && v < INT_MAX && isChannel(static_cast<int>(v))) fd = static_cast<int>(v);
  }
  g_fd.store(fd);
  errno = saved;
}

bool launcherNotifyEnabled() noexcept {
  return g_fd.load() >= 0;
}

void notifyLauncher(std::string_view line) noexcept {
  notifyLauncherParts({line});
}

void notifyLauncherParts(std::initializer_list<std::string_view> parts) noexcept {
  const int fd = g_fd.load();
  if (fd < 0) return;
  char buf[kLaunchNotifyMaxBytes];
  constexpr std::size_t kText = kLaunchNotifyMaxBytes - 1;  // room for the newline
  std::size_t n = 0;
  bool cut = false;
  for (const std::string_view part : parts) {
    for (const char c : part) {
      if (n == kText) {
        cut = true;
        break;
      }
      const auto u = static_cast<unsigned char>(c);
      buf[n++] = (u < 0x20 || u == 0x7f) ? ' ' : c;  // one line, whatever the reason text held
    }
    if (cut) break;
  }
  if (n == 0) return;
  if (cut)
    for (std::size_t i = n - 3; i < n; ++i) buf[i] = '.';
  buf[n++] = '\n';
  const int saved = errno;
  while (::send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno == EINTR) {
  }
  errno = saved;
}

}  // namespace terse
