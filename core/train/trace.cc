#include "core/train/trace.h"

#include <algorithm>

#include <fstream>
#include <sstream>
#include <vector>

#include "core/common/error.h"
#include "core/common/json.h"

namespace terse::train {
namespace {

// Microseconds, the format's unit; a double keeps nanosecond resolution for 2^53 ns (104 days) of trace.
double micros(int64_t ns) {
  return static_cast<double>(ns) / 1000.0;
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
  // One event per line, so `terse trace merge` reads a file line by line (experiments/cli/trace_command.cc).
  std::vector<std::string> lines;
  auto meta = [&](const char* what, int tid, const std::string& value) {
    // Chrome reads names from args.name; a flat line keeps the merge a reader of flat objects, so the merge
    // expands args_name into args.
    lines.push_back(dumpJson(Json{{"name", what}, {"ph", "M"}, {"pid", rank_}, {"tid", tid}, {"args_name", value}}));
  };
  meta("process_name", 0, "rank " + std::to_string(rank_));
  meta("thread_name", kComputeThread, "compute");
  meta("thread_name", kCommThread, "communication");
  // The sync trainer's lanes (max_groups_in_flight > 1): lane k records its groups on kCommThread + k.
  int lanes = 0;
  for (const Event& e : events_) lanes = std::max(lanes, e.tid - kCommThread);
  for (int k = 1; k <= lanes; ++k) meta("thread_name", kCommThread + k, "lane " + std::to_string(k));
  for (const Event& e : events_) {
    lines.push_back(dumpJson(Json{{"name", e.name},
                                  {"cat", e.category},
                                  {"ph", "X"},
                                  {"ts", micros(e.ts_ns)},
                                  {"dur", micros(e.dur_ns)},
                                  {"pid", rank_},
                                  {"tid", e.tid}}));
  }
  std::string out = "{\"traceEvents\":[\n";
  for (std::size_t i = 0; i < lines.size(); ++i) out += lines[i] + (i + 1 < lines.size() ? ",\n" : "\n");
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
