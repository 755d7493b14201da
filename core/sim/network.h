// The inproc transport's frames on the simulated cluster (DESIGN.md section 9): each frame is one SimGrid
// communication between the two ranks' hosts, started when it is sent (core/comm/inproc_transport.h FrameNetwork).
// SimGrid's flow model decides when it arrives: frames in flight on a wire or a NIC share its bandwidth max-min
// fairly, and each pays its route's latency once.
#pragma once

#include <vector>

#include "core/comm/inproc_transport.h"

namespace simgrid::s4u {
class Host;
}

namespace terse::sim {

class SimRuntime;

class SimNetwork final : public comm::FrameNetwork {
 public:
  // hosts[r]: rank r's host (platform.h); the runtime brackets the SimGrid calls (runtime.h).
  SimNetwork(std::vector<simgrid::s4u::Host*> hosts, SimRuntime& runtime);
  std::shared_ptr<Transfer> start(int from, int to, uint64_t wire_bytes) override;
  // A helper actor on `to`'s host waits for the transfer and calls fn (SimGrid has no completion callback an actor's
  // condition variable could be notified from).
  void whenArrived(std::shared_ptr<Transfer> transfer, int to, std::function<void()> fn) override;

 private:
  std::vector<simgrid::s4u::Host*> hosts_;
  SimRuntime& runtime_;
};

}  // namespace terse::sim
