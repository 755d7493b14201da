// The checks of how a plugin's payloads combine across ranks, driven through the multi-rank simulator: payloads of
// several ranks combined the way the caps say the core will combine them (a SUM payload summed on the wire, a CUSTOM
// reduce folded in any order, ALLGATHER payloads decoded by every rank, multi-round plugins fed each round's
// aggregate), and the result compared with what the ranks contributed.
#include "core/conformance/checks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/common/dtype.h"
#include "core/conformance/message.h"

namespace terse::conformance {
namespace {

// ||aggregate decode - sum of per-rank decodes|| / sum of ||per-rank decode||: the normwise gap between the two sides
// of the ABI's invariant, scaled so rounding in the sum shows as about one ulp of the wire dtype.
double sumGap(const Step& s) {
  const std::size_t n = s.result[0].size();
  std::vector<double> sum(n, 0.0);
  double scale = 0;
  for (const auto& o : s.own) {
    for (std::size_t i = 0; i < n; ++i) sum[i] += o[i];
    scale += norm(o);
  }
  double d = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double e = s.result[0][i] - sum[i];
    d += e * e;
  }
  if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
  return scale == 0 ? std::sqrt(d) : std::sqrt(d) / scale;
}

}  // namespace

Outcome checkSumAggregation(Context& c) {
  if (c.caps.aggregation != Aggregation::kSum) return skip("aggregation is " + aggregationText(c.caps));
  const int w = c.options.world_size;
  // The wire sum rounds W - 1 times to the wire dtype (unit roundoff u: 2^-24 f32, 2^-11 f16, 2^-8 bf16), each time by
  // at most u of the running sum, so the gap is at most 2 (W - 1) u of the terms' total; twice that, plus room for the
  // decode's own f32 arithmetic. A payload that is not summable (scales summed with the values they scale, codes
  // summed as floats) misses by tens of percent.
  const double u = c.caps.wire_dtype == DType::kF32 ? 0x1p-24 : (c.caps.wire_dtype == DType::kF16 ? 0x1p-11 : 0x1p-8);
  const double tolerance = 4.0 * (w - 1) * u + 8.0 * w * 0x1p-24;
  double worst = 0;
  for (const auto& shape : c.moderate()) {
    Simulation sim = c.sim(shape, w);
    const RankInputs in = rankInputs(c, shape, 7, w);
    for (uint64_t step : {0, 1}) {
      const Step s = sim.run(step, in.pointers);
      if (!sim.issues().empty()) return fail(tag(shape) + ": " + sim.issues().front());
      const double gap = sumGap(s);
      worst = std::max(worst, gap);
      if (!(gap <= tolerance)) {
        return fail(cat(tag(shape), ", step ", step, ": decompress(sum of ", w, " payloads summed as ",
                        dtypeName(c.caps.wire_dtype), ") differs from the sum of the ranks' own decodes by ", gap,
                        " (normwise, relative; tolerance ", tolerance,
                        "): the payload is not summable as its caps claim"));
      }
    }
  }
  return pass(cat(w, " ranks, steps 0-1: decompress(wire sum) equals the sum of per-rank decodes within ", worst,
                  " (tolerance ", tolerance, "); sum headers identical; every rank decodes the aggregate identically"));
}

Outcome checkCustomReduce(Context& c) {
  if (c.caps.aggregation != Aggregation::kCustom) return skip("aggregation is " + aggregationText(c.caps));
  const int w = std::max(3, c.options.world_size);
  double worst_assoc = 0, worst_sum = 0;
  bool bytes_equal = true;
  for (const auto& shape : c.moderate()) {
    Simulation sim = c.sim(shape, w);
    const RankInputs in = rankInputs(c, shape, 8, w);
    const Step s = sim.run(0, in.pointers);
    if (!sim.issues().empty()) return fail(tag(shape) + ": " + sim.issues().front());
    const int last = sim.lastRound();
    const auto& p = s.payloads.back();
    const Bytes left = sim.reduce(0, 0, last, sim.reduce(0, 0, last, p[0], p[1]), p[2]);
    const Bytes right = sim.reduce(0, 0, last, p[0], sim.reduce(0, 0, last, p[1], p[2]));
    bytes_equal = bytes_equal && left == right;
    Floats dl(shape.numel, 0.0f), dr(shape.numel, 0.0f);
    sim.decompress(0, 0, left, -1, dl, false);
    sim.decompress(0, 0, right, -1, dr, false);
    const double scale = std::max(norm(dl), norm(dr));
    const double assoc = scale == 0 ? diffNorm(dl, dr) : diffNorm(dl, dr) / scale;
    worst_assoc = std::max(worst_assoc, assoc);
    if (!(assoc <= 1e-6)) {
      return fail(cat(tag(shape), ": (a + b) + c and a + (b + c) decode differently (normwise relative ", assoc,
                      "): reduce is not associative"));
    }
    // A CUSTOM reduction need not be a sum (signSGD's majority vote is not), so the gap to the sum of per-rank decodes
    // is reported, not required: the ABI asks only that each rank's own payload decodes to its contribution, which
    // the shapes and multi_round checks cover.
    if (w == 3) worst_sum = std::max(worst_sum, sumGap(s));
  }
  return pass(cat("(a + b) + c and a + (b + c) decode equal within ", worst_assoc,
                  bytes_equal ? " (byte-identical)" : "",
                  "; gap between the decoded aggregate and the sum of per-rank decodes (informational): ", worst_sum,
                  "; every rank folds and decodes identically"));
}

