// Helpers shared by the loader and scheduler tests: fixture paths, environment and log capture, error assertions.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/common/log.h"

namespace terse::test {

inline const std::filesystem::path kFixtureDir = TERSE_TEST_FIXTURE_PLUGIN_DIR;
inline const std::filesystem::path kShadowDir = kFixtureDir / "shadow";
inline const std::filesystem::path kBuildPluginDir = TERSE_TEST_BUILD_PLUGIN_DIR;

inline std::filesystem::path fixtureCompressor(const std::string& name) {
  return kFixtureDir / ("terse_compressor_" + name + ".so");
}
inline std::filesystem::path fixtureScheduler(const std::string& name) {
  return kFixtureDir / ("terse_scheduler_" + name + ".so");
}

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Collects log lines (all levels) for one scope.
class LogCapture {
 public:
  LogCapture() : old_level_(logLevel()) {
    setLogLevel(LogLevel::kDebug);
    old_sink_ = setLogSink([this](LogLevel level, std::string_view m) {
      lines_.push_back(std::string(logLevelName(level)) + ": " + std::string(m));
    });
  }
  ~LogCapture() {
    setLogSink(std::move(old_sink_));
    setLogLevel(old_level_);
  }
  std::string text() const {
    std::string out;
    for (const auto& l : lines_) out += l + "\n";
    return out;
  }

 private:
  LogLevel old_level_;
  LogSink old_sink_;
  std::vector<std::string> lines_;
};

// Runs f, which must throw exactly E (or a subclass); returns the message, or "" after recording a failure.
template <typename E, typename F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// Every piece must appear in the message.
inline ::testing::AssertionResult contains(const std::string& message, std::initializer_list<std::string> pieces) {
  for (const auto& p : pieces) {
    if (message.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks \"" << p << "\":\n" << message;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace terse::test
