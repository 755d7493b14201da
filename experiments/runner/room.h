// The runner room's guard (DESIGN.md section 1). results/ (the writer and `terse compare`) sits beside the runner, not
// above it: it reads and writes results folders and must not run experiments, or comparing a study could start one.
// Every header of experiments/runner includes this one, and terse_results and terse_compare compile with
// TERSE_ROOM_RESULTS, so a results file that includes any of them does not compile (tests/core probes it and checks
// that every header carries this).
#pragma once

#ifdef TERSE_ROOM_RESULTS
#error "results/ cannot include experiments/runner (DESIGN.md section 1, experiments/runner/room.h)"
#endif
