// SimRuntime: actors, SimGrid locks and the kernels' computation clock (runtime.h).
#include "core/sim/runtime.h"

#include <time.h>
#include <simgrid/Exception.hpp>
#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/ConditionVariable.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Mutex.hpp>

#include <cmath>
#include <exception>
#include <mutex>
#include <sstream>

#include "core/common/error.h"

namespace terse::sim {
namespace sg4 = simgrid::s4u;

double threadCpuSeconds() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

namespace {

// Computations shorter than this stay pending (carried into the next one) instead of costing a SimGrid sleep each:
// below any latency a network model resolves, and it spares lock-heavy code a SimGrid call per critical section.
constexpr double kMinSleepSeconds = 1e-6;

// Actors run one at a time and switch only inside SimGrid calls, so a lock nobody holds is taken without asking
// SimGrid (most are): SimGrid is asked only to block and to wake, through the runtime's internal mutex and a
// condition variable of the lock's own. Taking and releasing both settle the caller's computation first
// (SimRuntime::settle): a lock is taken at the simulated instant the taker gets there, and what the holder did becomes
// visible to the others at the instant it is done.
class SimMutex final : public rt::MutexImpl {
 public:
  explicit SimMutex(SimRuntime& rt) : rt_(rt), cv_(sg4::ConditionVariable::create()) {}
  void lock() override {
    // The taker's computation so far happens before it takes the lock, not while it holds it (a lock taken at an
    // earlier simulated instant than the taker's would be held through that computation, blocking the others).
    rt_.settle();
    if (!locked_) {
      locked_ = true;
      return;
    }
    ++waiters_;
    {
      std::unique_lock<sg4::Mutex> internal(rt_.internalMutex());
      while (locked_) cv_->wait(internal);
      // Taken before the internal mutex is released: releasing it is a SimGrid call, and another actor running
      // meanwhile would find the lock free.
      locked_ = true;
      --waiters_;
    }
    rt_.resume();
  }
  void unlock() override {
    rt_.settle();
    if (waiters_ == 0) {
      locked_ = false;
      return;
    }
    std::unique_lock<sg4::Mutex> internal(rt_.internalMutex());
    releaseHoldingInternal();
    internal.unlock();
    rt_.resume();
  }
  bool tryLock() override {
    rt_.settle();
    if (locked_) return false;
    locked_ = true;
    return true;
  }
  // Releases the lock while the caller holds the internal mutex (a condition variable's wait).
  void releaseHoldingInternal() {
    locked_ = false;
    if (waiters_ > 0) cv_->notify_one();
  }

 private:
  SimRuntime& rt_;
  sg4::ConditionVariablePtr cv_;
  bool locked_ = false;
  int waiters_ = 0;
};

// No lost wake-up: a waiter counts itself and releases the lock while holding the internal mutex, which a notifier
// with waiters to wake takes first; a notify with nobody waiting costs nothing.
class SimCondVar final : public rt::CondVarImpl {
 public:
  explicit SimCondVar(SimRuntime& rt) : rt_(rt), cv_(sg4::ConditionVariable::create()) {}
  void wait(rt::MutexImpl& mutex) override { waitImpl(mutex, -1); }
  std::cv_status waitUntil(rt::MutexImpl& mutex, rt::Clock::time_point deadline) override {
    return waitImpl(mutex, rt_.toSimSeconds(deadline));
  }
  void notifyOne() override { notify(false); }
  void notifyAll() override { notify(true); }

 private:
  std::cv_status waitImpl(rt::MutexImpl& mutex, double deadline) {
    rt_.settle();
    auto& m = static_cast<SimMutex&>(mutex);
    std::cv_status status = std::cv_status::no_timeout;
    {
      std::unique_lock<sg4::Mutex> internal(rt_.internalMutex());
      ++waiters_;
      m.releaseHoldingInternal();
      if (deadline < 0) {
        cv_->wait(internal);
      } else {
        status = cv_->wait_until(internal, deadline);
      }
      --waiters_;
    }
    // Other actors ran while this one waited: measure from here, before the lock (which may settle) is taken.
    rt_.resume();
    m.lock();
    return status;
  }
  void notify(bool all) {
    rt_.settle();
    if (waiters_ == 0) return;
    {
      std::unique_lock<sg4::Mutex> internal(rt_.internalMutex());
      if (all) {
        cv_->notify_all();
      } else {
        cv_->notify_one();
      }
    }
    rt_.resume();
  }

  SimRuntime& rt_;
  sg4::ConditionVariablePtr cv_;
  int waiters_ = 0;
};

class SimThread final : public rt::ThreadImpl {
 public:
  SimThread(SimRuntime& rt, sg4::ActorPtr actor) : rt_(rt), actor_(std::move(actor)) {}
  ~SimThread() override { join(); }
  void join() override {
    if (!actor_) return;
    rt_.settle();
    actor_->join();
    actor_ = nullptr;
    rt_.resume();
  }

