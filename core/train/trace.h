// A per-rank timeline in the Chrome trace event format (chrome://tracing, Perfetto): complete events ("ph":"X") with
// microsecond timestamps relative to an origin every rank of a run shares, pid = rank, tid = the thread (compute or
// communication). The trainer records compute per layer, waits, and per scheduler group compress / collective /
// decompress / update; the runner writes one file per rank (trace.rank<R>.json) and `terse trace merge` combines them.
//
// File layout (what `terse trace merge` reads back): the first line is `{"traceEvents":[`, then one event object per
// line, each a flat JSON object (no nested values) followed by a comma except the last, then `]}`.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace terse::train {

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kComputeThread = 0;
  static constexpr int kCommThread = 1;

  // `origin`: time zero of the timeline; ranks of one run pass the same one so their files line up when merged.
  TraceRecorder(int rank, Clock::time_point origin);

  // One complete event. Thread-safe (the compute and the communication thread both record).
  void span(int tid, std::string name, std::string_view category, Clock::time_point start, Clock::time_point end);

  int rank() const noexcept { return rank_; }
  std::size_t size() const;
  // The whole file as described above (thread and process names included as metadata events).
  std::string json() const;
  // Writes json() to `path` (replacing it); throws InvalidArgument naming the path when it cannot.
  void write(const std::filesystem::path& path) const;

 private:
  struct Event {
    std::string name;
    std::string category;
    int tid;
    int64_t ts_ns;
    int64_t dur_ns;
  };
  int rank_;
  Clock::time_point origin_;
  mutable std::mutex mutex_;  // guards events_
  std::vector<Event> events_;
};

}  // namespace terse::train
