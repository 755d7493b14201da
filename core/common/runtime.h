// The runtime the threads of a run live in (DESIGN.md section 9): a clock, sleeps, threads, mutexes and condition
// variables, behind one small interface with two implementations.
//
//   - Real time (the default): std::thread, std::mutex, std::condition_variable and steady_clock. What core did before
//     this file existed, at the same cost (one virtual call per lock).
//   - Simulated time (core/sim/runtime.h, installed for the length of one simulation): every thread is a SimGrid actor,
//     the actors of a process run one at a time, blocking is blocking in simulated time, and now() is the simulated
//     clock. The CPU time an actor spends between two calls into this runtime is its computation: the simulated
//     backend turns it into simulated time (times a configured scale) before the next call takes effect, as SimGrid's
//     SMPI does for MPI programs. So code that times itself with now() around a computation gets that computation's
//     simulated duration, and a notify or a send happens at the simulated instant the computation before it ended.
//
// Code that may run in a simulation must block only through this file: a std::condition_variable or a spin on an
// atomic would stop the one thread all actors share. A std::mutex stays fine where it is never held across a call
// into this runtime (nothing else runs while an actor computes).
//
// Which implementation an object uses is fixed when it is created: the backend installed at that moment.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace terse::rt {

// Every time point in core is a steady_clock time point; in a simulation it is an origin plus simulated seconds.
using Clock = std::chrono::steady_clock;

class MutexImpl {
 public:
  virtual ~MutexImpl() = default;
  virtual void lock() = 0;
  virtual void unlock() = 0;
  virtual bool tryLock() = 0;
};

class CondVarImpl {
 public:
  virtual ~CondVarImpl() = default;
  // `mutex` is held and was made by the same backend.
  virtual void wait(MutexImpl& mutex) = 0;
  virtual std::cv_status waitUntil(MutexImpl& mutex, Clock::time_point deadline) = 0;
  virtual void notifyOne() = 0;
  virtual void notifyAll() = 0;
};

class ThreadImpl {
 public:
  virtual ~ThreadImpl() = default;
  virtual void join() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual bool simulated() const noexcept = 0;
  virtual Clock::time_point now() = 0;
  virtual void sleepUntil(Clock::time_point t) = 0;
  virtual std::unique_ptr<MutexImpl> makeMutex() = 0;
  virtual std::unique_ptr<CondVarImpl> makeCondVar() = 0;
  // Runs fn on a new thread. `place`: the rank whose machine the thread belongs to (a simulation puts the actor on
  // that rank's host), or -1 for the caller's.
  virtual std::unique_ptr<ThreadImpl> startThread(const std::string& name, int place, std::function<void()> fn) = 0;
  // Runs fn without counting its CPU time as computation: the copy of a received frame, which a real NIC's DMA does
  // (a simulation times the transfer on the network instead).
  virtual void uncounted(const std::function<void()>& fn) { fn(); }
  // The calling thread's computation takes `factor` times as long from now on (a straggler's slower device); real time
  // ignores it (the trainer sleeps instead).
  virtual void setSlowdown(double /*factor*/) {}
  // Computation of `flops` floating-point operations, as a FLOP-count model sees it. A simulation whose computation is
  // measured ignores it (the measurement sees the work itself), as does real time; a simulation with the FLOP model
  // takes its time from these calls alone.
  virtual void work(double /*flops*/) {}
};

// The backend installed now: the real-time one unless a simulation installed its own.
Backend& backend() noexcept;
// Installs `b` (nullptr: back to real time). For core/sim's simulation driver; not thread-safe.
void installBackend(Backend* b) noexcept;
inline bool simulated() noexcept {
  return backend().simulated();
}

inline Clock::time_point now() {
  return backend().now();
}
inline void sleepUntil(Clock::time_point t) {
  backend().sleepUntil(t);
}
template <class Rep, class Period>
void sleepFor(std::chrono::duration<Rep, Period> d) {
  const Clock::time_point t0 = now();
  sleepUntil(t0 + std::chrono::duration_cast<Clock::duration>(d));
}
inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
inline void uncounted(const std::function<void()>& fn) {
  backend().uncounted(fn);
}
inline void work(double flops) {
  backend().work(flops);
}

// Lockable: use with std::lock_guard, std::unique_lock and std::scoped_lock.
class Mutex {
 public:
  Mutex() : impl_(backend().makeMutex()) {}
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void lock() { impl_->lock(); }
  void unlock() { impl_->unlock(); }
  bool try_lock() { return impl_->tryLock(); }
  MutexImpl& impl() noexcept { return *impl_; }

 private:
  std::unique_ptr<MutexImpl> impl_;
};

class CondVar {
 public:
  CondVar() : impl_(backend().makeCondVar()) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void wait(std::unique_lock<Mutex>& lock) { impl_->wait(lock.mutex()->impl()); }
  template <class Pred>
  void wait(std::unique_lock<Mutex>& lock, Pred pred) {
    while (!pred()) wait(lock);
  }
  std::cv_status waitUntil(std::unique_lock<Mutex>& lock, Clock::time_point deadline) {
    return impl_->waitUntil(lock.mutex()->impl(), deadline);
  }
  // True when pred holds, false at the deadline.
  template <class Pred>
  bool waitUntil(std::unique_lock<Mutex>& lock, Clock::time_point deadline, Pred pred) {
    while (!pred()) {
      if (waitUntil(lock, deadline) == std::cv_status::timeout) return pred();
    }
    return true;
  }
  template <class Rep, class Period, class Pred>
  bool waitFor(std::unique_lock<Mutex>& lock, std::chrono::duration<Rep, Period> d, Pred pred) {
    return waitUntil(lock, now() + std::chrono::duration_cast<Clock::duration>(d), std::move(pred));
  }
  void notify_one() { impl_->notifyOne(); }
  void notify_all() { impl_->notifyAll(); }

 private:
  std::unique_ptr<CondVarImpl> impl_;
};

// A joinable thread like std::thread (an unjoined one at destruction is joined, not a terminate: every owner in core
// stops its thread before it goes, and a forgotten join must not abort a simulation).
class Thread {
 public:
  Thread() = default;
  Thread(const std::string& name, std::function<void()> fn, int place = -1)
      : impl_(backend().startThread(name, place, std::move(fn))) {}
  Thread(Thread&&) noexcept = default;
  Thread& operator=(Thread&& o) noexcept {
    if (this != &o) {
      if (impl_) impl_->join();
      impl_ = std::move(o.impl_);
    }
    return *this;
  }
  ~Thread() {
    if (impl_) impl_->join();
  }
  bool joinable() const noexcept { return impl_ != nullptr; }
  void join() {
    if (impl_) impl_->join();
    impl_.reset();
  }

 private:
  std::unique_ptr<ThreadImpl> impl_;
};

}  // namespace terse::rt
