// The simulated-time backend of core/common/runtime.h (DESIGN.md section 9): threads are SimGrid actors, locks and
// condition variables are SimGrid's, the clock is SimGrid's, and computation is modeled per kernel and injected.
//
// Computation is what the actors' kernel regions (rt::Kernel) cost, and nothing else: the simulator's own work (frame
// matching, allocation, actor switches, the runtime's bookkeeping) and the glue between kernels are never charged.
// Before an actor's next runtime call takes effect it sleeps its kernels' cost in simulated time, so a notify, a send
// or a clock reading happens at the simulated instant the kernel before it ends, and a caller that times itself with
// rt::now() measures simulated durations. Three models price a kernel:
//
//   - Calibrated (the default): a table of each kernel's time on this CPU, measured before the simulation in isolation
//     (experiments/runner/calibration.h), looked up by the region's cost key, times compute_scale. The same table gives
//     the same times bit for bit, however loaded the host is while the simulation runs.
//   - Measured: the thread CPU time spent inside the regions, times compute_scale. SimGrid runs the actors one at a
//     time on one OS thread and switches only inside its own calls, so the CPU time between a region's start (or the
//     actor's return from a runtime call inside it) and its end (or the next call) is that actor's work alone. It is
//     SMPI's online CPU benchmarking (Clauss et al. 2011) restricted to the kernels. It still moves with what other
//     processes do to the caches and the memory bandwidth.
//   - FLOP model: the regions' flops at a configured device speed: times that depend on nothing but the config and the
//     seed, bit for bit on any host, blind to one codec costing more per element than another.
//
// Measuring on one OS thread also works when SimGrid runs each actor on a thread of its own (the thread context
// factory): the clock read is then that actor's thread's, and it is only read while the actor runs.
//
// No computation at all (kNone) charges nothing: simulated time is the network's alone, the alpha-beta model's world,
// where a collective's time is its frames' latencies and bytes (scripts/validate-alpha-beta compares the two).
#pragma once

#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Mutex.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/runtime.h"

namespace terse::sim {

enum class ComputeModel {
  kCalibrated,  // the cost table's seconds per kernel x compute_scale
  kMeasured,    // thread CPU time inside kernel regions x compute_scale
  kFlops,       // the regions' flops / flops_per_second
  kNone,        // nothing: simulated time is the network's alone
};

// Seconds of one kernel on the calibrated CPU (experiments/runner/calibration.h builds one for a run). Pure: the same
// cost gives the same seconds every time.
class CostTable {
 public:
  virtual ~CostTable() = default;
  virtual double seconds(const rt::Cost& cost) const = 0;
  virtual std::string describe() const = 0;  // provenance's words for it
};

// The spelling of the command line and of describe(): "calibrated", "measured", "flops", "none"; parseComputeModel
// returns nullopt for any other text, computeModelChoices() lists the names for messages.
std::optional<ComputeModel> parseComputeModel(std::string_view name);
std::string_view computeModelName(ComputeModel model);
std::string_view computeModelChoices();

struct ComputeOptions {
  ComputeModel model =
      ComputeModel::kMeasured;  // the config's default is kCalibrated (experiments/runner/calibration.h)
  double compute_scale = 1.0;   // kCalibrated, kMeasured: simulated seconds per CPU second (0.1: a 10x faster device)
  double flops_per_second = 1e11;          // kFlops: the device's speed
  std::shared_ptr<const CostTable> table;  // kCalibrated: required
  // Throws InvalidArgument naming the field when out of range.
  void validate() const;
  // "calibrated table (...) x 1", "measured thread CPU time in kernels x 1", "FLOP model at 1e+11 flop/s",
  // "no computation (network time only)"
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
  bool setStepFactor(double factor) override;
  void beginKernel() override;
  void endKernel(const rt::Cost& cost) override;
  void charge(const rt::Cost& cost) override;
  int suspendKernels() override;
  void resumeKernels(int depth) override;
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
    double mark = 0;         // the thread's CPU seconds when the actor last resumed
    double pending = 0;      // measured but not yet slept, simulated seconds
    double slowdown = 1;     // a straggler's factor; 0 for an uncharged daemon (spawnDaemon)
    bool live = false;       // the actor exists (an entry of a pid not yet seen, or of an ended actor, does not)
    int kernels = 0;         // open kernel regions: the measured model charges CPU time only while it is > 0
    double step_factor = 1;  // this step's compute noise, on top of slowdown (not inherited by threads it starts)
  };
  // The actor of a thread, as slow as `slowdown` (its starter's; 0: uncharged), measured and ended as runtime.h says;
  // a daemon if `daemon`.
  simgrid::s4u::ActorPtr makeActor(const std::string& name, simgrid::s4u::Host* host, double slowdown, bool daemon,
                                   std::function<void()> fn);
  ActorClock& self();
  // Charges the CPU time since the mark when the actor is inside a region (measured model), and moves the mark.
  void account(ActorClock& a);
  // The modeled cost of a kernel (calibrated or FLOP model; 0 when measured), in simulated seconds for this actor.
  double modeled(const ActorClock& a, const rt::Cost& cost) const;
  // The thread's CPU seconds under the measured model, else 0: the other models never read the clock, whose system
  // call was a fifth of a simulated run's wall time (two per blocking call of every actor). The measured model reads
  // it only inside regions.
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
