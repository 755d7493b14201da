// The check Context's choice of shapes and seeds (check_context.h): which shapes each kind of check runs on, and the
// per-purpose input seeds that keep one suite run reproducible from ConformanceOptions::seed.
#include "core/conformance/check_context.h"

#include "core/common/dtype.h"

namespace terse::conformance {

Simulation Context::sim(const ConformanceShape& s, int world) {
  return Simulation(instance, memory, s, world, options.seed, tensorId());
}

uint64_t Context::inputSeed(const ConformanceShape& s, uint64_t purpose, int rank) const {
  return mixSeed(options.seed, purpose * 1000003u + s.numel, static_cast<uint64_t>(rank) + 17u * s.shape[0]);
}

std::vector<ConformanceShape> Context::moderate() const {
  std::vector<ConformanceShape> out;
  for (const auto& s : shapes)
    if (s.numel <= kModerateNumel) out.push_back(s);
  return out;
}

std::optional<ConformanceShape> Context::representative() const {
  std::optional<ConformanceShape> best;
  auto better = [](const ConformanceShape& a, const ConformanceShape& b) {
    const bool a_big = a.numel >= kRoundTripMinNumel, b_big = b.numel >= kRoundTripMinNumel;
    if (a_big != b_big) return a_big;
    if ((a.ndim == 0) != (b.ndim == 0)) return a.ndim == 0;
    return a_big ? a.numel < b.numel : a.numel > b.numel;
  };
  for (const auto& s : moderate())
    if (s.numel > 0 && (!best || better(s, *best))) best = s;
  return best;
}

std::vector<ConformanceShape> Context::probes() const {
  std::vector<ConformanceShape> out;
  auto rep = representative();
  if (rep) out.push_back(*rep);
  for (const auto& s : moderate())
    if (s.ndim > 0 && s.numel > 0 && (!rep || s.label() != rep->label())) out.push_back(s);
  return out;
}

std::optional<ConformanceShape> Context::smallest() const {
  std::optional<ConformanceShape> best;
  for (const auto& s : shapes)
    if (s.numel > 0 && (!best || s.numel < best->numel)) best = s;
  return best;
}

std::string aggregationText(const CompressorCaps& c) {
  std::string s(aggregationName(c.aggregation));
  if (c.aggregation == Aggregation::kSum) s += " (wire " + std::string(dtypeName(c.wire_dtype)) + ")";
  return s;
}

RankInputs rankInputs(const Context& c, const ConformanceShape& shape, uint64_t purpose, int world) {
  RankInputs in;
  for (int k = 0; k < world; ++k) in.values.push_back(normalInput(shape.numel, c.inputSeed(shape, purpose, k)));
  for (const auto& v : in.values) in.pointers.push_back(&v);
  return in;
}

}  // namespace terse::conformance
