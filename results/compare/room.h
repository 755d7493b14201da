// The compare room's guard (DESIGN.md section 1). results/compare reads results folders back; the runner writes them
// (results/result_writer.h) and must not depend on how they are read, or a change to a table would reach into a run.
// Every header of results/compare includes this one, and terse_runner compiles with TERSE_ROOM_RUNNER, so a runner
// file that includes any of them does not compile (tests/core probes it and checks that every header carries this).
#pragma once

#ifdef TERSE_ROOM_RUNNER
#error "experiments/runner cannot include results/compare (DESIGN.md section 1, results/compare/room.h)"
#endif
