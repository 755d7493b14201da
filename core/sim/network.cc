// Frames as SimGrid communications, their arrivals from SimGrid's network signal (network.h).
#include "core/sim/network.h"

#include <simgrid/kernel/resource/Action.hpp>
#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/ConditionVariable.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/Mutex.hpp>
#include <simgrid/s4u/Semaphore.hpp>

#include <deque>
#include <mutex>
#include <unordered_map>

#include "core/common/error.h"
#include "core/sim/runtime.h"

namespace terse::sim {
namespace sg4 = simgrid::s4u;
namespace res = simgrid::kernel::resource;

namespace {
class SimTransfer;
}

// The transfers in flight, by their SimGrid communication, and the arrival notices not yet run. Touched by actors and
// by the maestro (the signal), never at once: SimGrid runs all of them on one OS thread.
class Arrivals {
 public:
  Arrivals();
  ~Arrivals();
  void watch(const void* comm, SimTransfer* transfer) { watched_.emplace(comm, transfer); }
  void forget(const void* comm) { watched_.erase(comm); }
  // Queues fn for the courier and wakes it: from an actor, or from the maestro (a semaphore's release is then run in
  // place; it blocks nobody).
  void post(std::function<void()> fn);
  // Starts the courier on its first call, from an actor.
  void startCourier(SimRuntime& runtime, sg4::Host* host);

 private:
  void finished(const void* comm);

  std::unordered_map<const void*, SimTransfer*> watched_;
  std::deque<std::function<void()>> notices_;
  sg4::SemaphorePtr ready_ = sg4::Semaphore::create(0);  // counts notices_
  bool courier_ = false;
};

namespace {

// SimGrid's signals cannot be disconnected through its public API (3.32): the one handler, connected once per process,
// forwards to the network of the simulation running (one at a time: SimGrid has one engine per process).
Arrivals*& current() {
  static Arrivals* arrivals = nullptr;
  return arrivals;
}

class SimTransfer final : public comm::FrameNetwork::Transfer {
 public:
  SimTransfer(sg4::CommPtr comm, std::shared_ptr<Arrivals> arrivals, SimRuntime& runtime)
      : comm_(std::move(comm)), arrivals_(std::move(arrivals)), runtime_(runtime) {
    arrivals_->watch(comm_->get_impl(), this);
  }
  ~SimTransfer() override {
    if (!arrived_) arrivals_->forget(comm_->get_impl());
  }
  // A transfer that has arrived is not waited on or tested through SimGrid: its communication is finished and
  // detached, and 3.32's wait and test of one search the maestro's list of detached communications (one entry per
  // frame in flight: O(world) per frame at scale) to remove it again. The caller's computation is still settled first,
  // so the simulated instants are those of a wait that returns at once.
  //
  // One actor at most waits through SimGrid: 3.32 gives each wait on a host-to-host communication a timeout action
  // and keeps one per communication (CommImpl::dst_timeout_, overwritten by a second waiter), so a second concurrent
  // wait's action was never released and stayed in the CPU model to the end of the run, with its LMM variable: one
  // per frame that both of its ends waited on, the growth of the resident memory with the steps (issue 17). The other
  // ends wait for the arrival signal instead, at the same simulated instant.
  void wait() override {
    if (done_) return;
    runtime_.settle();
    if (!arrived_) {
      if (!sg_waiting_) {
        sg_waiting_ = true;
        comm_->wait();
      } else {
        if (!arrival_cv_) {
          arrival_mutex_ = sg4::Mutex::create();
          arrival_cv_ = sg4::ConditionVariable::create();
        }
        std::unique_lock<sg4::Mutex> lock(*arrival_mutex_);
        while (!arrived_) arrival_cv_->wait(lock);
      }
    }
    done_ = true;
    runtime_.resume();
  }
  bool test() override {
    if (done_) return true;
    runtime_.settle();
    done_ = arrived_ || comm_->test();
    runtime_.resume();
    return done_;
  }
  // fn goes to the courier when the transfer arrives, or now if it has.
  void whenArrived(std::function<void()> fn) {
    if (arrived_) {
      arrivals_->post(std::move(fn));
    } else {
      on_arrival_.push_back(std::move(fn));
    }
  }
  // From the maestro, at the simulated instant of arrival; Arrivals forgets the transfer.
  void arrive(Arrivals& arrivals) {
    arrived_ = true;
    if (arrival_cv_) arrival_cv_->notify_all();
    for (auto& fn : on_arrival_) arrivals.post(std::move(fn));
    on_arrival_.clear();
  }

