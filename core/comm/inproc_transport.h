// The inproc transport: the ranks of a job are threads of one process (DESIGN.md section 6, the embedded default).
// An InprocFabric connects N endpoints; each endpoint is one rank's Transport.
//
// Data path. Every directed link (i -> j) is a mailbox with its own mutex and condition variable: the frames i sent
// that j has not matched yet, and the receives j posted that no frame matched yet. A send to peer j touches link
// (i -> j) only, so ranks never contend on a global lock. Frames are counted exactly as if they crossed a wire
// (frame.h header included) and the header is stored encoded and validated on arrival like a tcp frame's.
//
// Copies. A frame up to `eager_bytes` is copied once into the frame at send time, so the sender's buffer is free at
// once (small control messages need no rendezvous), and copied again into the receive buffer. Where its receive is
// already posted and nothing times the link (real time, no emulation), the sender copies (or adds) it straight into
// the receive's buffer instead, under the link's lock: one pass and no staging buffer, where staging cost two passes
// and an allocation (a 4 KiB allreduce of 2 ranks, interleaved medians of 15 rounds: 3.09 -> 2.65 us). A larger frame
// is never staged: once matched it is copied exactly once, sender's buffer -> receiver's buffer (with non-temporal
// stores when large), by whichever of the two threads waits (or tests) first. The receiver usually gets there first, so
// in a ring each rank copies what it receives and the copying work is spread evenly over the ranks' threads.
// irecvReduce adds the sender's bytes into the receive buffer in that same single pass, instead of copying them
// (Transport).
//
// What a small message touches. Two threads trading 4 KiB frames pay for every cache line both of them write, more than
// for the instructions: a request holds its endpoint's own count on the fabric (the fabric's own, shared by all ranks,
// was an atomic add and subtract on one line per request); a posted receive lives inside its request and sits on the
// link's list through an intrusive hook, with no shared count the sender changes; a frame delivered at once lives on
// the sender's stack and its request keeps only the length; the receive learns of the delivery from a flag in its own
// record, read without the lock; a sender that finds no receive posted watches for one a moment before it stages the
// frame. Measured one change at a time (2 ranks, 4 KiB, alternating rounds in one window): 2.18 -> 1.72 us for the
// first four, then to 1.04-1.15 with the rest, against Open MPI vader's 1.1 (docs/performance.md).
//
// Waiting (spin_wait.h; InprocOptions::spin_us, TERSE_INPROC_SPIN_US; 50 us by default, 0 = park at once). A rank whose
// wait finds its frame not there yet (not sent, not matched, not copied) spins before it parks on the link's condition
// variable: it watches the link's event counter, bumped after every change a waiter may wait for, between pause hints,
// and after every few without a change calls sched_yield(), so that where ranks outnumber CPUs the peer it waits for
// gets the CPU (spin_wait.h, spinStepUntil); it does so for up to the budget counted from the start of the wait, then
// parks. A waker notifies only when a waiter is parked (the link counts them). Parking at once cost every hop a futex
// wake-up and, in a virtual machine, an idle vCPU's halt and the interrupt that ends it: a 4 KiB allreduce of 2 ranks
// took 55-64 us on 2 vCPUs where Open MPI's shared memory took 3 us. Measured with the spin (scripts/bench-vs-peers
// --allreduce --shm --terse-env park:TERSE_INPROC_SPIN_US=0, 2 vCPUs with other builds running, load 5-7, medians of 3
// rounds, spin / park / Open MPI vader): 2 ranks 4 KiB 4.4 / 16.3 / 1.1 us, 64 KiB 31 / 56 / 19 us, 16 MiB 4.7 / 5.3
// / 1.1 GB/s; 4 ranks 4 KiB 33 / 45 / 39 us, 64 KiB 144 / 190 / 120 us, 16 MiB 3.6 / 3.4 / 0.8 GB/s. Beside a two-job
// build (load 7) a spin step's sched_yield() handed the CPU to a compiler for its whole slice (a 4 KiB allreduce of 800
// us); steps longer than the budget that add up to 2 ms within 100 ms now make the thread park at once for a while
// (spin_wait.h, SpinStalls), and the spin then costs what parking does -- except where every rank has a CPU of its own
// (ranks <= the CPUs of the creating thread's affinity): there a backed-off wait holds its CPU for up to 20 us without
// yielding before it parks, as a busy-polling MPI does; beside two CPU-bound processes on 2 vCPUs a 4 KiB allreduce of
// 2 ranks took 5.2 us parking, 3.3 holding, Open MPI's vader 7.1 (docs/performance.md). The spin is off in simulated
// time (the actors share one OS thread: nothing changes while one spins, and the simulation's calls stay exactly those
// of before) and on emulated links (the pacers set the times and need the CPU).
//
// Emulation (link_emulation.h). When enabled, each rank gets one pacer thread, its NIC: it interleaves the slices of
// the frames queued on the rank's outgoing links, sleeping until the token buckets of the link, the rank's egress and
// the receiver's ingress allow the next slice, and stamps each frame with the time it has been sent and the time it
// is delivered (sent + latency). Data still moves at memory speed; a request just does not complete before its time.
//
// Simulated time (DESIGN.md section 9). With a FrameNetwork (core/sim: SimGrid), there are no pacers: each frame's
// wire bytes start a transfer on the simulated network when it is sent, and its send and receive requests complete no
// earlier than that transfer. A frame's bytes are added (irecvReduce) only once they have arrived, a piece at a time
// when the network delivers the frame in pieces: a rank cannot add what it has not received, and a sum taken at the
// wait, before the transfer, hid it under the transfer whole. Matching, copies, accounting and errors are the ones
// above, so a simulated run moves the same bytes in the same frames. The fabric's locks are then the runtime's
// (core/common/runtime.h), which every link already uses. A rank's doorbell (Transport::activityBell) exists only then:
// a frame sent to a rank whose bell is armed rings it when its transfer arrives, so a parameter server waits for its
// next request in simulated time.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/comm/job.h"
#include "core/comm/link_emulation.h"
#include "core/comm/spin_wait.h"
#include "core/comm/transport.h"

