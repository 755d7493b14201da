// Runs one conformance check, in this process or in a forked child of its own, and turns whatever happens (an
// Outcome, an exception, a signal, a time limit) into the Outcome the report records. suite.cc decides which.
#pragma once

#include <string>

#include "core/conformance/check_context.h"

namespace terse::conformance {

using CheckFn = Outcome (*)(Context&);

// Runs `fn` on `ctx` here; every exception becomes a FAIL with its message. Sets ctx.instantiated afterwards.
Outcome runCheckInProcess(CheckFn fn, Context& ctx);

// Runs `fn` in a child made by fork(): the child rebuilds the plugin instance when ctx.instantiated (the parent never
// holds one, so no plugin thread or lock is ever forked), runs runCheckInProcess and writes the Outcome and the parts
// of ctx later checks read (instantiated, caps, shapes, round_trip_error, next_tensor_id) to a pipe; the parent
// copies them into ctx. A child killed by a signal is a FAIL naming it, one still running after `timeout_s` seconds
// (0: no limit) is stopped and a FAIL naming the limit and the plugin call it was in (the child reports that itself;
// one that cannot is killed a grace period later, and its FAIL says it did not), one that exits without a complete
// result a FAIL with its exit status. Host memory only: see suite.cc for why the CUDA mode stays in process. Throws
// InternalError when pipe() or fork() fail (the machine's problem, not the plugin's).
Outcome runCheckInChild(CheckFn fn, Context& ctx, double timeout_s);

}  // namespace terse::conformance
