#include "core/comm/collective.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/common/error.h"

namespace terse::comm {

std::span<std::byte> CollectiveContext::scratchBytes(std::size_t bytes) {
  TERSE_CHECK(scratch != nullptr, InternalError, "collective without a scratch buffer");
  if (scratch->size() < bytes) scratch->resize(bytes);
  return std::span<std::byte>(scratch->data(), bytes);
}

void CollectiveContext::track(const Request& request) {
  if (inflight.size() >= prune_at) {
    inflight.erase(std::remove_if(inflight.begin(), inflight.end(),
                                  [](Request& r) {
                                    if (!r.alone()) return false;
                                    try {
                                      return r.test();
                                    } catch (...) {
                                      return false;  // kept: the failure path waits it out (HostCommunicator::run)
                                    }
                                  }),
                   inflight.end());
    prune_at = std::max<std::size_t>(64, 2 * inflight.size());
  }
  inflight.push_back(request);
}

uint64_t CollectiveContext::segmentFor(std::size_t elem) const noexcept {
  const uint64_t cap = std::min<uint64_t>(segment_bytes, transport.maxFrameBytes());
  const uint64_t e = elem == 0 ? 1 : elem;
  return std::max<uint64_t>(e, cap / e * e);
}

void CollectiveContext::setGroup(std::span<const int> members) {
  group = members;
  group_rank = -1;
  if (members.empty()) return;
  const auto it = std::find(members.begin(), members.end(), transport.rank());
  TERSE_CHECK(it != members.end(), InternalError,
              "rank " << transport.rank() << " ran a collective step of a group it is not a member of");
  group_rank = static_cast<int>(it - members.begin());
}

int CollectiveContext::peerRank(int peer) const noexcept {
  return group.empty() ? peer : group[static_cast<std::size_t>(peer)];
}

void CollectiveContext::send(int peer, std::span<const std::byte> data, RequestList& out) {
  out.push_back(transport.isend(peerRank(peer), meta, data));
  track(out.back());
  wire.sent_bytes += frameWireBytes(data.size());
  ++wire.sent_frames;
}

void CollectiveContext::recv(int peer, std::span<std::byte> data, RequestList& out, LengthList& expected) {
  out.push_back(transport.irecv(peerRank(peer), meta, data));
  track(out.back());
  expected.push_back(data.size());
  wire.received_bytes += frameWireBytes(data.size());
  ++wire.received_frames;
}

Request CollectiveContext::irecv(int peer, std::span<std::byte> data) {
  wire.received_bytes += frameWireBytes(data.size());
  ++wire.received_frames;
  Request r = transport.irecv(peerRank(peer), meta, data);
  track(r);
  return r;
}

void CollectiveContext::waitRecv(Request& request, uint64_t expected) const {
  request.wait();
  TERSE_CHECK(request.bytes() == expected, InvalidPayload,
              "rank " << transport.rank() << ": a " << opKindName(meta.kind) << " frame carried " << request.bytes()
                      << " bytes where " << expected << " were expected");
}

void CollectiveContext::sendSegments(int peer, std::span<const std::byte> data, uint64_t segment, RequestList& out) {
  for (std::size_t off = 0; off < data.size(); off += segment)
    send(peer, data.subspan(off, std::min<std::size_t>(segment, data.size() - off)), out);
}

void CollectiveContext::recvSegments(int peer, std::span<std::byte> data, uint64_t segment, RequestList& out,
                                     LengthList& expected) {
  for (std::size_t off = 0; off < data.size(); off += segment)
    recv(peer, data.subspan(off, std::min<std::size_t>(segment, data.size() - off)), out, expected);
}

void CollectiveContext::recvReduceSegments(int peer, std::span<std::byte> data, DType dtype, uint64_t segment,
                                           RequestList& out, LengthList& expected) {
  for (std::size_t off = 0; off < data.size(); off += segment) {
    const std::size_t len = std::min<std::size_t>(segment, data.size() - off);
    out.push_back(transport.irecvReduce(peerRank(peer), meta, data.subspan(off, len), dtype));
    track(out.back());
    expected.push_back(len);
    wire.received_bytes += frameWireBytes(len);
    ++wire.received_frames;
  }
}

void waitAll(RequestList& requests) {
  for (auto& r : requests) r.wait();
  requests.clear();
}

void windowedSend(CollectiveContext& ctx, int peer, std::span<const std::byte> bytes, RequestList& sends) {
  if (sends.size() >= kPipelineWindow) sends[sends.size() - kPipelineWindow].wait();
  ctx.send(peer, bytes, sends);
}

void waitRecvs(RequestList& requests, LengthList& expected, const CollectiveContext& ctx) {
  for (std::size_t i = 0; i < requests.size(); ++i) ctx.waitRecv(requests[i], expected[i]);
  requests.clear();
  expected.clear();
}

uint64_t checkAllgathervArguments(const CollectiveContext& ctx, std::span<const std::byte> send,
                                  std::span<const std::byte> recv, std::span<const uint64_t> sizes) {
  const int n = ctx.size();
  const int r = ctx.rank();
  TERSE_CHECK(sizes.size() == static_cast<std::size_t>(n), InvalidArgument,
              "allgatherv: " << sizes.size() << " sizes for " << n << " ranks");
  TERSE_CHECK(send.size() == sizes[static_cast<std::size_t>(r)], InvalidArgument,
              "allgatherv: rank " << r << " sends " << send.size() << " bytes but sizes says "
                                  << sizes[static_cast<std::size_t>(r)]);
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  TERSE_CHECK(recv.size() >= total, InvalidArgument,
              "allgatherv: receive buffer of " << recv.size() << " bytes for " << total << " gathered bytes");
  return total;
}

void exchangeWords(CollectiveContext& ctx, uint64_t mine, std::span<uint64_t> all, const WordGather& gather) {
  const auto n = static_cast<std::size_t>(ctx.size());
  TERSE_CHECK(all.size() == n, InvalidArgument, "exchanging words: " << all.size() << " slots for " << n << " ranks");
  std::byte mine_le[8];
  for (int i = 0; i < 8; ++i) mine_le[i] = static_cast<std::byte>((mine >> (8 * i)) & 0xFF);
  // Straight into `all`, each word decoded in place: the gather may use the context's scratch itself.
  gather(std::span<const std::byte>(mine_le, 8), std::as_writable_bytes(all));
  for (uint64_t& word : all) {
    std::byte le[8];
    std::memcpy(le, &word, 8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(le[i]) << (8 * i);
    word = v;
  }
}

}  // namespace terse::comm