namespace terse::comm {

// A network that times frames in place of the pacer threads (core/sim/network.h).
class FrameNetwork {
 public:
  class Transfer {
   public:
    virtual ~Transfer() = default;
    virtual void wait() = 0;  // returns once the frame has arrived
    virtual bool test() = 0;
    // Returns once the frame's first `bytes` (its wire bytes, header first) have arrived: a network that delivers a
    // frame in pieces (core/sim/network.h) lets its receiver add the first ones while the rest is in flight.
    virtual void waitBytes(uint64_t bytes) {
      (void)bytes;
      wait();
    }
    // The pieces the frame arrives in (bytes); 0: whole.
    virtual uint64_t pieceBytes() const { return 0; }
  };
  virtual ~FrameNetwork() = default;
  // Starts moving `wire_bytes` (a frame, header included) from rank `from` to rank `to`.
  virtual std::shared_ptr<Transfer> start(int from, int to, uint64_t wire_bytes) = 0;
  // Calls `fn` once `transfer` has arrived at rank `to`, without blocking the caller (a rank's doorbell rings then).
  virtual void whenArrived(std::shared_ptr<Transfer> transfer, int to, std::function<void()> fn) = 0;
};

struct InprocOptions {
  EmulationConfig emulation;  // real-time pacing; ignored when `network` is set (it models the links itself)
  // Frames up to this many payload bytes are buffered at send (see above).
  uint64_t eager_bytes = 64 * 1024;
  uint64_t max_frame_bytes = kDefaultMaxFrameBytes;
  // Simulated time: times the frames instead of the pacers (core/sim/network.h).
  std::shared_ptr<FrameNetwork> network;
  // Waiting (header comment): -1 = unset (TERSE_INPROC_SPIN_US when set, else kDefaultInprocSpinUs), 0 = a waiting
  // rank parks at once, N = it spins up to N microseconds (at most kMaxSpinUs) before it parks.
  int spin_us = -1;
};

// A waiting rank's spin budget when neither the options nor TERSE_INPROC_SPIN_US set one (header comment: measured).
inline constexpr int kDefaultInprocSpinUs = 50;

// The spin budget (microseconds, 0 = off) of a fabric with these options: 0 in simulated time (`network` set, or a
// simulation's runtime installed) and with link emulation; else the option when it is >= 0; else TERSE_INPROC_SPIN_US
// from `env` when set; else kDefaultInprocSpinUs. Throws InvalidArgument naming the variable and the value for a bad
// TERSE_INPROC_SPIN_US (checked in every case), or naming the field for a bad option.
int resolveInprocSpinUs(const InprocOptions& options, const EnvLookup& env);

class InprocFabric {
 public:
  // Throws InvalidArgument for world_size < 1 or an invalid emulation config.
  static std::shared_ptr<InprocFabric> create(int world_size, const InprocOptions& options = {});
  virtual ~InprocFabric() = default;

  virtual int size() const noexcept = 0;
  virtual const InprocOptions& options() const noexcept = 0;
  // The budget its waiting ranks spin for (resolveInprocSpinUs, at create()).
  virtual int spinMicroseconds() const noexcept = 0;
  // Whether a waiting rank whose spins are backed off (spin_wait.h, SpinStalls) holds its CPU for a short spin before
  // it parks: where the spin is on and the ranks do not outnumber the CPUs the creating thread may use (header
  // comment, "Waiting").
  virtual bool holdsWhenBackedOff() const noexcept = 0;
  // Rank `rank`'s transport. Endpoints keep the fabric alive; call once per rank.
  virtual std::unique_ptr<Transport> endpoint(int rank) = 0;

  // Every rank's accounting, in rank order; thread-safe.
  virtual std::vector<RankTraffic> traffic() const = 0;
  virtual void resetTraffic() = 0;
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const noexcept = 0;

  // Test hook: bytes arriving on link from -> to as if from a wire, bypassing the sender's encoder: `header` is parsed
  // and validated exactly as a received header is (a malformed one breaks the link, failing its receives with
  // InvalidPayload), `payload` follows it. Not counted in the accounting.
  virtual void injectRawFrame(int from, int to, std::span<const std::byte> header,
                              std::span<const std::byte> payload) = 0;
};

// The factory: N connected endpoints, rank i at index i.
std::vector<std::unique_ptr<Transport>> makeInprocTransports(int world_size, const InprocOptions& options = {});

}  // namespace terse::comm
