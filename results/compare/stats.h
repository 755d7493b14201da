// The statistics `terse compare` puts on a table of repeated runs (experiment.proto's `seeds`): the mean over seeds
// with a 95% Student t-interval, and a t-test for "is this variant's difference from the baseline more than the
// seed-to-seed noise": paired on the per-seed differences when both ran the same seeds, else Welch's.
//
// Interval. For n seeds with mean m and sample standard deviation s (divisor n - 1), the 95% interval of the mean is
//   m +- t(0.975, n - 1) s / sqrt(n),
// Student's t quantile with n - 1 degrees of freedom (12.71 for 2 seeds, 4.30 for 3, 2.78 for 5): it assumes the
// per-seed values are independent draws from a normal distribution, which is as much as 3 seeds can support; with so
// few seeds the interval is wide on purpose. One seed has no interval.
//
// Noise. A variant's metric differs from the baseline's when a two-sided t-test rejects equal means at the 5% level,
// and is "within noise" when p >= 0.05. Which test depends on the seeds:
//
// Paired, when the variant and the baseline have the metric at the same seeds (2 or more). A seed fixes the
// initialisation and the data order for every variant, so much of the seed-to-seed spread is shared by the two rows
// and cancels in the per-seed difference d_i = a_i - b_i. The test is the one-sample t-test of mean(d) = 0:
//   t = mean(d) / (s_d / sqrt(n)),  df = n - 1,  p = 2 (1 - F_t(|t|; df)).
// An unpaired test charges the shared spread to both sides: a variant 8.8% faster than the baseline at each of 3 seeds,
// where the seeds' times differ by 7.7% (standard deviation over mean), has p = 0.22 by Welch's test and 0.002 paired
// (tests/results/repeats_test.cc, Stats.PairedSeesWhatWelchCannot).
//
// Welch's unequal-variance t-test (Welch 1947) otherwise (different seeds, a seed missing on one side, or runs whose
// seed is not known):
//   t = (m_a - m_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b),
//   df = (s_a^2 / n_a + s_b^2 / n_b)^2 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))   (Satterthwaite),
//   p = 2 (1 - F_t(|t|; df)).
// It needs 2 seeds on each side. With no spread (no spread on either side for Welch's, every per-seed difference the
// same for the paired test: deterministic bytes) there is no noise to weigh a difference against: p = 1 when the
// means are equal, 0 when they are not. A t-test rather than "the intervals overlap": overlapping 95% intervals still
// allow differences significant at about the 1% level, so overlap would call real differences noise.
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

// The two-sided p-value of the paired test above, a[i] paired with b[i]; none unless both have the same size, 2 or
// more.
std::optional<double> pairedP(std::span<const double> a, std::span<const double> b);

// Which test gave a p-value against the baseline, as the JSON names it.
enum class NoiseTest { kPaired, kWelch };
const char* noiseTestName(NoiseTest test);  // "paired", "welch"

}  // namespace terse::results
