// Frames as SimGrid communications (network.h).
#include "core/sim/network.h"

#include <simgrid/s4u/Comm.hpp>

#include "core/common/error.h"
#include "core/sim/runtime.h"

namespace terse::sim {
namespace sg4 = simgrid::s4u;

namespace {

class SimTransfer final : public comm::FrameNetwork::Transfer {
 public:
  SimTransfer(sg4::CommPtr comm, SimRuntime& runtime) : comm_(std::move(comm)), runtime_(runtime) {}
  void wait() override {
    if (done_) return;
    runtime_.settle();
    comm_->wait();
    done_ = true;
    runtime_.resume();
  }
  bool test() override {
    if (done_) return true;
    runtime_.settle();
    done_ = comm_->test();
    runtime_.resume();
    return done_;
  }

 private:
  sg4::CommPtr comm_;
  SimRuntime& runtime_;
  bool done_ = false;  // both ends of a frame may wait on it; the first one to see it done remembers
};

}  // namespace

SimNetwork::SimNetwork(std::vector<sg4::Host*> hosts, SimRuntime& runtime)
    : hosts_(std::move(hosts)), runtime_(runtime) {}

std::shared_ptr<comm::FrameNetwork::Transfer> SimNetwork::start(int from, int to, uint64_t wire_bytes) {
  TERSE_CHECK(from >= 0 && to >= 0 && static_cast<std::size_t>(from) < hosts_.size() &&
                  static_cast<std::size_t>(to) < hosts_.size(),
              InvalidArgument,
              "simulated network: no route " << from << " -> " << to << " among " << hosts_.size() << " hosts");
  runtime_.settle();
  sg4::CommPtr c =
      sg4::Comm::sendto_async(hosts_[static_cast<std::size_t>(from)], hosts_[static_cast<std::size_t>(to)], wire_bytes);
  runtime_.resume();
  return std::make_shared<SimTransfer>(std::move(c), runtime_);
}

void SimNetwork::whenArrived(std::shared_ptr<Transfer> transfer, int to, std::function<void()> fn) {
  TERSE_CHECK(to >= 0 && static_cast<std::size_t>(to) < hosts_.size(), InvalidArgument,
              "simulated network: no host " << to << " among " << hosts_.size());
  runtime_.spawnDetached("arrival", hosts_[static_cast<std::size_t>(to)],
                         [transfer = std::move(transfer), fn = std::move(fn)] {
                           transfer->wait();
                           fn();
                         });
}

}  // namespace terse::sim
