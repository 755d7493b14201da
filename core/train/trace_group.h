// A group's phases as the aggregation engine runs them, in the step trace's terms (step_trace.h): the one translation
// of AggregationEngine::run's phase callback (engine.h) into TracePhase records, shared by both writers of step traces
// that drive the engine -- the trainer's GroupScheduler (group_scheduler.h) and the PyTorch hook's aggregator
// (experiments/python/ddp_aggregator.h) -- so that a codec phase, a size exchange and a gather are recorded alike
// whoever ran them.
#pragma once

#include <chrono>
#include <span>
#include <vector>

#include "core/compress/engine.h"
#include "core/train/step_trace.h"

namespace terse::train {

struct TracedGroupPhases {
  TraceGroup group;                            // its phases, in order (seq, chunks and issue_s are the caller's)
  std::vector<StepTraceRecorder::Span> spans;  // parallel to group.phases, for StepTraceRecorder::group

  // The engine's callback: a codec phase ("compress", "decompress") is one phase; a communication phase is one phase
  // per collective it ran (a size exchange and its gather are two), each with its own span.
  void add(const char* what, std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end,
           std::span<const PhaseCollective> collectives);
  // A GroupPhaseFn that calls add(); `this` must outlive the engine's run.
  GroupPhaseFn recorder();
};

}  // namespace terse::train
