// The t-interval and Welch's test of stats.h, with the regularized incomplete beta function they rest on.
#include "results/compare/stats.h"

#include <cmath>
#include <limits>

namespace terse::results {

namespace {

// I_x(a, b) by its continued fraction (modified Lentz), used where it converges fast (x < (a + 1) / (a + b + 2)) and
// through the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) elsewhere (Numerical Recipes, 3rd ed., section 6.4).
double betaContinuedFraction(double a, double b, double x) {
  constexpr double kTiny = 1e-300, kEps = 1e-15;
  const double qab = a + b, qap = a + 1, qam = a - 1;
  double c = 1, d = 1 - qab * x / qap;
  if (std::fabs(d) < kTiny) d = kTiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = 1 + aa / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < kEps) break;
  }
  return h;
}

double regularizedBeta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * betaContinuedFraction(a, b, x) / a;
  return 1 - front * betaContinuedFraction(b, a, 1 - x) / b;
}

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

double studentTCdf(double t, double df) {
  if (std::isnan(t) || !(df > 0)) return std::nan("");
  if (std::isinf(t)) return t > 0 ? 1 : 0;
  const double tail = 0.5 * regularizedBeta(df / 2, 0.5, df / (df + t * t));
  return t >= 0 ? 1 - tail : tail;
}

double studentTQuantile(double p, double df) {
  if (!(p > 0 && p < 1) || !(df > 0)) return std::nan("");
  if (p == 0.5) return 0;
  if (p < 0.5) return -studentTQuantile(1 - p, df);
  double lo = 0, hi = 1;
  while (studentTCdf(hi, df) < p && hi < 1e300) hi *= 2;
  // 200 halvings take any bracket below 1e300 to the last bit of a double.
  for (int i = 0; i < 200 && hi - lo > std::numeric_limits<double>::epsilon() * hi; ++i) {
    const double mid = (lo + hi) / 2;
    (studentTCdf(mid, df) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

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

}  // namespace terse::results