 private:
  SimRuntime& rt_;
  sg4::ActorPtr actor_;
};

}  // namespace

void ComputeOptions::validate() const {
  TERSE_CHECK(compute_scale >= 0 && compute_scale < 1e6, InvalidArgument,
              "simulation: compute_scale must be in [0, 1e6), got " << compute_scale);
  TERSE_CHECK(flops_per_second > 0 && std::isfinite(flops_per_second), InvalidArgument,
              "simulation: flops_per_second must be finite and > 0, got " << flops_per_second);
  TERSE_CHECK(model != ComputeModel::kCalibrated || table != nullptr, InvalidArgument,
              "simulation: compute CALIBRATED needs a calibration table (none was given to the simulation)");
}

std::optional<ComputeModel> parseComputeModel(std::string_view name) {
  if (name == "calibrated") return ComputeModel::kCalibrated;
  if (name == "measured") return ComputeModel::kMeasured;
  if (name == "flops") return ComputeModel::kFlops;
  if (name == "none") return ComputeModel::kNone;
  return std::nullopt;
}

std::string_view computeModelName(ComputeModel model) {
  switch (model) {
    case ComputeModel::kCalibrated:
      return "calibrated";
    case ComputeModel::kMeasured:
      return "measured";
    case ComputeModel::kFlops:
      return "flops";
    case ComputeModel::kNone:
      return "none";
  }
  return "?";
}

std::string_view computeModelChoices() {
  return "none, calibrated, measured or flops";
}

std::string ComputeOptions::describe() const {
  std::ostringstream out;
  switch (model) {
    case ComputeModel::kCalibrated:
      out << "calibrated kernel times (" << (table ? table->describe() : std::string("no table")) << ") x "
          << compute_scale;
      break;
    case ComputeModel::kMeasured:
      out << "measured thread CPU time in kernels x " << compute_scale;
      break;
    case ComputeModel::kFlops:
      out << "FLOP model at " << flops_per_second << " flop/s";
      break;
    case ComputeModel::kNone:
      out << "no computation (network time only)";
      break;
  }
  return out.str();
}

SimRuntime::SimRuntime(std::vector<sg4::Host*> hosts, const ComputeOptions& compute,
                       std::function<void(const std::string&)> fatal)
    : hosts_(std::move(hosts)),
      compute_(compute),
      fatal_(std::move(fatal)),
      origin_(rt::Clock::now()),
      internal_(sg4::Mutex::create()) {
  compute.validate();
}

SimRuntime::ActorClock& SimRuntime::self() {
  const auto id = static_cast<std::size_t>(sg4::this_actor::get_pid());
  if (id >= actors_.size()) actors_.resize(id + 1);
  ActorClock& a = actors_[id];
  if (!a.live) {
    // An actor SimRuntime did not start (the simulation's first one): it is measured from its first call on.
    a = ActorClock{cpuMark(), 0, 1, true};
  }
  return a;
}

void SimRuntime::account(ActorClock& a) {
  // Outside every region nothing is charged and the clock is not read: the mark is set again when a region opens.
  if (a.kernels == 0 || compute_.model != ComputeModel::kMeasured) return;
  const double cpu = threadCpuSeconds();
  a.pending += (cpu - a.mark) * compute_.compute_scale * a.slowdown * a.step_factor;
  a.mark = cpu;
}

double SimRuntime::modeled(const ActorClock& a, const rt::Cost& cost) const {
  switch (compute_.model) {
    case ComputeModel::kCalibrated:
      return compute_.table->seconds(cost) * compute_.compute_scale * a.slowdown * a.step_factor;
    case ComputeModel::kFlops:
      return cost.flops > 0 ? cost.flops / compute_.flops_per_second * a.slowdown * a.step_factor : 0.0;
    case ComputeModel::kMeasured:  // account() charges the region's CPU time instead
    case ComputeModel::kNone:
      break;
  }
  return 0.0;
}

void SimRuntime::settle() {
  if (sg4::Actor::is_maestro()) return;
  ActorClock& a = self();
  account(a);
  if (a.pending >= kMinSleepSeconds) {
    const double d = a.pending;
    a.pending = 0;
    injected_s_ += d;
    sg4::this_actor::sleep_for(d);
    if (a.kernels > 0) a.mark = cpuMark();  // the others ran meanwhile, on this thread
  }
}

void SimRuntime::resume() {
  if (sg4::Actor::is_maestro()) return;
  ActorClock& a = self();
  if (a.kernels > 0) a.mark = cpuMark();
}

void SimRuntime::beginKernel() {
  if (sg4::Actor::is_maestro()) return;
  ActorClock& a = self();
  account(a);  // an enclosing region's CPU time so far is its own
  ++a.kernels;
  a.mark = cpuMark();
}

void SimRuntime::endKernel(const rt::Cost& cost) {
  if (sg4::Actor::is_maestro()) return;
  ActorClock& a = self();
  account(a);
  if (a.kernels > 0) --a.kernels;
  a.pending += modeled(a, cost);
}

void SimRuntime::charge(const rt::Cost& cost) {
  if (sg4::Actor::is_maestro()) return;
  ActorClock& a = self();
  a.pending += modeled(a, cost);
}

int SimRuntime::suspendKernels() {
  if (sg4::Actor::is_maestro()) return 0;
  ActorClock& a = self();
  account(a);
  const int depth = a.kernels;
  a.kernels = 0;
  return depth;
}

void SimRuntime::resumeKernels(int depth) {
  if (sg4::Actor::is_maestro()) return;
  ActorClock& a = self();
  account(a);
  a.kernels = depth;
  a.mark = cpuMark();
}

rt::Clock::time_point SimRuntime::toTimePoint(double sim_seconds) const {
  // Rounded, not truncated: a wait until time point t wakes at toSimSeconds(t), which must read back as t, or a loop
  // that waits until a deadline would find it not yet passed and wait again at the same simulated instant, forever.
  return origin_ + std::chrono::round<rt::Clock::duration>(std::chrono::duration<double>(sim_seconds));
}

double SimRuntime::toSimSeconds(rt::Clock::time_point t) const {
  return std::chrono::duration<double>(t - origin_).count();
}

rt::Clock::time_point SimRuntime::now() {
  settle();
  const rt::Clock::time_point t = toTimePoint(sg4::Engine::get_clock());
  resume();
  return t;
}

void SimRuntime::sleepUntil(rt::Clock::time_point t) {
  settle();
  const double d = toSimSeconds(t) - sg4::Engine::get_clock();
  if (d > 0) sg4::this_actor::sleep_for(d);
  resume();
}

std::unique_ptr<rt::MutexImpl> SimRuntime::makeMutex() {
  return std::make_unique<SimMutex>(*this);
}

std::unique_ptr<rt::CondVarImpl> SimRuntime::makeCondVar() {
  return std::make_unique<SimCondVar>(*this);
}

std::unique_ptr<rt::ThreadImpl> SimRuntime::startThread(const std::string& name, int place, std::function<void()> fn) {
  settle();
  sg4::Host* host = nullptr;
  if (place >= 0 && static_cast<std::size_t>(place) < hosts_.size()) {
    host = hosts_[static_cast<std::size_t>(place)];
  } else if (!sg4::Actor::is_maestro()) {
    host = sg4::this_actor::get_host();
  } else {
    host = hosts_.at(0);
  }
  // A new thread is as slow as the one that started it (a straggler's helper threads run on the same slow device).
  const double slowdown = sg4::Actor::is_maestro() ? 1.0 : self().slowdown;
  sg4::ActorPtr actor = makeActor(name, host, slowdown, false, std::move(fn));
  resume();
  return std::make_unique<SimThread>(*this, std::move(actor));
}

void SimRuntime::spawnDaemon(const std::string& name, sg4::Host* host, std::function<void()> fn) {
  settle();
  makeActor(name, host, 0.0, true, std::move(fn));
  resume();
}

sg4::ActorPtr SimRuntime::makeActor(const std::string& name, sg4::Host* host, double slowdown, bool daemon,
                                    std::function<void()> fn) {
  return sg4::Actor::create(name, host, [this, name, slowdown, daemon, fn = std::move(fn)] {
    const auto id = static_cast<std::size_t>(sg4::this_actor::get_pid());
    if (id >= actors_.size()) actors_.resize(id + 1);
    actors_[id] = ActorClock{cpuMark(), 0, slowdown, true};
    if (daemon) sg4::Actor::self()->daemonize();
    try {
      fn();
    } catch (const simgrid::ForcefulKillException&) {
      throw;  // SimGrid ending the actor (a daemon at the end of the run): it must unwind through
    } catch (const std::exception& e) {
      // std::thread would terminate; a simulation ends with the reason instead.
      fatal_("thread '" + name + "' ended with an uncaught exception: " + e.what());
    } catch (...) {
      fatal_("thread '" + name + "' ended with an uncaught exception");
    }
    settle();  // its last computation still takes simulated time before a join returns
    actors_[static_cast<std::size_t>(sg4::this_actor::get_pid())].live = false;
  });
}

void SimRuntime::uncounted(const std::function<void()>& fn) {
  if (sg4::Actor::is_maestro()) {
    fn();
    return;
  }
  ActorClock& a = self();
  account(a);
  fn();
  if (a.kernels > 0) a.mark = cpuMark();
}

void SimRuntime::setSlowdown(double factor) {
  TERSE_CHECK(factor >= 1 && std::isfinite(factor), InvalidArgument,
              "simulation: slowdown must be a finite factor >= 1, got " << factor);
  if (sg4::Actor::is_maestro()) return;
  ActorClock& a = self();
  account(a);
  a.slowdown = factor;
}

bool SimRuntime::setStepFactor(double factor) {
  TERSE_CHECK(factor >= 1 && std::isfinite(factor), InvalidArgument,
              "simulation: a step's compute factor must be finite and >= 1, got " << factor);
  if (sg4::Actor::is_maestro()) return true;
  ActorClock& a = self();
  account(a);  // the computation so far is charged at the factor it ran under
  a.step_factor = factor;
  return true;
}

}  // namespace terse::sim