 private:
  sg4::CommPtr comm_;
  std::shared_ptr<Arrivals> arrivals_;
  SimRuntime& runtime_;
  std::vector<std::function<void()>> on_arrival_;
  sg4::MutexPtr arrival_mutex_;           // with arrival_cv_: made for a second waiter only
  sg4::ConditionVariablePtr arrival_cv_;  // notified at arrival
  bool sg_waiting_ = false;               // an actor is in comm_->wait()
  bool arrived_ = false;                  // set by the network signal
  bool done_ = false;                     // both ends of a frame may wait on it; the first one to see it done remembers
};

}  // namespace

Arrivals::Arrivals() {
  static const bool connected = [] {
    sg4::Link::on_communication_state_change_cb([](res::NetworkAction& action, res::Action::State) {
      // 3.32 installs no header defining NetworkAction; it is `class NetworkAction : public Action` (single,
      // non-virtual inheritance: the Action is at its start).
      const auto& a = reinterpret_cast<const res::Action&>(action);
      if (current() != nullptr && a.get_state() == res::Action::State::FINISHED && a.get_activity() != nullptr)
        current()->finished(a.get_activity());
    });
    return true;
  }();
  (void)connected;
  TERSE_CHECK(current() == nullptr, InternalError, "simulated network: a second network in one simulation");
  current() = this;
}

Arrivals::~Arrivals() {
  if (current() == this) current() = nullptr;
}

void Arrivals::finished(const void* comm) {
  auto it = watched_.find(comm);
  if (it == watched_.end()) return;
  SimTransfer* t = it->second;
  watched_.erase(it);
  t->arrive(*this);
}

void Arrivals::post(std::function<void()> fn) {
  notices_.push_back(std::move(fn));
  ready_->release();
}

void Arrivals::startCourier(SimRuntime& runtime, sg4::Host* host) {
  if (courier_) return;
  courier_ = true;
  // A daemon: SimGrid ends it when the last of the run's own actors ends, blocked on an empty queue.
  runtime.spawnDaemon("arrivals", host, [this] {
    for (;;) {
      ready_->acquire();
      std::function<void()> fn = std::move(notices_.front());
      notices_.pop_front();
      fn();
    }
  });
}

SimNetwork::SimNetwork(std::vector<sg4::Host*> hosts, SimRuntime& runtime)
    : hosts_(std::move(hosts)), runtime_(runtime), arrivals_(std::make_shared<Arrivals>()) {}

SimNetwork::~SimNetwork() = default;

std::shared_ptr<comm::FrameNetwork::Transfer> SimNetwork::start(int from, int to, uint64_t wire_bytes) {
  TERSE_CHECK(from >= 0 && to >= 0 && static_cast<std::size_t>(from) < hosts_.size() &&
                  static_cast<std::size_t>(to) < hosts_.size(),
              InvalidArgument,
              "simulated network: no route " << from << " -> " << to << " among " << hosts_.size() << " hosts");
  runtime_.settle();
  sg4::CommPtr c =
      sg4::Comm::sendto_async(hosts_[static_cast<std::size_t>(from)], hosts_[static_cast<std::size_t>(to)], wire_bytes);
  // Watched before this actor's next SimGrid call: the communication cannot end before the clock moves.
  auto t = std::make_shared<SimTransfer>(std::move(c), arrivals_, runtime_);
  runtime_.resume();
  return t;
}

void SimNetwork::whenArrived(std::shared_ptr<Transfer> transfer, int to, std::function<void()> fn) {
  TERSE_CHECK(to >= 0 && static_cast<std::size_t>(to) < hosts_.size(), InvalidArgument,
              "simulated network: no host " << to << " among " << hosts_.size());
  auto* t = dynamic_cast<SimTransfer*>(transfer.get());
  TERSE_CHECK(t != nullptr, InvalidArgument, "simulated network: whenArrived on a transfer it did not start");
  runtime_.settle();
  arrivals_->startCourier(runtime_, hosts_[static_cast<std::size_t>(to)]);
  t->whenArrived(std::move(fn));
  runtime_.resume();
}

}  // namespace terse::sim
