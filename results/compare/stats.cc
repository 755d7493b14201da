// The t-interval, Welch's test and the paired test of stats.h (the t distribution itself is core/common/student_t.h).
#include "results/compare/stats.h"

#include <cmath>
#include <vector>

namespace terse::results {

namespace {
double sampleVariance(std::span<const double> v, double mean) {
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return ss / static_cast<double>(v.size() - 1);
}

double meanOf(std::span<const double> v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

}  // namespace

MeanInterval meanInterval(std::span<const double> values) {
  MeanInterval r;
  r.n = static_cast<int>(values.size());
  if (values.empty()) {
    r.mean = std::nan("");
    return r;
  }
  r.mean = meanOf(values);
  if (r.n >= 2) {
    const double s = std::sqrt(sampleVariance(values, r.mean));
    r.half_width = studentTQuantile(1 - kNoiseAlpha / 2, r.n - 1) * s / std::sqrt(static_cast<double>(r.n));
  }
  return r;
}

std::optional<double> welchP(std::span<const double> a, std::span<const double> b) {
  if (a.size() < 2 || b.size() < 2) return std::nullopt;
  const double ma = meanOf(a), mb = meanOf(b);
  const double va = sampleVariance(a, ma) / static_cast<double>(a.size());
  const double vb = sampleVariance(b, mb) / static_cast<double>(b.size());
  if (va + vb == 0) return ma == mb ? 1.0 : 0.0;
  const double t = (ma - mb) / std::sqrt(va + vb);
  const double df = (va + vb) * (va + vb) /
                    (va * va / static_cast<double>(a.size() - 1) + vb * vb / static_cast<double>(b.size() - 1));
  return 2 * (1 - studentTCdf(std::fabs(t), df));
}

std::optional<double> pairedP(std::span<const double> a, std::span<const double> b) {
  if (a.size() != b.size() || a.size() < 2) return std::nullopt;
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  const double md = meanOf(d);
  const double vd = sampleVariance(d, md) / static_cast<double>(d.size());
  // Every difference the same: t would be 0 / 0 or +-inf; say equal or not, as welchP does without spread.
  if (vd == 0) return md == 0 ? 1.0 : 0.0;
  const double t = md / std::sqrt(vd);
  return 2 * (1 - studentTCdf(std::fabs(t), static_cast<double>(d.size() - 1)));
}

const char* noiseTestName(NoiseTest test) {
  return test == NoiseTest::kPaired ? "paired" : "welch";
}

}  // namespace terse::results
