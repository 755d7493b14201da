// The simulated-time backend of core/common/runtime.h (DESIGN.md section 9): threads are SimGrid actors, locks and
// condition variables are SimGrid's, the clock is SimGrid's, and computation is measured and injected.
//
// Computation. SimGrid runs the actors of a simulation one at a time on one OS thread and switches only inside its own
// calls, so the CPU time the thread spends between an actor's return from one runtime call and its next call is that
// actor's computation alone, measured while nothing else competes for the thread (however loaded the host is). Before
// the next call takes effect the actor sleeps that long in simulated time, times its compute scale: so a notify, a
// send or a clock reading happens at the simulated instant the computation before it ends, and a caller that times
// itself with rt::now() measures simulated durations. This is SMPI's online CPU benchmarking (Clauss et al. 2011),
// applied to every thread of the run rather than between MPI calls only.
//
// Measuring on one OS thread also works when SimGrid runs each actor on a thread of its own (the thread context
// factory): the clock read is then that actor's thread's, and it is only read while the actor runs.
//
// The FLOP model instead ignores what the CPU did and takes computation from rt::work(flops) calls, at a configured
// device speed: times that depend on nothing but the config and the seed, bit for bit on any host.
//
// No computation at all (kNone) charges nothing: simulated time is the network's alone, the alpha-beta model's world,
// where a collective's time is its frames' latencies and bytes (scripts/validate-alpha-beta compares the two). Measured
// time would charge the simulator's own per-frame bookkeeping too, which at 256 ranks was most of a small allreduce's
// simulated time. Another model (a calibrated per-kernel table) is one more enumerator here, charged in work() like
// the FLOP model.
#pragma once

#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Mutex.hpp>

#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/runtime.h"

namespace terse::sim {

enum class ComputeModel {
  kMeasured,  // thread CPU time x compute_scale
  kFlops,     // rt::work(flops) / flops_per_second
  kNone,      // nothing: simulated time is the network's alone
};

// The spelling of the command line and of describe(): "measured", "flops", "none"; parseComputeModel returns nullopt
// for any other text, computeModelChoices() lists the names for messages.
std::optional<ComputeModel> parseComputeModel(std::string_view name);
std::string_view computeModelName(ComputeModel model);
std::string_view computeModelChoices();

struct ComputeOptions {
  ComputeModel model = ComputeModel::kMeasured;
  double compute_scale = 1.0;      // kMeasured: simulated seconds per measured CPU second (0.1: a 10x faster device)
  double flops_per_second = 1e11;  // kFlops: the device's speed
  // Throws InvalidArgument naming the field when out of range.
  void validate() const;
  // "measured thread CPU time x 1", "FLOP model at 1e+11 flop/s", "no computation (network time only)"
  std::string describe() const;
};

// The thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID).
double threadCpuSeconds() noexcept;

class SimRuntime final : public rt::Backend {
 public:
  // hosts[r]: rank r's host. `fatal` is called with a message when an actor's body throws (it must not return).
  SimRuntime(std::vector<simgrid::s4u::Host*> hosts, const ComputeOptions& compute,
             std::function<void(const std::string&)> fatal);

  bool simulated() const noexcept override { return true; }
  rt::Clock::time_point now() override;
  void sleepUntil(rt::Clock::time_point t) override;
  std::unique_ptr<rt::MutexImpl> makeMutex() override;
  std::unique_ptr<rt::CondVarImpl> makeCondVar() override;
  std::unique_ptr<rt::ThreadImpl> startThread(const std::string& name, int place, std::function<void()> fn) override;
  void uncounted(const std::function<void()>& fn) override;
  void setSlowdown(double factor) override;
  void work(double flops) override;
  // Runs fn on a new daemon actor on `host` (core/sim/network.h: the courier of arrival notices): nobody joins it,
  // SimGrid ends it once the run's other actors have ended, and its computation is not charged (it stands for no
  // device's work: a NIC ringing a doorbell).
  void spawnDaemon(const std::string& name, simgrid::s4u::Host* host, std::function<void()> fn);

  // Around the SimGrid calls an actor makes: settle() turns the computation since the last call into simulated time
  // (sleeping it; short ones are carried over), resume() starts measuring the next computation once a call that may
  // have let other actors run returns.
  void settle();
  void resume();
  // Held only across the SimGrid calls that block or wake a lock's or a condition variable's waiters (runtime.cc).
  simgrid::s4u::Mutex& internalMutex() { return *internal_; }
  // Simulated seconds since the simulation started, as a time point of the rt clock.
  rt::Clock::time_point toTimePoint(double sim_seconds) const;
  double toSimSeconds(rt::Clock::time_point t) const;
  // Total computation injected so far, simulated seconds (for tests and the provenance's bookkeeping).
  double injectedSeconds() const noexcept { return injected_s_; }

 private:
  struct ActorClock {
    double mark = 0;      // the thread's CPU seconds when the actor last resumed
    double pending = 0;   // measured but not yet slept, simulated seconds
    double slowdown = 1;  // a straggler's factor; 0 for an uncharged daemon (spawnDaemon)
    bool live = false;    // the actor exists (an entry of a pid not yet seen, or of an ended actor, does not)
  };
  // The actor of a thread, as slow as `slowdown` (its starter's; 0: uncharged), measured and ended as runtime.h says;
  // a daemon if `daemon`.
  simgrid::s4u::ActorPtr makeActor(const std::string& name, simgrid::s4u::Host* host, double slowdown, bool daemon,
                                   std::function<void()> fn);
  ActorClock& self();
  void account(ActorClock& a);
  // The thread's CPU seconds under the measured model, else 0: the FLOP model never reads the clock, whose system call
  // was a fifth of a simulated run's wall time (two per blocking call of every actor).
  double cpuMark() const noexcept { return compute_.model == ComputeModel::kMeasured ? threadCpuSeconds() : 0.0; }

  std::vector<simgrid::s4u::Host*> hosts_;
  ComputeOptions compute_;
  std::function<void(const std::string&)> fatal_;
  rt::Clock::time_point origin_;
  // By SimGrid actor id, which SimGrid hands out densely from 0 (the maestro) up: an index, where the hash map it
  // replaced was 3% of a 1,024-rank run's host time in cache misses. A deque: growing it at the end keeps references
  // valid, and callers hold self()'s across calls that let other actors run and start threads. One OS thread touches
  // it at a time.
  std::deque<ActorClock> actors_;
  simgrid::s4u::MutexPtr internal_;
  double injected_s_ = 0;
};

}  // namespace terse::sim
