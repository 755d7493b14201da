// The plugin-call watchdog (core/common/watchdog.h) and the fatal-signal handler (core/common/crash.h): an overrunning
// call reaches the handlers once, with what it was; a call within the deadline, a removed handler and a deadline of 0
// never do; the handler's message and status file name the plugin call the thread was in or returned from last.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "core/common/crash.h"
#include "core/common/json.h"
#include "core/common/watchdog.h"

namespace terse {
namespace {

using namespace std::chrono_literals;

// Collects the overruns the watchdog reports while it lives.
struct Seen {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<watchdog::Overrun> overruns;
  watchdog::Registration registration{[this](const watchdog::Overrun& o) {
    std::lock_guard lock(mutex);
    overruns.push_back(o);
    cv.notify_all();
  }};
  std::vector<watchdog::Overrun> waitFor(std::size_t n, std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex);
    cv.wait_for(lock, limit, [&] { return overruns.size() >= n; });
    return overruns;
  }
};

struct TimeoutScope {
  explicit TimeoutScope(std::chrono::nanoseconds t) { watchdog::setTimeout(t); }
  ~TimeoutScope() { watchdog::setTimeout(0ns); }
};

pid_t gettid_() {
  return static_cast<pid_t>(::syscall(SYS_gettid));
}

TEST(Watchdog, AnOverrunReachesTheHandlersOnceWithWhatTheCallWas) {
  const TimeoutScope timeout(100ms);
  Seen seen;
  const char* label = watchdog::intern("compressor 'slow' (/plugins/slow.so)");
  pid_t caller = 0;
  std::thread t([&] {
    caller = gettid_();
    const watchdog::WatchedCall call(label, "decompress", 7, 2);
    std::this_thread::sleep_for(600ms);  // six deadlines: still one report
  });
  t.join();
  const auto overruns = seen.waitFor(1, 2s);
  ASSERT_EQ(overruns.size(), 1u);
  const watchdog::Overrun& o = overruns[0];
  EXPECT_EQ(o.plugin, "compressor 'slow' (/plugins/slow.so)");
  EXPECT_EQ(o.call, "decompress");
  EXPECT_EQ(o.tensor, 7u);
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.thread, caller);
  EXPECT_GE(o.seconds, 0.1);
  EXPECT_EQ(o.message().rfind("rank 2: compressor 'slow' (/plugins/slow.so): decompress of tensor 7 has not returned "
                              "after ",
                              0),
            0u)
      << o.message();
  EXPECT_NE(o.message().find("(plugin_timeout 0.1 s)"), std::string::npos) << o.message();
  EXPECT_NE(watchdog::firstOverrun(), "");
}

TEST(Watchdog, CallsWithinTheDeadlineAndRemovedHandlersAreNotReported) {
  const TimeoutScope timeout(300ms);
  Seen seen;
  const char* label = watchdog::intern("scheduler 'quick' (/plugins/quick.so)");
  for (int i = 0; i < 2000; ++i) {
    const watchdog::WatchedCall call(label, "next", watchdog::kNoTensor, -1);
  }
  std::this_thread::sleep_for(400ms);
  EXPECT_TRUE(seen.waitFor(1, 10ms).empty());

  // A removed handler is not called, even for an overrun that happens after.
  std::vector<std::string> late;
  {
    watchdog::Registration gone([&](const watchdog::Overrun& o) { late.push_back(o.message()); });
  }
  {
    const watchdog::WatchedCall call(label, "next", watchdog::kNoTensor, -1);
    std::this_thread::sleep_for(500ms);
  }
  EXPECT_EQ(seen.waitFor(1, 2s).size(), 1u);
  EXPECT_TRUE(late.empty());
}

