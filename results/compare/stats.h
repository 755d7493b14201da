// The statistics `terse compare` puts on a table of repeated runs (experiment.proto's `seeds`): the mean over seeds
// with a 95% Student t-interval, and Welch's t-test for "is this variant's difference from the baseline more than the
// seed-to-seed noise".
//
// Interval. For n seeds with mean m and sample standard deviation s (divisor n - 1), the 95% interval of the mean is
//   m +- t(0.975, n - 1) s / sqrt(n),
// Student's t quantile with n - 1 degrees of freedom (12.71 for 2 seeds, 4.30 for 3, 2.78 for 5): it assumes the
// per-seed values are independent draws from a normal distribution, which is as much as 3 seeds can support; with so
// few seeds the interval is wide on purpose. One seed has no interval.
//
// Noise. A variant's metric differs from the baseline's when Welch's unequal-variance t-test (Welch 1947) rejects
// equal means at the 5% level, two-sided:
//   t = (m_a - m_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b),
//   df = (s_a^2 / n_a + s_b^2 / n_b)^2 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))   (Satterthwaite),
//   p = 2 (1 - F_t(|t|; df)),
// and is "within noise" when p >= 0.05. It needs 2 seeds on each side; with no spread on either side (deterministic
// bytes) the means differ or they do not. Welch's test rather than "the intervals overlap": overlapping 95%
// intervals still allow differences significant at about the 1% level, so overlap would call real differences noise.
#pragma once

#include "results/compare/room.h"  // the room's guard

#include <optional>
#include <span>

#include "core/common/student_t.h"

namespace terse::results {

// The level of every interval and test above.
inline constexpr double kConfidence = 0.95;
inline constexpr double kNoiseAlpha = 1 - kConfidence;

struct MeanInterval {
  double mean = 0;
  int n = 0;
  std::optional<double> half_width;  // t(0.975, n - 1) s / sqrt(n); none for n < 2
};
// Of finite values; an empty input gives n = 0 and a NaN mean.
MeanInterval meanInterval(std::span<const double> values);

using terse::studentTCdf;  // core/common/student_t.h
using terse::studentTQuantile;

// The two-sided p-value of Welch's test above; none when either side has fewer than 2 values.
std::optional<double> welchP(std::span<const double> a, std::span<const double> b);

}  // namespace terse::results