Outcome checkAllgatherAggregation(Context& c) {
  if (c.caps.aggregation != Aggregation::kAllgather) return skip("aggregation is " + aggregationText(c.caps));
  const int w = c.options.world_size;
  double worst = 0;
  for (const auto& shape : c.moderate()) {
    Simulation sim = c.sim(shape, w);
    const RankInputs in = rankInputs(c, shape, 9, w);
    const Step s = sim.run(0, in.pointers);
    if (!sim.issues().empty()) return fail(tag(shape) + ": " + sim.issues().front());
    // Every rank decodes every other rank's payload with its own scratch: the payload must carry all it needs.
    for (int k = 0; k < w; ++k) {
      for (int j = 0; j < w; ++j) {
        Floats d(shape.numel, 0.0f);
        sim.decompress(k, 0, s.payloads.back()[static_cast<std::size_t>(j)], j, d, false);
        if (int64_t at = firstBitDifference(d, s.own[static_cast<std::size_t>(j)]); at >= 0) {
          return fail(cat(tag(shape), ": rank ", k, " decodes rank ", j, "'s payload differently from rank ", j,
                          " itself at element ", at, ": the payload is not self-describing"));
        }
      }
    }
    worst = std::max(worst, sumGap(s));
    if (!(sumGap(s) <= 1e-5)) {
      return fail(cat(tag(shape), ": accumulating the ", w, " decodes differs from their sum by ", sumGap(s)));
    }
  }
  return pass(cat(w,
                  " ranks: every rank decodes every payload as its sender does, and the accumulated aggregate is "
                  "identical on every rank (within ",
                  worst, " of the sum)"));
}

Outcome checkMultiRound(Context& c) {
  if (c.caps.num_rounds == 1) return skip("one round");
  const std::vector<ConformanceShape> shapes = c.probes();
  if (shapes.empty()) return skip("no nonempty moderate shape");
  const int w = c.options.world_size;
  std::string text;
  for (const auto& shape : shapes) {
    Simulation sim = c.sim(shape, w);
    const RankInputs in = rankInputs(c, shape, 10, w);
    std::vector<double> truth(shape.numel, 0.0);
    for (const auto& v : in.values)
      for (uint64_t i = 0; i < shape.numel; ++i) truth[i] += v[i];
    Step s;
    for (uint64_t step : {0, 1, 2}) s = sim.run(step, in.pointers);  // the state (a warm start) carries across steps
    if (!sim.issues().empty()) return fail(tag(shape) + ": " + sim.issues().front());
    double num = 0, den = 0;
    for (uint64_t i = 0; i < shape.numel; ++i) {
      num += (s.result[0][i] - truth[i]) * (s.result[0][i] - truth[i]);
      den += truth[i] * truth[i];
    }
    text += cat(text.empty() ? "" : "; ", tag(shape), ": ");
    for (int r = 0; r < sim.rounds(); ++r)
      text += cat(r ? " + " : "", s.payloads[static_cast<std::size_t>(r)][0].size());
    text += cat(" B, aggregate vs sum of inputs rel error ", den == 0 ? 0 : std::sqrt(num / den));
  }
  return pass(cat("drove ", c.caps.num_rounds, " rounds x 3 steps x ", w,
                  " ranks, each round's prev the aggregate of the one before: ", text));
}

}  // namespace terse::conformance
