// The point-to-point transport interface (DESIGN.md section 6): frames (frame.h) between the ranks of one job. Every
// collective (allreduce_ring.h, allgatherv_ring.h, ...) is written once over this interface; the inproc transport
// (ranks are threads of one process) and the tcp transport (processes on one or many hosts) implement it.
//
// Matching: a receive posted for (peer, tag) takes the first frame from that peer with that tag; frames of one tag on
// one directed link are delivered in the order they were sent (MPI's non-overtaking rule), frames of different tags
// independently. So operations in flight at the same time never mix as long as their tags differ.
//
// Progress: isend and irecv never block on the peer. A request makes progress when its owner (or the peer's matching
// request) is tested or waited on, so a rank must not wait on a send whose matching receive the peer posts only after
// waiting on something from this rank; collectives post every receive they need for a step before they wait. A
// blocking send() is isend + wait and may block until the peer receives (large frames are not buffered).
//
// Errors: a malformed or unexpected frame fails the receive with InvalidPayload; abort() fails every pending and
// future request on every rank of the job with CommError, so one rank's failure is a clear error everywhere and never
// a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/comm/frame.h"
#include "core/comm/request.h"
#include "core/comm/traffic.h"
#include "core/common/dtype.h"
#include "core/common/error.h"

namespace terse::comm {

// The job's communication failed: a peer aborted, a link broke, a watchdog fired. The message carries the first
// failure's reason.
class CommError : public Error {
 public:
  explicit CommError(const std::string& m) : Error(TERSE_ERR_INTERNAL, m) {}
};

// A rank's doorbell, for a thread that waits on receives from several peers at once (the parameter server's shards and
// clients: the transport has no any-source receive). rings() grows whenever one of the rank's receives may have
// become ready (a frame reached the rank) or the job aborted; so a thread reads it, tests its requests, and when none
// was ready waits for the count to move instead of polling. The deadline lets it keep its own timers (heartbeats,
// liveness) without a loop of timed polls.
class ActivityBell {
 public:
  virtual ~ActivityBell() = default;
  virtual uint64_t rings() = 0;
  // Returns once rings() != seen, or at `deadline` (time_point::max(): none).
  virtual void waitUntil(uint64_t seen, std::chrono::steady_clock::time_point deadline) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string_view name() const noexcept = 0;  // "inproc", "tcp"
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // Frames longer than this are refused by the receiver; collectives split messages to stay below.
  virtual uint64_t maxFrameBytes() const noexcept = 0;

  // Sends data as one frame to peer. `data` must stay valid and unchanged until the request completes. Throws
  // InvalidArgument for a bad peer or a frame above maxFrameBytes, CommError after an abort.
  virtual Request isend(int peer, const FrameMeta& meta, std::span<const std::byte> data) = 0;
  // Receives the next frame from peer with expect.tag into buffer; the request's bytes() is the frame's length. The
  // request fails with InvalidPayload when the frame is longer than buffer, carries another op kind than expect.kind,
  // or its header is malformed.
  virtual Request irecv(int peer, const FrameMeta& expect, std::span<std::byte> buffer) = 0;

  // Like irecv, but the frame's payload is added elementwise into `accumulate` as `dtype` (reduce.h: f32, f16, bf16)
  // instead of overwriting it; the frame must hold a whole number of elements and fit. This is the reduce-scatter's
  // receive: a transport over shared memory (inproc) adds straight from the sender's buffer, so the payload crosses
  // memory once as a real wire's would, instead of once to land and again to be added; a socket transport reads it in
  // cache-sized pieces and adds each as it is read (tcp/reader.cc). Counted like any frame.
  virtual Request irecvReduce(int peer, const FrameMeta& expect, std::span<std::byte> accumulate, DType dtype) = 0;

  void send(int peer, const FrameMeta& meta, std::span<const std::byte> data) { isend(peer, meta, data).wait(); }
  uint64_t recv(int peer, const FrameMeta& expect, std::span<std::byte> buffer) {
    Request r = irecv(peer, expect, buffer);
    r.wait();
    return r.bytes();
  }

  // This rank's byte accounting (sent and received, headers included); thread-safe.
  virtual RankTraffic traffic() const = 0;
  virtual void resetTraffic() = 0;

  // Fails every pending and future request of every rank with CommError(reason). Idempotent; the first reason wins.
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const noexcept = 0;

  // This rank's doorbell, or nullptr where the transport has none (its users poll with a back-off). The first call
  // arms it: only frames sent to the rank after that ring it, so a user asks for it before its first receive. The
  // inproc transport has one in simulated time, where a poll would either burn simulated time or stop it advancing.
  virtual ActivityBell* activityBell() { return nullptr; }
};

}  // namespace terse::comm
