// The core's logger: level-filtered lines on stderr, safe to call from any thread. Plugins reach it through the host
// callback the core passes in (terse_host_v1.log), so their messages and the core's share one stream and one filter.
// Deliberately small: a run's measurements go to result files, not to the log.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>

namespace terse {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

std::string_view logLevelName(LogLevel level) noexcept;  // "debug", "info", "warn", "error", "off"
// Parses the names above (and "warning"); nullopt for anything else.
std::optional<LogLevel> parseLogLevel(std::string_view name) noexcept;

// Messages below the level are dropped. The initial level is TERSE_LOG_LEVEL from the environment when it parses,
// otherwise warn, so a normal run prints only what needs attention.
void setLogLevel(LogLevel level) noexcept;
LogLevel logLevel() noexcept;
inline bool logEnabled(LogLevel level) noexcept {
  return level >= logLevel() && level != LogLevel::kOff;
}

// Where accepted messages go; an empty sink restores stderr. Returns the previous sink. Tests use it to assert on
// warnings (e.g. a shadowed plugin); the sink is called under the logger's lock, so it must not log itself.
using LogSink = std::function<void(LogLevel, std::string_view)>;
LogSink setLogSink(LogSink sink);

// Writes one line if the level passes the filter.
void logMessage(LogLevel level, std::string_view message);

// For a line that repeats at someone else's pace -- one per connection an intruder opens -- so that a flood cannot
// flood the log: at most `burst` lines per `window`; the others are counted, and the first line written after them
// (or the limiter's destructor) says how many were suppressed. Thread-safe.
class LogLimiter {
 public:
  LogLimiter(std::size_t burst, std::chrono::steady_clock::duration window) : burst_(burst), window_(window) {}
  ~LogLimiter();
  LogLimiter(const LogLimiter&) = delete;
  LogLimiter& operator=(const LogLimiter&) = delete;

  // Writes `message` (as logMessage) unless this window's burst is spent.
  void log(LogLevel level, std::string_view message);
  uint64_t suppressed() const;  // over the limiter's life

 private:
  mutable std::mutex mutex_;
  const std::size_t burst_;
  const std::chrono::steady_clock::duration window_;
  std::chrono::steady_clock::time_point window_start_{};
  std::size_t in_window_ = 0;
  uint64_t pending_ = 0;  // suppressed since the last line written
  uint64_t suppressed_ = 0;
  LogLevel pending_level_ = LogLevel::kWarn;
};

}  // namespace terse

// TERSE_LOG(terse::LogLevel::kWarn, "using " << path): formats only when the level is enabled.
#define TERSE_LOG(level, stream_expr)                   \
  do {                                                  \
    if (::terse::logEnabled(level)) {                   \
      std::ostringstream terse_log_oss_;                \
      terse_log_oss_ << stream_expr;                    \
      ::terse::logMessage(level, terse_log_oss_.str()); \
    }                                                   \
  } while (0)
