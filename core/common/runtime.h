// The runtime the threads of a run live in (DESIGN.md section 9): a clock, sleeps, threads, mutexes and condition
// variables, behind one small interface with two implementations.
//
//   - Real time (the default): std::thread, std::mutex, std::condition_variable and steady_clock. What core did before
//     this file existed, at the same cost (one virtual call per lock).
//   - Simulated time (core/sim/runtime.h, installed for the length of one simulation): every thread is a SimGrid actor,
//     the actors of a process run one at a time, blocking is blocking in simulated time, and now() is the simulated
//     clock. An actor's computation is its kernels: the regions a call site opens with rt::Kernel around a piece of
//     model or codec work, each with a Cost that says what the work is (forward of layer L over so many examples, a
//     codec's compress of so many elements, a sum, an optimizer update, with its FLOP count). The simulated backend
//     turns each into simulated time before the next call takes effect, by the configured compute model: the
//     calibrated table's time for the cost's key, its flops at a device speed, or the thread CPU time spent inside the
//     region (SimGrid's SMPI benchmarks the code between MPI calls the same way). CPU time outside every region --
//     the runtime's and the simulator's own bookkeeping, frame matching, queues, the trainer's glue -- is never
//     charged. So code that times itself with now() around a kernel gets its simulated duration, and a notify or a
//     send happens at the simulated instant the kernel before it ended.
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
#include <string_view>

namespace terse::rt {

// Every time point in core is a steady_clock time point; in a simulation it is an origin plus simulated seconds.
using Clock = std::chrono::steady_clock;

// What a kernel is, for the compute models of a simulation: the calibrated table's key is (kind, layer or round,
// size), the FLOP model reads flops. A region of kind kNone is measured (MEASURED) but costs nothing modeled: the
// whole of a workload's forwardBackward, inside which the per-layer costs are charged one by one (rt::charge).
enum class CostKind : uint8_t {
  kNone,
  kForward,     // layer `layer`, `size` examples
  kBackward,    // layer `layer`, `size` examples (weight and input gradients)
  kCompress,    // a codec's encode of round `layer`, `size` elements (error feedback and momentum correction included)
  kDecompress,  // a codec's decode, `size` elements, `count` payloads (a gather decodes every rank's)
  kReduce,      // a codec's custom reduce of two payloads, `size` elements, `count` folds
  kSum,         // a collective's elementwise sum of a received frame into a buffer, `size` elements
  kOptimizer,   // an optimizer's update (or a parameter server shard's), `size` elements
  kAccumulate,  // gradient accumulation or clipping passes over the gradient, `size` elements x `count` passes
};
std::string_view costKindName(CostKind kind) noexcept;  // "forward", "compress", ...

struct Cost {
  CostKind kind = CostKind::kNone;
  int layer = -1;    // kForward/kBackward: the layer; kCompress: the round
  double size = 0;   // examples (kForward, kBackward) or elements
  double count = 1;  // repetitions of the kernel on `size` (payloads decoded, folds, passes)
  double flops = 0;  // the FLOP model's count for the whole region
  int dtype = 0;     // kSum: the summed dtype (terse::DType's value; 0: f32)
  int codec = 0;     // kCompress, kDecompress: kRunCodec (the run's compressor), kPullCodec or kDenseCodec
  // kCompress, kDecompress, kReduce: the charged codec's phase at the call's step (TensorCodec::phaseAt;
  // terse/phases_v1.h: a warm-up's stage), 0 for a compressor of one phase. A CALIBRATED simulation charges each phase
  // its own times.
  int phase = 0;
};
inline constexpr int kRunCodec = 0;
inline constexpr int kPullCodec = 1;   // the parameter server's pull compressor (param_server_shard.h)
inline constexpr int kDenseCodec = 2;  // the dense warm-up's (core/train/sync_trainer.h, "Dense warm-up")

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
  // The calling thread's computation takes `factor` times its slowdown from now on: one step's compute noise
  // (core/train/compute_jitter.h), set before the step's compute and back to 1 after it. Returns whether the backend
  // applied it: a simulation does; real time does not (the trainer sleeps instead).
  virtual bool setStepFactor(double /*factor*/) { return false; }
  // A kernel region (Kernel below) opens and closes on the calling thread; regions nest (an inner one's cost is charged
  // as well, its CPU time once). Real time ignores them (the work takes the time it takes).
  virtual void beginKernel() {}
  virtual void endKernel(const Cost& /*cost*/) {}
  // A modeled charge without a region of its own: a layer's forward or backward inside forwardBackward's region,
  // whose CPU time that region measures. A measured simulation ignores it.
  virtual void charge(const Cost& /*cost*/) {}
  // Suspends (and resumes) the calling thread's open regions: the trainer's glue that runs inside a workload's
  // forwardBackward (its layer gates and callbacks) is not the model's work.
  // suspendKernels returns what resumeKernels(depth) needs to reopen them.
  virtual int suspendKernels() { return 0; }
  virtual void resumeKernels(int /*depth*/) {}
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
inline void charge(const Cost& cost) {
  backend().charge(cost);
}

// A kernel region: every piece of model or codec work runs inside one, so that a simulation charges it (and nothing
// else) as computation. The cost is charged when the region closes; it may be filled in meanwhile (a payload's size is
// known after the encode). Scoped rather than a call after the work: under MEASURED the region's bounds are what is
// charged, and a scope cannot forget its end on an early return or an exception.
class Kernel {
 public:
  explicit Kernel(const Cost& cost) : cost_(cost) { backend().beginKernel(); }
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;
  ~Kernel() { backend().endKernel(cost_); }
  Cost& cost() noexcept { return cost_; }

 private:
  Cost cost_;
};

// Glue inside a kernel region (a callback out of a workload's forwardBackward): not charged while it lasts.
class OutsideKernel {
 public:
  OutsideKernel() : depth_(backend().suspendKernels()) {}
  OutsideKernel(const OutsideKernel&) = delete;
  OutsideKernel& operator=(const OutsideKernel&) = delete;
  ~OutsideKernel() { backend().resumeKernels(depth_); }

 private:
  int depth_;
};

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
