// Runs a piece of terse in simulated time (DESIGN.md section 9): a SimGrid engine with the cluster's platform, the
// simulated runtime installed (runtime.h) and a simulated network for the inproc transport (network.h), and `body` as
// the first actor, on rank 0's host; every thread it starts through core/common/runtime.h is an actor too.
//
// Isolation. SimGrid keeps one engine per process (a second one inherits the first one's clock and global state), and
// a run's variants, and a test binary's tests, each want a fresh one. So each simulation runs in a child process
// forked for it: the child builds the engine, runs the simulation and sends back what `body` returned (or the error
// that ended it) through a pipe, then exits without running the parent's exit handlers. Whatever the body reads is
// the parent's memory as it was at the fork (data already loaded is not loaded again); what it writes to files stays;
// what it changes in memory is lost with the child. The call is synchronous and the parent does nothing meanwhile.
//
// Errors end the simulation with their message, never a hang: an exception out of `body` or out of any actor's
// function, and a deadlock (every actor blocked with nothing left in flight: SimGrid detects it, the message names
// the blocked actors) are all thrown in the parent as SimulationError with that message. A child that dies without a
// word (a signal) is reported as such.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/comm/inproc_transport.h"
#include "core/common/error.h"
#include "core/sim/platform.h"
#include "core/sim/runtime.h"

namespace terse::sim {

struct SimulationOptions {
  PlatformSpec platform;
  ComputeOptions compute;  // how computation becomes simulated time (runtime.h)
};

class SimulationError : public Error {
 public:
  explicit SimulationError(const std::string& m) : Error(TERSE_ERR_INTERNAL, m) {}
};

// What a simulation's body sees of it.
struct SimulationContext {
  const SimulationOptions& options;
  std::shared_ptr<comm::FrameNetwork> network;  // for InprocOptions::network
};

// Runs body(context) as described above and returns its result. Throws SimulationError as described above, and
// InvalidArgument for invalid options (before forking).
std::string runSimulation(const SimulationOptions& options,
                          const std::function<std::string(const SimulationContext&)>& body);

}  // namespace terse::sim