TEST(Watchdog, ADeadlineOfZeroWatchesNothing) {
  const TimeoutScope timeout(0ns);
  Seen seen;
  {
    const watchdog::WatchedCall call(watchdog::intern("compressor 'x' (x.so)"), "compress", 1, 0);
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE(seen.waitFor(1, 200ms).empty());
}

TEST(Watchdog, InternedLabelsAreSharedAndStable) {
  const char* a = watchdog::intern("compressor 'a' (a.so)");
  const char* b = watchdog::intern(std::string("compressor 'a' (a.so)"));
  EXPECT_EQ(a, b);
  EXPECT_STREQ(a, "compressor 'a' (a.so)");
}

// What the conformance suite's time limit reads (core/conformance/check_runner.cc): another thread's call in progress,
// with the round of a tensor call.
TEST(Watchdog, AnotherThreadSeesTheCallInProgressWithItsRound) {
  const char* label = watchdog::intern("compressor 'slow' (/plugins/slow.so)");
  std::mutex mutex;
  std::condition_variable cv;
  pid_t tid = 0;
  bool release = false;
  std::thread caller([&] {
    const watchdog::WatchedCall call(label, "decompress", 5, 2, 1);
    std::unique_lock lock(mutex);
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  std::unique_lock lock(mutex);
  cv.wait(lock, [&] { return tid != 0; });
  const watchdog::CallView v = watchdog::callOfThread(tid);
  release = true;
  lock.unlock();
  cv.notify_all();
  caller.join();
  EXPECT_EQ(v.plugin, label);
  EXPECT_STREQ(v.call, "decompress");
  EXPECT_EQ(v.tensor, 5u);
  EXPECT_EQ(v.rank, 2);
  EXPECT_EQ(v.round, 1);
  EXPECT_TRUE(v.in_call);
}

TEST(Crash, TheMessageNamesThePluginCallInProgressOrReturnedLast) {
  const char* label = watchdog::intern("compressor 'bad' (/plugins/bad.so)");
  std::string none, during, after;
  std::thread([&] {
    none = crash::describeForTest(SIGSEGV);
    {
      const watchdog::WatchedCall call(label, "compress", 3, 1);
      during = crash::describeForTest(SIGSEGV);
    }
    after = crash::describeForTest(SIGABRT);
  }).join();
  EXPECT_EQ(none, "died of SIGSEGV");
  EXPECT_EQ(during, "rank 1 died of SIGSEGV in compressor 'bad' (/plugins/bad.so), during compress of tensor 3");
  EXPECT_EQ(after.rfind("rank 1 died of SIGABRT after compressor 'bad' (/plugins/bad.so) returned from compress of "
                        "tensor 3 (the thread's last plugin call",
                        0),
            0u)
      << after;
}

std::string readFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Crash, AFatalSignalRewritesTheStatusAsFailedAndDiesOfIt) {
  const auto dir = std::filesystem::temp_directory_path() / ("terse_crash_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto status = dir / "status.json";
  { std::ofstream(status) << R"({"state":"running","records":0})" << '\n'; }
  // "fast" forks: the child writes the file this process named (a re-executed child would pick its own folder).
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(
      {
        crash::install();
        crash::StatusFile file(status.string(), "2026-01-02T03:04:05Z");
        file.setRecords(4);
        const watchdog::WatchedCall call(watchdog::intern("compressor 'boom' (/plugins/boom \"q\".so)"), "decompress",
                                         9, 0);
        ::raise(SIGSEGV);
      },
      ::testing::KilledBySignal(SIGSEGV),
      "terse: rank 0 died of SIGSEGV in compressor 'boom' \\(/plugins/boom \"q\".so\\), during decompress of tensor 9");
  const Json j = parseJson(readFile(status)).value();
  EXPECT_EQ(j.at("state"), "failed");
  EXPECT_EQ(j.at("records"), 4);
  EXPECT_EQ(j.at("started"), "2026-01-02T03:04:05Z");
  EXPECT_EQ(j.at("signal"), "SIGSEGV");
  EXPECT_EQ(j.at("plugin"), "compressor 'boom' (/plugins/boom \"q\".so)");  // escaped in the file, whole when read
  EXPECT_NE(j.at("error").get<std::string>().find("during decompress of tensor 9"), std::string::npos);
  const std::string updated = j.at("updated");
  ASSERT_EQ(updated.size(), 20u) << updated;  // 2026-12-02T07:31:25Z, from the handler's own date arithmetic
  EXPECT_EQ(updated[4], '-');
  EXPECT_EQ(updated[10], 'T');
  EXPECT_EQ(updated.back(), 'Z');
  std::filesystem::remove_all(dir);
}

TEST(Crash, FailRegisteredWritesEveryLiveStatusFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("terse_fail_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::string> written;
  {
    crash::StatusFile a((dir / "a.json").string(), "s");
    crash::StatusFile b((dir / "b.json").string(), "s");
    b.setRecords(2);
    written = crash::failRegistered("rank 1: a plugin hung", "compressor 'h' (h.so)");
  }
  EXPECT_EQ(written.size(), 2u);
  const Json j = parseJson(readFile(dir / "b.json")).value();
  EXPECT_EQ(j.at("state"), "failed");
  EXPECT_EQ(j.at("records"), 2);
  EXPECT_EQ(j.at("error"), "rank 1: a plugin hung");
  EXPECT_FALSE(j.contains("signal"));
  // Files whose owners are gone are not written again.
  std::filesystem::remove(dir / "a.json");
  EXPECT_TRUE(crash::failRegistered("later", "").empty());
  EXPECT_FALSE(std::filesystem::exists(dir / "a.json"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace terse
