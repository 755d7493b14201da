#include "core/common/log.h"

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>
#include <utility>

namespace terse {
namespace {

LogLevel initialLevel() noexcept {
  const char* env = std::getenv("TERSE_LOG_LEVEL");
  if (env != nullptr) {
    if (auto level = parseLogLevel(env)) return *level;
  }
  return LogLevel::kWarn;
}

std::atomic<LogLevel>& levelRef() noexcept {
  static std::atomic<LogLevel> level{initialLevel()};
  return level;
}

// One lock for the sink and the write, so lines from concurrent threads (several plugin instances, the
// communication thread) never interleave mid-line and a sink swap never races a write.
struct SinkState {
  std::mutex mutex;
  LogSink sink;
};

SinkState& sinkState() {
  static SinkState state;
  return state;
}

}  // namespace

std::string_view logLevelName(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "?";
}

std::optional<LogLevel> parseLogLevel(std::string_view name) noexcept {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  return std::nullopt;
}

void setLogLevel(LogLevel level) noexcept {
  levelRef().store(level, std::memory_order_relaxed);
}

LogLevel logLevel() noexcept {
  return levelRef().load(std::memory_order_relaxed);
}

LogSink setLogSink(LogSink sink) {
  auto& state = sinkState();
  std::lock_guard lock(state.mutex);
  return std::exchange(state.sink, std::move(sink));
}

void logMessage(LogLevel level, std::string_view message) {
  if (!logEnabled(level)) return;
  auto& state = sinkState();
  std::lock_guard lock(state.mutex);
  if (state.sink) {
    state.sink(level, message);
    return;
  }
  std::string line;
  line.reserve(message.size() + 16);
  line.append("terse [").append(logLevelName(level)).append("] ").append(message).push_back('\n');
  std::cerr << line << std::flush;
}

LogLimiter::~LogLimiter() {
  if (pending_ > 0)
    logMessage(pending_level_, "... and " + std::to_string(pending_) + " similar lines suppressed (rate limit)");
}

void LogLimiter::log(LogLevel level, std::string_view message) {
  if (!logEnabled(level)) return;
  uint64_t before = 0;
  {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (now - window_start_ >= window_) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++pending_;
      ++suppressed_;
      pending_level_ = level;
      return;
    }
    ++in_window_;
    before = std::exchange(pending_, 0);
  }
  if (before == 0) return logMessage(level, message);
  logMessage(level, std::string(message) + " (" + std::to_string(before) + " similar lines suppressed before it)");
}

uint64_t LogLimiter::suppressed() const {
  std::lock_guard lock(mutex_);
  return suppressed_;
}

}  // namespace terse
