// The checks the registry (suite.cc) runs, each Outcome check(Context&), listed by the file that holds them.
#pragma once

#include "core/conformance/check_context.h"

namespace terse::conformance {

// contract_checks.cc: one plugin instance on one rank. checkInstantiate sets c.instance and c.caps (c.instance stays
// empty when nothing else can run); checkSizes sets c.shapes to the shapes get_sizes accepted.
Outcome checkInstantiate(Context& c);
Outcome checkSizes(Context& c);
Outcome checkShapes(Context& c);
Outcome checkRoundTrip(Context& c);
Outcome checkOutputSize(Context& c);
Outcome checkDeterministic(Context& c);
Outcome checkSharedSeed(Context& c);
Outcome checkAccumulate(Context& c);
Outcome checkPurity(Context& c);
Outcome checkUnbiased(Context& c);

// output_checks.cc: what the outputs hold: finite decodes of finite inputs, no payload byte left unwritten, the input
// itself where the caps declare TERSE_CAP_IDENTITY.
Outcome checkFiniteDecode(Context& c);
Outcome checkZeroPadding(Context& c);
Outcome checkIdentity(Context& c);

// aggregation_checks.cc: the payloads of several simulated ranks combined as the caps say the core combines them.
Outcome checkSumAggregation(Context& c);
Outcome checkCustomReduce(Context& c);
Outcome checkAllgatherAggregation(Context& c);
Outcome checkMultiRound(Context& c);

// payload_fuzzing.cc: payloads as untrusted input.
Outcome checkWrongLength(Context& c);
Outcome checkWrongHeader(Context& c);
Outcome checkByteFlips(Context& c);
Outcome checkRandomPayloads(Context& c);
Outcome checkDeferredVerdicts(Context& c);

}  // namespace terse::conformance
