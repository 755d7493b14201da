// The logger's rate limit (core/common/log.h, LogLimiter): a burst per window passes, the rest is counted, and the
// count is reported by the next line that passes or by the limiter's end.
#include "core/common/log.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace terse {
namespace {

class Captured {
 public:
  Captured() : old_level_(logLevel()) {
    setLogLevel(LogLevel::kInfo);
    old_ = setLogSink([this](LogLevel, std::string_view m) { lines.emplace_back(m); });
  }
  ~Captured() {
    setLogSink(old_);
    setLogLevel(old_level_);
  }
  std::vector<std::string> lines;

 private:
  LogSink old_;
  LogLevel old_level_;
};

TEST(LogLimiter, ABurstPassesTheRestIsCountedAndReported) {
  Captured log;
  {
    LogLimiter limiter(3, std::chrono::milliseconds(200));
    for (int i = 0; i < 10; ++i) limiter.log(LogLevel::kWarn, "refused " + std::to_string(i));
    EXPECT_EQ(log.lines, (std::vector<std::string>{"refused 0", "refused 1", "refused 2"}));
    EXPECT_EQ(limiter.suppressed(), 7u);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    limiter.log(LogLevel::kWarn, "refused 10");
    ASSERT_EQ(log.lines.size(), 4u);
    EXPECT_EQ(log.lines[3], "refused 10 (7 similar lines suppressed before it)");
    for (int i = 0; i < 5; ++i) limiter.log(LogLevel::kWarn, "more");
    EXPECT_EQ(log.lines.size(), 6u);
  }
  ASSERT_EQ(log.lines.size(), 7u);
  EXPECT_EQ(log.lines[6], "... and 3 similar lines suppressed (rate limit)");
}

TEST(LogLimiter, LinesBelowTheLevelCostNothing) {
  Captured log;
  LogLimiter limiter(1, std::chrono::seconds(10));
  limiter.log(LogLevel::kDebug, "not shown");
  limiter.log(LogLevel::kWarn, "shown");
  EXPECT_EQ(log.lines, std::vector<std::string>{"shown"});
  EXPECT_EQ(limiter.suppressed(), 0u);
}

}  // namespace
}  // namespace terse
