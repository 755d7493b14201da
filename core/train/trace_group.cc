#include "core/train/trace_group.h"

#include <string>
#include <string_view>

namespace terse::train {

void TracedGroupPhases::add(const char* what, std::chrono::steady_clock::time_point start,
                            std::chrono::steady_clock::time_point end, std::span<const PhaseCollective> collectives) {
  if (collectives.empty()) {
    TracePhase p;
    p.kind = std::string_view(what) == "compress" ? TracePhase::Kind::kCompress : TracePhase::Kind::kDecompress;
    group.phases.push_back(std::move(p));
    spans.emplace_back(start, end);
    return;
  }
  for (const PhaseCollective& c : collectives) {
    TracePhase p;
    p.kind = TracePhase::Kind::kCollective;
    p.op = c.op;
    p.algorithm = std::string(c.algorithm);
    p.dtype = std::string(dtypeName(c.dtype));
    p.bytes = c.bytes;
    p.rank_bytes.assign(c.rank_bytes.begin(), c.rank_bytes.end());
    group.phases.push_back(std::move(p));
    spans.emplace_back(c.start, c.end);
  }
}

GroupPhaseFn TracedGroupPhases::recorder() {
  return
      [this](const char* what, std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b,
             std::size_t, std::size_t, std::span<const PhaseCollective> collectives) { add(what, a, b, collectives); };
}

}  // namespace terse::train
