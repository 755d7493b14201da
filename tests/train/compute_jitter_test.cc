// The per-step compute jitter draw (core/train/compute_jitter.h): a delay only, keyed by (seed, worker, step) and
// nothing else, with the mean of exp(sigma |Z|).
#include "core/train/compute_jitter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/common/error.h"

namespace terse::train {
namespace {

TEST(ComputeJitter, OffIsExactlyOne) {
  const ComputeJitter off{.sigma = 0, .seed = 7, .worker = 3};
  for (int64_t s = 0; s < 100; ++s) EXPECT_EQ(off.factor(s), 1.0);
}

TEST(ComputeJitter, AtLeastOneAndKeyedBySeedWorkerAndStep) {
  const ComputeJitter j{.sigma = 0.7, .seed = 11, .worker = 2};
  int differ_worker = 0, differ_seed = 0, differ_step = 0;
  for (int64_t s = 0; s < 1000; ++s) {
    const double f = j.factor(s);
    EXPECT_GE(f, 1.0) << "step " << s;
    EXPECT_TRUE(std::isfinite(f)) << "step " << s;
    // Deterministic: the same key gives the same factor, whatever was drawn in between.
    EXPECT_EQ(ComputeJitter(j).factor(s), f) << "step " << s;
    differ_worker += ComputeJitter{.sigma = 0.7, .seed = 11, .worker = 3}.factor(s) != f;
    differ_seed += ComputeJitter{.sigma = 0.7, .seed = 12, .worker = 2}.factor(s) != f;
    differ_step += j.factor(s + 1) != f;
  }
  EXPECT_EQ(j.factor(500), j.factor(500));
  EXPECT_EQ(differ_worker, 1000);
  EXPECT_EQ(differ_seed, 1000);
  EXPECT_EQ(differ_step, 1000);
}

TEST(ComputeJitter, MeanIsTwoExpHalfSigmaSquaredPhiSigma) {
  // E[exp(sigma |Z|)] = 2 exp(sigma^2 / 2) Phi(sigma). 200,000 draws: the standard error of the mean is below 0.3% of
  // it for these sigmas; the tolerance is 1.5%.
  for (const double sigma : {0.1, 0.5, 1.0}) {
    const ComputeJitter j{.sigma = sigma, .seed = 5, .worker = 1};
    const int n = 200000;
    double sum = 0;
    for (int64_t s = 0; s < n; ++s) sum += j.factor(s);
    const double phi = 0.5 * (1 + std::erf(sigma / std::sqrt(2.0)));
    const double expected = 2 * std::exp(sigma * sigma / 2) * phi;
    EXPECT_NEAR(sum / n, expected, 0.015 * expected) << "sigma " << sigma;
  }
}

TEST(ComputeJitter, RefusesABadSigma) {
  for (const double sigma : {-0.5, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    const ComputeJitter j{.sigma = sigma, .seed = 1, .worker = 0};
    try {
      j.factor(0);
      ADD_FAILURE() << "sigma " << sigma << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("compute_jitter must be a finite sigma >= 0"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace terse::train
