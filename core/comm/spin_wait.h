// Spinning before sleeping, shared by the transports (DESIGN.md section 6): one spin step (over the CPU's pause hint in
// core/common/cpu_relax.h), the budget a waiter spins for, and how that budget is resolved from an option, an
// environment variable and a default.
//
// Why spin at all: a waiter that sleeps on a condition variable or in poll() pays a wake-up when its frame comes -- a
// futex wake and, in a virtual machine, the halt of an idle vCPU and the interrupt that ends it, tens of microseconds
// on the 2-vCPU machines measured, where the frame itself takes a few. Why yield while spinning: where ranks outnumber
// CPUs, the thread a waiter waits for is often runnable on the waiter's own CPU, and a spin that does not give it the
// CPU only delays it. The budget bounds the CPU a wait burns when the frame is late (the peer computes).
//
// A spin is real time only: in a simulation (core/sim) the actors share one OS thread, nothing changes while one
// spins, and the spin would burn host time for nothing; the transports turn it off there (inproc_transport.h).
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string_view>

#include "core/comm/job.h"
#include "core/common/cpu_relax.h"

namespace terse::comm {

// Hands the CPU to another runnable thread of this CPU, if any (it returns at once when there is none).
inline void yieldCpu() {
  (void)::sched_yield();
}

// One step of a yielding spin: a few pause hints, watching for the change between them, then -- if it did not come --
// the CPU to whatever else is runnable on it. Returns whether `changed()` held. Why the yield: a long unbroken run of
// pauses can make a guest's hypervisor deschedule the vCPU, and where ranks outnumber CPUs the thread waited for may
// be runnable on this very CPU. Why watch between the pauses rather than after the step: a step is eight pause hints
// (about 0.2 us on the EPYC measured) and a system call (another 0.2-0.5 us in a guest), and a change that came at its
// start waited for all of it: at 2 in-process ranks, a 4 KiB allreduce's hop paid that once per wait. The load of the
// watched word hits the waiter's own cache until the writer's store takes the line away, so watching costs nothing
// on the bus.
// The eight looks of a spin step, a pause hint after each that does not find the change.
template <class Changed>
bool pausesUntil(Changed& changed) {
  for (int i = 0; i < 8; ++i) {
    if (changed()) return true;
    cpuRelax();
  }
  return false;
}

template <class Changed>
bool spinStepUntil(Changed&& changed) {
  if (pausesUntil(changed)) return true;
  yieldCpu();
  return changed();
}

// One step of a spin that holds its CPU: spinStepUntil's pause hints and looks without the yield. For a waiter that
// must not hand its CPU to another process for a time slice (Link::await while backed off).
template <class Changed>
bool holdStepUntil(Changed&& changed) {
  return pausesUntil(changed) || changed();
}

// The largest spin budget accepted, in microseconds.
inline constexpr int kMaxSpinUs = 1000000;

// A wait's spin budget: started by the first running() of a wait (or the first after restart(), when the wait made
// progress), it lasts `budget` from then. A zero budget never runs.
class SpinBudget {
 public:
  using Clock = std::chrono::steady_clock;
  explicit SpinBudget(Clock::duration budget) : budget_(budget) {}
  bool running() { return budget_ > Clock::duration::zero() && running(Clock::now()); }
  // The same at `now`, a time the caller has just read.
  bool running(Clock::time_point now) {
    if (budget_ <= Clock::duration::zero()) return false;
    if (!started_) {
      started_ = true;
      start_ = now;
    }
    return now - start_ < budget_;
  }
  // Whether a budget that started (running() was called) has run for less than `limit` and less than itself at `now`.
  bool within(Clock::duration limit, Clock::time_point now) const {
    return started_ && now - start_ < std::min(budget_, limit);
  }
  void restart() { started_ = false; }

 private:
  Clock::duration budget_;
  bool started_ = false;
  Clock::time_point start_{};
};

// When a waiter should stop spinning for a while. A spin step yields the CPU; where another thread keeps that CPU busy
// (another process, or a peer computing), the yield hands it over for that thread's whole time slice, a millisecond or
// more, where a parked waiter's wake-up would have preempted it: beside two CPU-bound processes on 2 vCPUs such waits
// made a 4 KiB allreduce take 800 us. A step that takes longer than the wait's whole budget is such a stall, and ends
// the spin. Once the stalls since the first of a window (kStallWindow) add up to kStallTimeToBackOff, the waiter parks
// at once (no spin) for a while: 10 ms, doubled each time it happens again up to 1 s, halved by each spin that ends
// with its change.
//
// Why stalled time, not one stall: short stalls also happen on a quiet host, in bursts at a run's start (a peer rank
// still faulting in its buffers on the same CPU, the main thread starting the others: 4-5 stalls of 50-220 us within
// a millisecond, measured). A back-off on the first of them parked the thread for 10 ms, which is thousands of 4-KiB
// allreduces at the spin's pace: a 2,000-iteration benchmark then measured parking (5-7 us a call) where the spin
// gives 2.3-2.8. Under a CPU hog each stall is a time slice, so two or three of them reach the sum. The tcp transport's
// caller reads spin the same way and met the same hog: beside two CPU-bound processes a 4 KiB allreduce of 2 ranks took
// 1,004 us with their spin against 32 us without it. Not thread-safe: one per thread (threadSpinStalls()).
class SpinStalls {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kStallTimeToBackOff = std::chrono::milliseconds(2);
  static constexpr Clock::duration kStallWindow = std::chrono::milliseconds(100);
  static constexpr Clock::duration kMinBackoff = std::chrono::milliseconds(10);
  static constexpr Clock::duration kMaxBackoff = std::chrono::seconds(1);

