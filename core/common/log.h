// The core's logger: level-filtered lines on stderr, safe to call from any thread. Plugins reach it through the host
// callback the core passes in (terse_host_v1.log), so their messages and the core's share one stream and one filter.
// Deliberately small: a run's measurements go to result files, not to the log.
#pragma once

#include <functional>
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
