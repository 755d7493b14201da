// The inproc transport's frames on the simulated cluster (DESIGN.md section 9): the frames from one rank to another
// are one byte stream, as they are on a TCP connection, carried by SimGrid communications between the two ranks' hosts
// (core/comm/inproc_transport.h FrameNetwork). SimGrid's flow model decides when each arrives: communications in
// flight on a wire or a NIC share its bandwidth max-min fairly, and each pays its route's latency once.
//
// Streams. A frame sent to a peer is appended to the pair's stream; the stream goes out in pieces, each one SimGrid
// communication, and its bytes are delivered in order: a frame has arrived when the piece holding its last byte and
// every piece before it have. So frames sent together to one peer arrive one after the other, as a TCP stream delivers
// them, where one communication per frame made them share the wire and all arrive at the end; and a frame larger than
// a piece arrives a piece at a time, so its receiver adds each piece as it lands (Transfer::waitBytes) and only the
// last piece's sum or two (a piece need not end where a 256 KiB add does) are exposed, as the tcp transport reads and
// adds 256 KiB at a time (tcp/reader.cc, kFuseBytes). The pieces: P = max(kStreamPieceBytes, 4 x bandwidth x latency of
// the route: its slowest link, its summed latency); a piece never crosses a frame's end (a frame arrives with its own
// last byte, not with the next one's first piece); at most two in flight, but for small ones (less than P in flight: a
// burst of small frames goes out together). An idle stream's first piece is P / 2, each later one half a piece longer
// than what the longest piece in flight still has to send, and at least P: when that one ends, the new one still has P
// / 2 to go, which covers the latency of the one started then (CM02 gives a flow no bandwidth during its latency). So
// the wire never idles between the pieces of a stream, and one frame alone of S bytes still takes latency + S /
// bandwidth.
//
// Arrivals. SimGrid 3.32 calls no user code when a host-to-host communication ends except its network actions' state
// signal (s4u::Link::on_communication_state_change, in the maestro, at the simulated instant the last byte lands).
// SimNetwork listens to it: a piece knows it has arrived without asking SimGrid (a wait or a test of a finished
// detached communication costs a simcall and a linear search of the maestro's list of them), the waiters of a stream
// sleep on its condition variable until its delivered bytes pass theirs, and the arrival notices (a rank's doorbell)
// and the starts of the next pieces (SimGrid calls, which are an actor's to make) are run by one courier actor per
// network, where a helper actor per frame made the runtime's table of actors grow with every frame sent to a
// parameter server.
//
// Waits. No actor waits on a communication through SimGrid (3.32 keeps one timeout action per communication: a second
// concurrent wait leaked its action, and the resident memory grew with every step, issue 17).
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

// A stream's piece (the header comment): the tcp transport's reduce read (tcp/reader.cc), and at 256 KiB a piece is
// 2 ms at 1 Gbps, 21 us at 100 Gbps: a few thousand SimGrid communications per second of a busy link, whose per-flow
// cost is then small beside the frames' own.
inline constexpr uint64_t kStreamPieceBytes = 256 * 1024;

class SimNetwork final : public comm::FrameNetwork {
 public:
  // hosts[r]: rank r's host (platform.h); the runtime brackets the SimGrid calls (runtime.h).
  SimNetwork(std::vector<simgrid::s4u::Host*> hosts, SimRuntime& runtime);
  ~SimNetwork() override;
  std::shared_ptr<Transfer> start(int from, int to, uint64_t wire_bytes) override;
  // fn runs on the network's courier actor at the simulated instant the transfer arrives (or, if it already has, at
  // once on the courier), in arrival order. `transfer` must come from this network's start().
  void whenArrived(std::shared_ptr<Transfer> transfer, int to, std::function<void()> fn) override;
  // The SimGrid communications it still holds: pieces in flight, and delivered ones not yet let go (tests).
  std::size_t heldCommunications() const;

 private:
  std::vector<simgrid::s4u::Host*> hosts_;
  SimRuntime& runtime_;
  std::shared_ptr<Arrivals> arrivals_;  // shared with the transfers, which may outlive the network
};

}  // namespace terse::sim
