#include "core/train/trace.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/common/error.h"
#include "core/common/json_string.h"

namespace terse::train {
namespace {

// Microseconds with three decimals: the format's unit, nanosecond resolution kept.
void appendMicros(std::string& out, int64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>((ns < 0 ? -ns : ns) % 1000));
  out += buf;
}

}  // namespace

TraceRecorder::TraceRecorder(int rank, Clock::time_point origin) : rank_(rank), origin_(origin) {}

void TraceRecorder::span(int tid, std::string name, std::string_view category, Clock::time_point start,
                         Clock::time_point end) {
  const auto ts = std::chrono::duration_cast<std::chrono::nanoseconds>(start - origin_).count();
  const auto dur = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
  std::lock_guard lock(mutex_);
  events_.push_back(Event{std::move(name), std::string(category), tid, ts, dur < 0 ? 0 : dur});
}

std::size_t TraceRecorder::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::string TraceRecorder::json() const {
  std::lock_guard lock(mutex_);
  std::string out = "{\"traceEvents\":[\n";
  const std::string pid = std::to_string(rank_);
  auto meta = [&](const char* what, int tid, const std::string& value) {
    out += "{\"name\":\"";
    out += what;
    out += "\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + std::to_string(tid) + ",\"args_name\":";
    appendJsonString(out, value);
    out += "},\n";
  };
  // Chrome reads names from args.name; a flat file keeps `terse trace merge` a line-by-line reader, so the merge
  // expands args_name into args (see experiments/cli/trace_command.cc).
  meta("process_name", 0, "rank " + pid);
  meta("thread_name", kComputeThread, "compute");
  meta("thread_name", kCommThread, "communication");
  for (std::size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    out += "{\"name\":";
    appendJsonString(out, e.name);
    out += ",\"cat\":";
    appendJsonString(out, e.category);
    out += ",\"ph\":\"X\",\"ts\":";
    appendMicros(out, e.ts_ns);
    out += ",\"dur\":";
    appendMicros(out, e.dur_ns);
    out += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.tid) + "}";
    out += i + 1 < events_.size() ? ",\n" : "\n";
  }
  if (events_.empty()) {
    // The metadata lines end with a comma; an empty timeline still needs a valid array.
    out.resize(out.size() - 2);
    out += "\n";
  }
  out += "]}\n";
  return out;
}

void TraceRecorder::write(const std::filesystem::path& path) const {
  const std::string text = json();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  TERSE_CHECK(f.good(), InvalidArgument, "trace: cannot write " << path);
  f << text;
  f.close();
  TERSE_CHECK(!f.fail(), InvalidArgument, "trace: writing " << path << " failed");
}

}  // namespace terse::train
