#include "core/train/local_sgd_schedule.h"

#include <algorithm>
#include <cmath>

namespace terse::train {

int64_t localRoundLength(int64_t period, double qsr_alpha, double rate) {
  if (qsr_alpha <= 0) return period;
  if (!(std::isfinite(rate) && rate > 0)) return kLongestLocalRound;
  const double q = qsr_alpha / rate;
  const double h = std::floor(q * q);
  if (!(h < static_cast<double>(kLongestLocalRound))) return kLongestLocalRound;
  return std::max(period, static_cast<int64_t>(h));
}

std::vector<int64_t> scheduledAveragings(int64_t period, int64_t start_step, double qsr_alpha, int64_t total_steps,
                                         const std::function<double(int64_t)>& rate) {
  std::vector<int64_t> out;
  if (period < 1) return out;
  // d + h, saturating: h may be kLongestLocalRound.
  auto after = [](int64_t d, int64_t h) { return h > kLongestLocalRound - d ? kLongestLocalRound : d + h; };
  for (int64_t d = start_step; d < total_steps;) {
    if (qsr_alpha <= 0) {
      if (period > total_steps - d) break;
      d += period;
      out.push_back(d);
      continue;
    }
    int64_t end = after(d, localRoundLength(period, qsr_alpha, rate(std::max<int64_t>(d - 1, 0))));
    // A rate that rises inside the round shortens it to what that rate asks for, counted from the round's start
    // (at once if that is past).
    for (int64_t s = d + 1; s < end && s <= total_steps; ++s) {
      const int64_t shorter = after(d, localRoundLength(period, qsr_alpha, rate(s - 1)));
      if (shorter < end) end = std::max(shorter, s);
    }
    if (end > total_steps) break;
    d = end;
    out.push_back(d);
  }
  return out;
}

LocalSgdSchedule::LocalSgdSchedule(int64_t period, int64_t start_step, double qsr_alpha, int64_t total_steps,
                                   const std::function<double(int64_t)>& rate)
    : period_(period), start_(start_step), total_(total_steps), qsr_(qsr_alpha > 0) {
  if (qsr_ && period >= 1) ends_ = scheduledAveragings(period, start_step, qsr_alpha, total_steps, rate);
}

bool LocalSgdSchedule::averagesAfter(int64_t done) const noexcept {
  if (period_ < 1 || done <= start_ || done > total_) return false;
  if (qsr_) return std::binary_search(ends_.begin(), ends_.end(), done);
  return (done - start_) % period_ == 0;
}

int64_t LocalSgdSchedule::count() const noexcept {
  if (period_ < 1 || total_ <= start_) return 0;
  return qsr_ ? static_cast<int64_t>(ends_.size()) : (total_ - start_) / period_;
}

}  // namespace terse::train
