// Student's t (student_t.h), with the regularized incomplete beta function it rests on.
#include "core/common/student_t.h"

#include <cmath>
#include <limits>

namespace terse {

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

}  // namespace terse
