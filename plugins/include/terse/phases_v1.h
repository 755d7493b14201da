/* terse optional compressor entry point, version 1: the steps at which an instance's work per call changes.
 *
 * Additive to the compressor ABI v1, which stays as released (compressor_v1.h): beside its one struct, a compressor
 * plugin library MAY export a function of type terse_compressor_phases_fn_v1 named terse_compressor_phases_v1. The
 * core looks it up by name when it loads the file; a plugin without it loads and runs as before, as one phase. Why a
 * separate symbol and not a new member of the v1 struct: its size and every offset are frozen (tests/abi), and old
 * cores must keep loading new plugins.
 *
 * Why. A compressor whose work depends on the step -- a warm-up whose ratio falls in stages, as DGC's (Lin et al.
 * 2018, section 3.4; terse's dgc plugin, warmup_steps) -- costs more at some steps than at others. A core that prices
 * each call from one measurement of the compressor (terse's CALIBRATED simulation: experiments/runner/calibration.h)
 * would otherwise measure one step and charge every step that: a warm-up's densest stage, for the whole run. With this
 * entry point it measures a step of each phase and charges each step its own phase's time.
 *
 * The contract: stores in *steps an array of *num_steps steps, strictly increasing, each above 0, at most
 * TERSE_MAX_PHASES_V1 of them. Phase 0 is steps [0, steps[0]), phase i the steps [steps[i - 1], steps[i]), the last
 * one every step from steps[num_steps - 1] on. Within a phase the calls do the same work for the same input and
 * state (a plugin's random draws may differ from step to step); the steps named are where that may change. No
 * entries (num_steps 0) is one phase, as without the entry point. The array is owned by the instance and stays valid
 * and unchanged until finalize. Pure (the same answer every time), does not block, may run on any thread. Returns
 * TERSE_OK, or TERSE_ERR_INVALID_ARGUMENT when `steps` or `num_steps` is NULL (then writes nothing); `ctx` is what
 * init stored, NULL included. The core asks once, right after init, and refuses the instance (finalizing it) when the
 * call fails or its steps break these rules, naming the plugin. Each phase costs a core that times phases one more
 * measurement of the codec: keep them to where the work really changes.
 *
 * The C++ helper <terse/sdk.hpp> exports it for every compressor it builds, from sdk::Compressor::phaseSteps()
 * (empty unless the class overrides it). */
#ifndef TERSE_PHASES_V1_H_
#define TERSE_PHASES_V1_H_

#include "terse/types_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERSE_COMPRESSOR_PHASES_V1_SYMBOL "terse_compressor_phases_v1"

/* The most phase boundaries an instance may report: a core measures a step of each phase. */
#define TERSE_MAX_PHASES_V1 64

typedef terse_status_v1 (*terse_compressor_phases_fn_v1)(void* ctx, const uint64_t** steps, size_t* num_steps);

#ifdef __cplusplus
}
#endif

#endif /* TERSE_PHASES_V1_H_ */