  // Whether a wait starting at `now` may spin (false: it parks, backing off).
  bool maySpin(Clock::time_point now) const { return now >= park_until_; }
  // A spin step ended at `now` after `step`, against the wait's whole `budget`. Returns true when the step was a stall
  // (the caller stops spinning); stalls adding up to kStallTimeToBackOff within a window start a back-off.
  bool step(Clock::duration step, Clock::duration budget, Clock::time_point now) {
    if (step <= budget) return false;
    if (stalled_ == Clock::duration::zero() || now - first_stall_ > kStallWindow) {
      stalled_ = Clock::duration::zero();
      first_stall_ = now;
    }
    stalled_ += step;
    if (stalled_ >= kStallTimeToBackOff) backOff(now);
    return true;
  }
  // Runs one spin step (`step_fn`) and times it: step() above. A spin that reads the clock once per step anyway calls
  // step() with the time between two of its reads instead (the inproc transport's Link::await).
  template <class StepFn>
  bool timedStep(StepFn&& step_fn, Clock::duration budget) {
    const Clock::time_point before = Clock::now();
    step_fn();
    const Clock::time_point after = Clock::now();
    return step(after - before, budget, after);
  }
  // A spin ended with the change it waited for.
  void progressed() { backoff_ /= 2; }
  Clock::duration backoff() const { return backoff_; }
  // Starts a back-off at `now` as stalls adding up to kStallTimeToBackOff would: the tests' way to put a thread where a
  // CPU hog puts it.
  void backOff(Clock::time_point now) {
    stalled_ = Clock::duration::zero();
    backoff_ = std::clamp(backoff_ * 2, kMinBackoff, kMaxBackoff);
    park_until_ = now + backoff_;
  }
  // Waits that held their CPU while backed off (the inproc transport's Link::await), for tests.
  uint64_t heldSpins() const { return held_spins_; }
  void heldSpin() { ++held_spins_; }

 private:
  Clock::duration stalled_{};  // stalled time since first_stall_
  Clock::time_point first_stall_{};
  Clock::duration backoff_{};
  Clock::time_point park_until_{};
  uint64_t held_spins_ = 0;
};

// Moves a spinning thread off a CPU it shares with the thread it waits for. Two in-process ranks started at once can
// land on one CPU while another stays idle, and stay there: each hands the CPU to the other at every spin step, so
// neither is ever idle long enough, nor cold enough (the scheduler's migration cost, 0.5 ms), for the load balancer to
// move it. Measured on 2 vCPUs (`perf sched timehist`): both ranks of a 4 KiB allreduce on CPU 1 for a whole
// 2,000-iteration benchmark, 700 context switches each, CPU 0 idle: 4.5-7 us a call where apart they take 2.2-2.8.
// Open MPI binds its ranks to cores for the same reason; a thread of terse's cannot be bound (the threads it starts,
// a trainer's communication thread among them, would inherit the binding), so it is moved once and left free: its
// affinity is narrowed to another allowed CPU, which migrates it, and restored at once, which does not move it back.
//
// When: a spin that ends with its change finds the thread that made it last on this thread's own CPU
// (kSharedSpinsToMove times in a row), this thread's rank is the higher of the two (so that only one of a pair moves),
// and it has not moved within kMinMoveInterval (where ranks outnumber CPUs, sharing cannot be helped). Not
// thread-safe: one per thread (the transports keep it thread_local).
class CpuSharing {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kSharedSpinsToMove = 2;
  static constexpr Clock::duration kMinMoveInterval = std::chrono::milliseconds(100);

  // A spin ended with its change, made by rank `peer` last seen on CPU `peer_cpu` (-1: not known) while this thread,
  // rank `self`, ran on `own_cpu`. Returns whether the caller should move to another CPU now (moveToAnotherCpu).
  bool spinEnded(int self, int peer, int peer_cpu, int own_cpu, Clock::time_point now) {
    if (peer_cpu < 0 || peer_cpu != own_cpu || self < peer) {
      shared_ = 0;
      return false;
    }
    if (++shared_ < kSharedSpinsToMove || (moved_ && now - last_move_ < kMinMoveInterval)) return false;
    shared_ = 0;
    moved_ = true;
    last_move_ = now;
    return true;
  }

 private:
  int shared_ = 0;  // spins in a row that found the peer on this CPU
  bool moved_ = false;
  Clock::time_point last_move_{};
};

// The calling thread's stall book, shared by both transports' spins: stalls are a property of the CPU the thread runs
// on, whichever transport it waits in.
SpinStalls& threadSpinStalls();

// The CPU the calling thread runs on, -1 where it cannot be known.
int currentCpu();

// The CPUs the calling thread may run on (its affinity); 1 where that cannot be known.
int allowedCpus();

// Moves the calling thread to the next CPU after `from` that its affinity allows, leaving its affinity as it was.
// Returns false (and does nothing) where only one CPU is allowed or the system refuses.
bool moveToAnotherCpu(int from);

// A budget in microseconds: `option` when it is set (>= 0); else the variable `name` from `env` when set; else
// `fallback`. Throws InvalidArgument "<who>: <field> must be -1 (unset), 0 (off) or 1..1000000 microseconds, got N"
// for a bad option and "<name>='<value>': expected 0 (off) or 1..1000000 (<meaning>)" for a bad variable.
int resolveSpinMicroseconds(int option, std::string_view who, std::string_view field, const char* name,
                            const EnvLookup& env, int fallback, std::string_view meaning);

}  // namespace terse::comm
