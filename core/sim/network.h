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
// the route: its slowest link, its summed latency), and a piece never crosses a frame's end (a frame arrives with its
// own last byte, not with the next one's first piece).
//
// A stream's pieces go out one after the other: the next one starts its route's latency before the last one sends its
// last byte (a timer on the courier, below; CM02 gives a flow no bandwidth during its latency), so its first byte
// follows that one's last on the wire. The wire never idles between pieces and two pieces of a stream never share it,
// as on a TCP connection, where frames are written whole and in order and nothing idles at a frame's end: a ring's
// chunk of two frames (256 KiB + 85 KiB at 3 ranks) crosses in latency + its bytes / bandwidth, where two pieces in
// flight at once made the frame that ended first share the wire with the next one and land late (1.06x the alpha-beta
// form), and the tree's segments follow each other to the next level at the wire's rate. The projection of the last
// piece's end uses the rate it has been getting, so a piece slowed by other flows is looked at again when it was due.
//
// NICs. The streams of one rank share its NIC max-min, as SimGrid shares a link, and not one frame after the other:
// that is what the tcp transport's bytes do on a real NIC. isend writes each frame into its socket at once
// (tcp/writer.cc), so a tree's parent hands a segment to both children's connections together (allreduce_tree.cc),
// and the kernel's TCP small queues let each socket hold about a millisecond of its pacing rate (two 64 KB GSO
// packets at least) in the NIC's queue: the two connections' bytes alternate on the wire. Captured on the root's veth
// in the 4-rank tree at 300 Mbit (tc tbf, 96 kB bucket), its broadcast to the two children alternates in bursts of
// 64-330 KB. A lane per NIC, each frame leaving whole in the order it was sent, was tried and measured against the
// same runs: 0.85 / 0.95 / 0.98 of the real tree's time at 1 / 4 / 16 MiB, where sharing gives 1.07 / 1.00 / 0.99
// (results/reference/simulation/report.md).
//
// Arrivals. SimGrid 3.32 calls no user code when a host-to-host communication ends except its network actions' state
// signal (s4u::Link::on_communication_state_change, in the maestro, at the simulated instant the last byte lands).
// SimNetwork listens to it: a piece knows it has arrived without asking SimGrid (a wait or a test of a finished
// detached communication costs a simcall and a linear search of the maestro's list of them), the waiters of a stream
// sleep on its condition variable until its delivered bytes pass theirs, and the arrival notices (a rank's doorbell)
// and the starts of the next pieces (SimGrid calls, which are an actor's to make, at the instants the streams'
// timers say) are run by one courier actor per network, where a helper actor per frame made the runtime's table of
// actors grow with every frame sent to a parameter server.
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
