// What every collective algorithm receives, and the helpers they share. The algorithms are one per file in this folder,
// named <collective>_<algorithm>.h: allreduce_ring, _recursive_doubling, _halving_doubling, _tree, _reduce_broadcast
// and _hierarchical; allgatherv_ring and _hierarchical, allgather_bruck; broadcast_binomial; barrier_dissemination; and
// the `auto` choosers allreduce_auto.h and allgather_auto.h. The algorithms see only the Transport interface, so they
// run unchanged over inproc and tcp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "core/comm/frame.h"
#include "core/comm/transport.h"

namespace terse::comm {

// The requests an algorithm holds for one step, and the lengths its receives expect: a handful, so they live inline.
// Heap vectors cost a small allreduce three allocations per step and one more for the operation's tracked requests,
// a tenth of a 4 KiB allreduce between two in-process ranks.
using RequestList = boost::container::small_vector<Request, 4>;
using LengthList = boost::container::small_vector<uint64_t, 4>;

// What one operation put on the wire from this rank, headers included: the same numbers the transport's accounting
// adds for its frames (frameWireBytes), kept per operation so a caller can attribute them.
struct WireBytes {
  uint64_t sent_bytes = 0;
  uint64_t received_bytes = 0;
  uint64_t sent_frames = 0;
  uint64_t received_frames = 0;
  WireBytes& operator+=(const WireBytes& o) {
    sent_bytes += o.sent_bytes;
    received_bytes += o.received_bytes;
    sent_frames += o.sent_frames;
    received_frames += o.received_frames;
    return *this;
  }
  friend bool operator==(const WireBytes&, const WireBytes&) = default;
};

struct CollectiveContext {
  Transport& transport;
  FrameMeta meta;  // kind, the operation's tag (identical on every rank), tensor label
  // Frames carry at most this many payload bytes (also capped by the transport's maxFrameBytes). Splitting a large
  // message lets one segment be added or copied while the next is in flight (and, on emulated links, paced).
  uint64_t segment_bytes = 1 << 20;
  // Grow-only scratch owned by the caller (one per thread that runs collectives), so a steady-state run allocates
  // nothing.
  std::vector<std::byte>* scratch = nullptr;
  WireBytes wire;  // accumulated by the helpers below
  // Every request the helpers created during this operation. When the operation fails, the caller aborts the job and
  // waits these out (runCollective), so no peer is still copying from or into this rank's buffers once the error
  // reaches code that may free them.
  RequestList inflight;

  // A sub-communicator for the algorithms: when set (setGroup), rank() and size() are this rank's index in `group`
  // and the group's size, and every peer an algorithm names is an index into `group` (mapped to the transport's rank
  // in the helpers below). A hierarchical collective runs the flat algorithms on its node and leader groups this way.
  std::span<const int> group;
  int group_rank = -1;
  // inflight's size at which track() next drops the requests that are complete and held by nobody else.
  std::size_t prune_at = 64;

  int rank() const noexcept { return group.empty() ? transport.rank() : group_rank; }
  int size() const noexcept { return group.empty() ? transport.size() : static_cast<int>(group.size()); }
  // Restricts the context to `members` (transport ranks, this rank among them; must outlive the use), or lifts the
  // restriction when `members` is empty. Throws InternalError when this rank is not a member.
  void setGroup(std::span<const int> members);
  // The transport's rank of group member `peer` (the peer itself without a group).
  int peerRank(int peer) const noexcept;
  std::span<std::byte> scratchBytes(std::size_t bytes);
  // Payload bytes per frame for elements of `elem` bytes: a whole number of elements, at least one.
  uint64_t segmentFor(std::size_t elem) const noexcept;
  // Keeps `request` in `inflight`. A request the algorithm has waited and let go of is complete and no peer touches
  // its buffers any more: track() drops those, every time inflight has doubled, so an operation holds what is still
  // in flight rather than every frame it ever sent (4 (n - 1) per rank for the ring, each with its frame and its
  // simulated transfer: 2n^2 of them held to the end, gigabytes at 1,024 simulated ranks).
  void track(const Request& request);

