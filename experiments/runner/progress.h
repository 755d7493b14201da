// The progress line of a run (DESIGN.md section 7: epoch, step, accuracy so far, bytes so far, ETA), shared by the
// in-process runner (runner.cc) and the multi-process one (distributed.cc). Internal to experiments/runner.
#pragma once

#include "experiments/runner/room.h"  // the room's guard

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>

#include "experiments/runner/runner.h"

namespace terse::runner::detail {

inline std::string megabytes(uint64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / 1e6 << " MB";
  return s.str();
}

inline std::string clock(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  std::ostringstream o;
  if (s >= 3600)
    o << s / 3600 << ':' << std::setw(2) << std::setfill('0') << (s / 60) % 60;
  else
    o << s / 60;
  o << ':' << std::setw(2) << std::setfill('0') << s % 60;
  return o.str();
}

// The progress display, driven from rank 0's thread only.
class Progress {
 public:
  Progress(ProgressMode mode, std::ostream& out, std::string variant, int64_t epochs, int64_t total_steps,
           int64_t steps_per_epoch)
      : mode_(mode),
        out_(out),
        variant_(std::move(variant)),
        epochs_(epochs),
        total_(total_steps),
        per_epoch_(steps_per_epoch) {
    if (mode_ == ProgressMode::kAuto)
      mode_ = ::isatty(::fileno(stderr)) ? ProgressMode::kTerminal : ProgressMode::kLines;
  }
  ~Progress() { finish(); }

  void update(int64_t steps_done, double accuracy, uint64_t wire, double elapsed, bool eval_point) {
    if (mode_ == ProgressMode::kOff) return;
    if (mode_ == ProgressMode::kLines && !eval_point) return;
    // A terminal repaint at most 10 times a second: the line is for a human, not a log.
    if (mode_ == ProgressMode::kTerminal && !eval_point && steps_done != total_ && elapsed - last_ < 0.1) return;
    last_ = elapsed;
    std::ostringstream line;
    const int64_t epoch = std::min(epochs_, steps_done / per_epoch_ + (steps_done % per_epoch_ != 0 ? 1 : 0));
    line << '[' << variant_ << "] epoch " << std::max<int64_t>(epoch, 1) << '/' << epochs_ << " step " << steps_done
         << '/' << total_ << " acc ";
    if (accuracy >= 0)
      line << std::fixed << std::setprecision(3) << accuracy;
    else
      line << '-';
    const double eta =
        steps_done > 0 ? elapsed / static_cast<double>(steps_done) * static_cast<double>(total_ - steps_done) : 0;
    line << " wire " << megabytes(wire) << " eta " << clock(eta);
    if (mode_ == ProgressMode::kTerminal) {
      std::string s = line.str();
      const std::size_t width = s.size();
      if (s.size() < width_) s.append(width_ - s.size(), ' ');
      width_ = width;
      out_ << '\r' << s << std::flush;
      painted_ = true;
    } else {
      out_ << line.str() << '\n' << std::flush;
    }
  }
  void finish() {
    if (painted_) out_ << '\n' << std::flush;
    painted_ = false;
  }

 private:
  ProgressMode mode_;
  std::ostream& out_;
  std::string variant_;
  int64_t epochs_;
  int64_t total_;
  int64_t per_epoch_;
  double last_ = -1;
  std::size_t width_ = 0;
  bool painted_ = false;
};

}  // namespace terse::runner::detail
