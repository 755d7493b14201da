// The inproc transport's frames on the simulated cluster (DESIGN.md section 9): each frame is one SimGrid
// communication between the two ranks' hosts, started when it is sent (core/comm/inproc_transport.h FrameNetwork).
// SimGrid's flow model decides when it arrives: frames in flight on a wire or a NIC share its bandwidth max-min
// fairly, and each pays its route's latency once.
//
// Arrivals. SimGrid 3.32 calls no user code when a host-to-host communication ends except its network actions' state
// signal (s4u::Link::on_communication_state_change, in the maestro, at the simulated instant the last byte lands).
// SimNetwork listens to it: a frame's transfer knows it has arrived without asking SimGrid (a wait or a test of a
// finished detached communication costs a simcall and a linear search of the maestro's list of them, network.cc),
// and the arrival notices (a rank's doorbell) are run by one courier actor per network, where a helper actor per frame
// made the runtime's table of actors grow with every frame sent to a parameter server.
//
// Waits. One actor at most waits on a frame's communication through SimGrid; the frame's other end waits for the
// arrival signal (3.32 keeps one timeout action per communication: a second concurrent wait leaked its action, and
// the resident memory grew with every step, issue 17).
#pragma once

#include <memory>
#include <vector>

#include "core/comm/inproc_transport.h"

namespace simgrid::s4u {
class Host;
}

namespace terse::sim {

class SimRuntime;
class Arrivals;

class SimNetwork final : public comm::FrameNetwork {
 public:
  // hosts[r]: rank r's host (platform.h); the runtime brackets the SimGrid calls (runtime.h).
  SimNetwork(std::vector<simgrid::s4u::Host*> hosts, SimRuntime& runtime);
  ~SimNetwork() override;
  std::shared_ptr<Transfer> start(int from, int to, uint64_t wire_bytes) override;
  // fn runs on the network's courier actor at the simulated instant the transfer arrives (or, if it already has, at
  // once on the courier), in arrival order. `transfer` must come from this network's start().
  void whenArrived(std::shared_ptr<Transfer> transfer, int to, std::function<void()> fn) override;

 private:
  std::vector<simgrid::s4u::Host*> hosts_;
  SimRuntime& runtime_;
  std::shared_ptr<Arrivals> arrivals_;  // shared with the transfers, which may outlive the network
};

}  // namespace terse::sim