  // One frame; the request is kept in `out`.
  void send(int peer, std::span<const std::byte> data, RequestList& out);
  // A receive of exactly data.size() bytes; wait with waitRecvs, which checks the length.
  void recv(int peer, std::span<std::byte> data, RequestList& out, LengthList& expected);
  // A single receive of exactly data.size() bytes, for callers that manage their own requests; wait with waitRecv.
  Request irecv(int peer, std::span<std::byte> data);
  void waitRecv(Request& request, uint64_t expected) const;
  // Receives adding into `data` as dtype (Transport::irecvReduce), split like sendSegments.
  void recvReduceSegments(int peer, std::span<std::byte> data, DType dtype, uint64_t segment, RequestList& out,
                          LengthList& expected);
  // A message as frames of at most `segment` bytes (none for an empty message; the receiver knows the size too).
  void sendSegments(int peer, std::span<const std::byte> data, uint64_t segment, RequestList& out);
  void recvSegments(int peer, std::span<std::byte> data, uint64_t segment, RequestList& out, LengthList& expected);
};

// Number of frames a message of `bytes` takes with frames of at most `segment` bytes.
constexpr uint64_t segmentCount(uint64_t bytes, uint64_t segment) noexcept {
  return bytes == 0 ? 0 : (bytes + segment - 1) / segment;
}

// Chunk c of n when `count` elements are split as evenly as possible, the first count % n chunks one element longer.
struct Range {
  std::size_t begin = 0;
  std::size_t size = 0;
};
constexpr Range ringChunk(std::size_t count, int n, int c) noexcept {
  const std::size_t base = count / static_cast<std::size_t>(n);
  const std::size_t rem = count % static_cast<std::size_t>(n);
  const auto cc = static_cast<std::size_t>(c);
  return Range{cc * base + (cc < rem ? cc : rem), base + (cc < rem ? 1 : 0)};
}

constexpr int modRank(int r, int n) noexcept {
  return ((r % n) + n) % n;
}

void waitAll(RequestList& requests);
// A pipelined sender keeps at most this many of its frames to one peer in flight: frames posted together may share the
// link's bandwidth on a transport that gives each its own flow (the simulated network did, before it carried a peer's
// frames as one in-order stream, core/sim/network.h) and then all arrive at the end, which would stall a receiver that
// forwards each segment as it completes -- a chain of G ranks would cost (G - 1) S / B instead of S / B.
constexpr std::size_t kPipelineWindow = 2;
// Sends one frame to `peer` after the frame kPipelineWindow places back in `sends` (this peer's sends only) is done.
void windowedSend(CollectiveContext& ctx, int peer, std::span<const std::byte> bytes, RequestList& sends);
// Waits the receives and checks that each frame had exactly its expected length (a shorter frame from a peer is a
// protocol error, never silently partial data). Clears both vectors.
void waitRecvs(RequestList& requests, LengthList& expected, const CollectiveContext& ctx);

// An allgatherv's arguments against this rank's view (sizes has one entry per rank of ctx, send is this rank's size,
// recv holds them all); returns the total. Throws InvalidArgument naming the mismatch.
uint64_t checkAllgathervArguments(const CollectiveContext& ctx, std::span<const std::byte> send,
                                  std::span<const std::byte> recv, std::span<const uint64_t> sizes);

// all[i] = rank i's `mine`: each rank's word as 8 little-endian bytes through `gather`, an allgather of 8-byte blocks
// (send: this rank's 8 bytes; recv: n * 8 bytes in rank order). The host communicator's size exchange passes its
// allgatherv algorithm, exchangeWordsBruck Bruck's.
using WordGather = std::function<void(std::span<const std::byte> send, std::span<std::byte> recv)>;
void exchangeWords(CollectiveContext& ctx, uint64_t mine, std::span<uint64_t> all, const WordGather& gather);

}  // namespace terse::comm
