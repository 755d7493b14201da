// Student's t distribution, for the places that turn repeated measurements into a verdict: `terse compare`'s intervals
// over seeds (results/compare/stats.h) and the conformance suite's unbiasedness test (core/conformance). One
// definition, so both read the same quantiles.
#pragma once

namespace terse {

// The CDF with `df` > 0 degrees of freedom (not necessarily whole), through the regularized incomplete beta function:
// F(t) = 1 - I_x(df / 2, 1 / 2) / 2 for t >= 0, x = df / (df + t^2), F(-t) = 1 - F(t). NaN for df <= 0 or t NaN.
double studentTCdf(double t, double df);
// The p-quantile, p in (0, 1), by bisection on the CDF to the last bit of a double. NaN outside.
double studentTQuantile(double p, double df);

}  // namespace terse
