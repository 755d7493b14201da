#include "core/common/crash.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>

#include "core/common/error.h"
#include "core/common/launch_notify.h"
#include "core/common/watchdog.h"

namespace terse::crash {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr std::size_t kMaxFiles = 16;  // status files alive at once: one per running variant, a few per process
constexpr std::size_t kPath = 4096;

// A registered file: its paths and the part of its JSON known in advance, written by the owner thread before `used`
// is released and only read by the handler after acquiring it.
struct FileSlot {
  std::atomic<bool> used{false};
  std::atomic<int64_t> records{0};
  char path[kPath];
  char tmp[kPath];
  char started[40];
};

std::array<FileSlot, kMaxFiles> g_files;
std::atomic<int> g_rank{-1};
char g_error_file[kPath];
std::atomic<bool> g_have_error_file{false};
std::atomic<bool> g_installed{false};
std::mutex g_install_mutex;

// ---- Async-signal-safe text: a fixed buffer that appends, truncating at its end.
template <std::size_t N>
struct Text {
  char buf[N];
  std::size_t len = 0;
  void add(const char* s) {
    for (; s != nullptr && *s != '\0' && len + 1 < N; ++s) buf[len++] = *s;
    buf[len] = '\0';
  }
  void add(std::string_view s) {
    for (char c : s) {
      if (len + 1 >= N) break;
      buf[len++] = c;
    }
    buf[len] = '\0';
  }
  void addInt(int64_t v) {
    char digits[24];
    int n = 0;
    const bool neg = v < 0;
    uint64_t u = neg ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
    do {
      digits[n++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (neg) add("-");
    while (n > 0 && len + 1 < N) buf[len++] = digits[--n];
    buf[len] = '\0';
  }
  void addPadded(int64_t v, int width) {
    char digits[24];
    int n = 0;
    for (; n < width || v != 0; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
    while (n > 0 && len + 1 < N) buf[len++] = digits[--n];
    buf[len] = '\0';
  }
  // JSON string body: quotes, backslashes and control characters escaped.
  void addJson(const char* s) {
    static constexpr char kHex[] = "0123456789abcdef";
    for (; s != nullptr && *s != '\0' && len + 7 < N; ++s) {
      const auto c = static_cast<unsigned char>(*s);
      if (c == '"' || c == '\\') {
        buf[len++] = '\\';
        buf[len++] = static_cast<char>(c);
      } else if (c < 0x20) {
        const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        for (char e : esc) buf[len++] = e;
      } else {
        buf[len++] = static_cast<char>(c);
      }
    }
    buf[len] = '\0';
  }
};

const char* signalName(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "a fatal signal";
  }
}

// ISO 8601 UTC from the realtime clock (clock_gettime is async-signal-safe, gmtime_r is not): days to civil date by
// the proleptic Gregorian arithmetic of H. Hinnant's days_from_civil inverse.
template <std::size_t N>
void addUtcNow(Text<N>& t) {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t secs = ts.tv_sec;
  int64_t days = secs / 86400;
  const int64_t rem = secs % 86400;
  days += 719468;
  const int64_t era = days / 146097;
  const int64_t doe = days - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t d = doy - (153 * mp + 2) / 5 + 1;
  const int64_t m = mp < 10 ? mp + 3 : mp - 9;
  const int64_t y = yoe + era * 400 + (m <= 2 ? 1 : 0);
  t.addPadded(y, 4);
  t.add("-");
  t.addPadded(m, 2);
  t.add("-");
  t.addPadded(d, 2);
  t.add("T");
  t.addPadded(rem / 3600, 2);
  t.add(":");
  t.addPadded(rem / 60 % 60, 2);
  t.add(":");
  t.addPadded(rem % 60, 2);
  t.add("Z");
}

// The message: who died of what, and in which plugin call (`call`, looked up once by the caller). `pc` is the faulting
// instruction, or null.
template <std::size_t N>
void describe(Text<N>& t, int sig, const void* pc, const watchdog::CallView& call) {
  const int rank = call.rank >= 0 ? call.rank : g_rank.load(std::memory_order_relaxed);
  if (rank >= 0) {
    t.add("rank ");
    t.addInt(rank);
    t.add(" ");
  }
  t.add("died of ");
  t.add(signalName(sig));
  if (call.plugin != nullptr && call.in_call) {
    t.add(" in ");
    t.add(call.plugin);
    t.add(", during ");
    t.add(call.call);
  } else if (call.plugin != nullptr) {
    t.add(" after ");
    t.add(call.plugin);
    t.add(" returned from ");
    t.add(call.call);
  }
  if (call.plugin != nullptr && call.tensor != watchdog::kNoTensor) {
    t.add(" of tensor ");
    t.addInt(static_cast<int64_t>(call.tensor));
  }
  if (call.plugin != nullptr && !call.in_call) {
    t.add(
        " (the thread's last plugin call: a plugin that writes past its buffers corrupts memory the core finds later)");
  } else if (call.plugin == nullptr && pc != nullptr) {
    // No plugin call on this thread: name the object the instruction lies in. dladdr takes the loader's lock, which a
    // crash inside dlopen would hold; that case is rare enough to accept, and no worse than dying without a word.
    Dl_info info{};
    if (::dladdr(pc, &info) != 0 && info.dli_fname != nullptr) {
      t.add(" in ");
      t.add(info.dli_fname);
      if (info.dli_sname != nullptr) {
        t.add(" (");
        t.add(info.dli_sname);
        t.add(")");
      }
    }
  }
}

void writeAll(const char* data, std::size_t n, int fd) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

// One status file as failed, in the writer's layout (results/result_writer.h) plus the signal and the plugin, through a
// temporary file and a rename like every rewrite of it. Async-signal-safe.
template <std::size_t N>
bool writeFailed(FileSlot& f, Text<N>& json, const char* error, const char* signal, const char* plugin) {
  if (!f.used.load(std::memory_order_acquire)) return false;
  json.len = 0;
  json.add("{\"state\":\"failed\",\"records\":");
  json.addInt(f.records.load(std::memory_order_relaxed));
  json.add(",\"started\":\"");
  json.add(f.started);
  json.add("\",\"updated\":\"");
  addUtcNow(json);
  json.add("\",\"error\":\"");
  json.addJson(error);
  if (signal != nullptr) {
    json.add("\",\"signal\":\"");
    json.add(signal);
  }
  if (plugin != nullptr && *plugin != '\0') {
    json.add("\",\"plugin\":\"");
    json.addJson(plugin);
  }
  json.add("\"}\n");
  const int fd = ::open(f.tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  writeAll(json.buf, json.len, fd);
  ::close(fd);
  return ::rename(f.tmp, f.path) == 0;
}

// Tells `terse launch` (launch_notify.h): "crashed SIGSEGV plugin=NAME path=PATH" when the thread was inside a plugin
// call, "crashed SIGSEGV" otherwise (the launcher says "in plugin" only for the first). The name and path are cut out
// of the label "<kind> '<name>' (<path>)" by scanning, which is async-signal-safe.
void notifyCrash(int sig, const watchdog::CallView& call) {
  if (!launcherNotifyEnabled()) return;
  std::string_view name, path;
  if (call.plugin != nullptr && call.in_call) {
    const std::string_view label(call.plugin);
    const std::size_t open = label.find('\'');
    const std::size_t close = open == std::string_view::npos ? open : label.find("' (", open + 1);
    if (close != std::string_view::npos && label.back() == ')') {
      name = label.substr(open + 1, close - open - 1);
      path = label.substr(close + 3, label.size() - close - 4);
    }
  }
  if (name.empty()) {
    notifyLauncherParts({"crashed ", signalName(sig)});
  } else {
    notifyLauncherParts({"crashed ", signalName(sig), " plugin=", name, " path=", path});
  }
}

void onFatalSignal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  static std::atomic<bool> entered{false};
  if (entered.exchange(true)) {
    // A second fatal signal (in this handler, or on another thread at once): die of it without another word.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  const void* pc = nullptr;
#if defined(__x86_64__)
  if (context != nullptr)
    pc = reinterpret_cast<const void*>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  if (context != nullptr) pc = reinterpret_cast<const void*>(static_cast<ucontext_t*>(context)->uc_mcontext.pc);
#endif
  (void)info;
  static Text<2048> message;
  message.len = 0;
  const watchdog::CallView call = watchdog::callOfThread(static_cast<pid_t>(::syscall(SYS_gettid)));
  describe(message, sig, pc, call);

  static Text<8192> json;
  for (FileSlot& f : g_files) writeFailed(f, json, message.buf, signalName(sig), call.plugin);

  static Text<2200> line;
  line.len = 0;
  line.add(message.buf);
  line.add("\n");
  if (g_have_error_file.load(std::memory_order_acquire)) {
    const int fd = ::open(g_error_file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      writeAll(line.buf, line.len, fd);
      ::close(fd);
    }
  }
  writeAll("terse: ", 7, STDERR_FILENO);
  writeAll(line.buf, line.len, STDERR_FILENO);
  notifyCrash(sig, call);

  // Die of the same signal: the exit status and a core dump stay what they would have been without the handler.
  errno = saved_errno;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install() {
  std::lock_guard lock(g_install_mutex);
  if (!g_installed.exchange(true)) {
    (void)watchdog::callOfThread(0);  // the mark table exists before the handler can need it
    struct sigaction sa {};
    sa.sa_sigaction = &onFatalSignal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : kSignals) ::sigaction(sig, &sa, nullptr);
  }
  // An alternate stack for the calling thread: a stack overflow leaves no room to run the handler on the stack itself.
  stack_t current{};
  if (::sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE) != 0) {
    static thread_local std::array<std::byte, 64 * 1024> alt_stack;
    stack_t ss{};
    ss.ss_sp = alt_stack.data();
    ss.ss_size = alt_stack.size();
    ::sigaltstack(&ss, nullptr);
  }
}

void setProcessRank(int rank) noexcept {
  g_rank.store(rank, std::memory_order_relaxed);
}

void setErrorFile(std::string_view path) {
  TERSE_CHECK(path.size() < kPath, InvalidArgument, "error file path too long for the crash handler: " << path);
  g_have_error_file.store(false, std::memory_order_release);
  std::memcpy(g_error_file, path.data(), path.size());
  g_error_file[path.size()] = '\0';
  g_have_error_file.store(!path.empty(), std::memory_order_release);
}

StatusFile::StatusFile(std::string_view path, std::string_view started) {
  TERSE_CHECK(path.size() + 5 < kPath, InvalidArgument, "status path too long for the crash record: " << path);
  // `used` is published only once the slot is filled, so claiming takes a lock rather than a CAS on it.
  static std::mutex claim;
  std::lock_guard lock(claim);
  for (std::size_t i = 0; i < kMaxFiles; ++i) {
    FileSlot& f = g_files[i];
    if (f.used.load(std::memory_order_relaxed)) continue;
    std::memcpy(f.path, path.data(), path.size());
    f.path[path.size()] = '\0';
    std::memcpy(f.tmp, path.data(), path.size());
    std::memcpy(f.tmp + path.size(), ".tmp", 5);
    const std::size_t n = std::min(started.size(), sizeof(f.started) - 1);
    std::memcpy(f.started, started.data(), n);
    f.started[n] = '\0';
    f.records.store(0, std::memory_order_relaxed);
    f.used.store(true, std::memory_order_release);
    slot_ = static_cast<int>(i);
    return;
  }
  // More live status files than slots: this one is not covered; a crash then leaves it "running", as before.
}

StatusFile::~StatusFile() {
  if (slot_ >= 0) g_files[static_cast<std::size_t>(slot_)].used.store(false, std::memory_order_release);
}

void StatusFile::setRecords(int64_t records) noexcept {
  if (slot_ >= 0) g_files[static_cast<std::size_t>(slot_)].records.store(records, std::memory_order_relaxed);
}

std::vector<std::string> failRegistered(std::string_view error, std::string_view plugin) {
  const std::string error_text(error), plugin_text(plugin);
  auto json = std::make_unique<Text<8192>>();
  std::vector<std::string> written;
  for (FileSlot& f : g_files)
    if (writeFailed(f, *json, error_text.c_str(), nullptr, plugin_text.c_str())) written.emplace_back(f.path);
  return written;
}

bool writeErrorFile(std::string_view message) {
  if (!g_have_error_file.load(std::memory_order_acquire)) return false;
  const int fd = ::open(g_error_file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const std::string line = std::string(message) + "\n";
  writeAll(line.data(), line.size(), fd);
  ::close(fd);
  return true;
}

std::string describeForTest(int sig) {
  Text<2048> t;
  describe(t, sig, nullptr, watchdog::callOfThread(static_cast<pid_t>(::syscall(SYS_gettid))));
  return std::string(t.buf, t.len);
}

}  // namespace terse::crash
