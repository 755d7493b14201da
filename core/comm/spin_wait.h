// Spinning before sleeping, shared by the transports (DESIGN.md section 6): the CPU's pause hint, one spin step, the
// budget a waiter spins for, and how that budget is resolved from an option, an environment variable and a default.
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
#include <string_view>

#include "core/comm/job.h"

namespace terse::comm {

// One step of a pure spin-wait: the CPU's pause hint, which yields the core's pipeline to its sibling hyperthread and
// saves power without giving up the time slice.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Hands the CPU to another runnable thread of this CPU, if any (it returns at once when there is none).
inline void yieldCpu() {
  (void)::sched_yield();
}

// One step of a yielding spin: a few pause hints (a load of the watched word costs little, but a check in a tight loop
// steals the bus and, in a guest, a long unbroken run of pauses can make the hypervisor deschedule the vCPU: the
// yield's system call breaks that run), then the CPU to whatever else is runnable on it.
inline void spinStep() {
  for (int i = 0; i < 8; ++i) cpuRelax();
  yieldCpu();
}

// The largest spin budget accepted, in microseconds.
inline constexpr int kMaxSpinUs = 1000000;

// A wait's spin budget: started by the first running() of a wait (or the first after restart(), when the wait made
// progress), it lasts `budget` from then. A zero budget never runs.
class SpinBudget {
 public:
  using Clock = std::chrono::steady_clock;
  explicit SpinBudget(Clock::duration budget) : budget_(budget) {}
  bool running() {
    if (budget_ <= Clock::duration::zero()) return false;
    const Clock::time_point now = Clock::now();
    if (!started_) {
      started_ = true;
      end_ = now + budget_;
    }
    return now < end_;
  }
  void restart() { started_ = false; }

 private:
  Clock::duration budget_;
  bool started_ = false;
  Clock::time_point end_{};
};

// When a waiter should stop spinning for a while. A spin step yields the CPU; where another thread keeps that CPU busy
// (another process, or a peer computing), the yield hands it over for that thread's whole time slice, a millisecond or
// more, where a parked waiter's wake-up would have preempted it: beside two CPU-bound processes on 2 vCPUs such waits
// made a 4 KiB allreduce take 800 us. A step that takes longer than the whole budget is such a stall. After
// kStallsToBackOff stalls within kStallWindow of the first, the waiter parks at once (no spin) for a while: 10 ms,
// doubled each time it happens again up to 1 s, halved by each spin that ends with its change.
//
// Why several stalls, not one: a lone stall also happens on a quiet host (a yield that ran the bench's main thread, a
// kernel worker, a peer still starting up: 60-200 us measured at a run's start), and one of them used to send the
// thread to parking for 10 ms, which is 1,600 4-KiB allreduces at the spin's pace: a 2,000-iteration benchmark then
// measured parking (6.6 us) where the spin gives 3.6. Under real contention the stalls come at every step, so the
// third arrives within a few slices. Not thread-safe: one per thread (the transports keep it thread_local).
class SpinStalls {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kStallsToBackOff = 3;
  static constexpr Clock::duration kStallWindow = std::chrono::milliseconds(100);
  static constexpr Clock::duration kMinBackoff = std::chrono::milliseconds(10);
  static constexpr Clock::duration kMaxBackoff = std::chrono::seconds(1);

  // Whether a wait starting at `now` may spin (false: it parks, backing off).
  bool maySpin(Clock::time_point now) const { return now >= park_until_; }
  // A spin step ended at `now` after `step`, against the wait's whole `budget`. Returns true when the step was a stall
  // (the caller stops spinning); the third stall in a window starts a back-off.
  bool step(Clock::duration step, Clock::duration budget, Clock::time_point now) {
    if (step <= budget) return false;
    if (stalls_ == 0 || now - first_stall_ > kStallWindow) {
      stalls_ = 0;
      first_stall_ = now;
    }
    if (++stalls_ >= kStallsToBackOff) {
      stalls_ = 0;
      backoff_ = std::clamp(backoff_ * 2, kMinBackoff, kMaxBackoff);
      park_until_ = now + backoff_;
    }
    return true;
  }
  // A spin ended with the change it waited for.
  void progressed() { backoff_ /= 2; }
  Clock::duration backoff() const { return backoff_; }

 private:
  int stalls_ = 0;
  Clock::time_point first_stall_{};
  Clock::duration backoff_{};
  Clock::time_point park_until_{};
};

// A budget in microseconds: `option` when it is set (>= 0); else the variable `name` from `env` when set; else
// `fallback`. Throws InvalidArgument "<who>: <field> must be -1 (unset), 0 (off) or 1..1000000 microseconds, got N"
// for a bad option and "<name>='<value>': expected 0 (off) or 1..1000000 (<meaning>)" for a bad variable.
int resolveSpinMicroseconds(int option, std::string_view who, std::string_view field, const char* name,
                            const EnvLookup& env, int fallback, std::string_view meaning);

}  // namespace terse::comm
