#include "core/comm/collective.h"

#include <algorithm>

#include "core/common/error.h"

namespace terse::comm {

std::span<std::byte> CollectiveContext::scratchBytes(std::size_t bytes) {
  TERSE_CHECK(scratch != nullptr, InternalError, "collective without a scratch buffer");
  if (scratch->size() < bytes) scratch->resize(bytes);
  return std::span<std::byte>(scratch->data(), bytes);
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

void CollectiveContext::send(int peer, std::span<const std::byte> data, std::vector<Request>& out) {
  out.push_back(transport.isend(peerRank(peer), meta, data));
  inflight.push_back(out.back());
  wire.sent_bytes += frameWireBytes(data.size());
  ++wire.sent_frames;
}

void CollectiveContext::recv(int peer, std::span<std::byte> data, std::vector<Request>& out,
                             std::vector<uint64_t>& expected) {
  out.push_back(transport.irecv(peerRank(peer), meta, data));
  inflight.push_back(out.back());
  expected.push_back(data.size());
  wire.received_bytes += frameWireBytes(data.size());
  ++wire.received_frames;
}

Request CollectiveContext::irecv(int peer, std::span<std::byte> data) {
  wire.received_bytes += frameWireBytes(data.size());
  ++wire.received_frames;
  inflight.push_back(transport.irecv(peerRank(peer), meta, data));
  return inflight.back();
}

void CollectiveContext::waitRecv(Request& request, uint64_t expected) const {
  request.wait();
  TERSE_CHECK(request.bytes() == expected, InvalidPayload,
              "rank " << transport.rank() << ": a " << opKindName(meta.kind) << " frame carried " << request.bytes()
                      << " bytes where " << expected << " were expected");
}

void CollectiveContext::sendSegments(int peer, std::span<const std::byte> data, uint64_t segment,
                                     std::vector<Request>& out) {
  for (std::size_t off = 0; off < data.size(); off += segment)
    send(peer, data.subspan(off, std::min<std::size_t>(segment, data.size() - off)), out);
}

void CollectiveContext::recvSegments(int peer, std::span<std::byte> data, uint64_t segment, std::vector<Request>& out,
                                     std::vector<uint64_t>& expected) {
  for (std::size_t off = 0; off < data.size(); off += segment)
    recv(peer, data.subspan(off, std::min<std::size_t>(segment, data.size() - off)), out, expected);
}

void CollectiveContext::recvReduceSegments(int peer, std::span<std::byte> data, DType dtype, uint64_t segment,
                                           std::vector<Request>& out, std::vector<uint64_t>& expected) {
  for (std::size_t off = 0; off < data.size(); off += segment) {
    const std::size_t len = std::min<std::size_t>(segment, data.size() - off);
    out.push_back(transport.irecvReduce(peerRank(peer), meta, data.subspan(off, len), dtype));
    inflight.push_back(out.back());
    expected.push_back(len);
    wire.received_bytes += frameWireBytes(len);
    ++wire.received_frames;
  }
}

void waitAll(std::vector<Request>& requests) {
  for (auto& r : requests) r.wait();
  requests.clear();
}

void windowedSend(CollectiveContext& ctx, int peer, std::span<const std::byte> bytes, std::vector<Request>& sends) {
  if (sends.size() >= kPipelineWindow) sends[sends.size() - kPipelineWindow].wait();
  ctx.send(peer, bytes, sends);
}

void waitRecvs(std::vector<Request>& requests, std::vector<uint64_t>& expected, const CollectiveContext& ctx) {
  for (std::size_t i = 0; i < requests.size(); ++i) ctx.waitRecv(requests[i], expected[i]);
  requests.clear();
  expected.clear();
}

void exchangeWords(CollectiveContext& ctx, uint64_t mine, std::span<uint64_t> all, const WordGather& gather) {
  const auto n = static_cast<std::size_t>(ctx.size());
  TERSE_CHECK(all.size() == n, InvalidArgument, "exchanging words: " << all.size() << " slots for " << n << " ranks");
  std::byte mine_le[8];
  for (int i = 0; i < 8; ++i) mine_le[i] = static_cast<std::byte>((mine >> (8 * i)) & 0xFF);
  const std::span<std::byte> words = ctx.scratchBytes(8 * n);
  gather(std::span<const std::byte>(mine_le, 8), words);
  for (std::size_t j = 0; j < n; ++j) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(words[8 * j + static_cast<std::size_t>(i)]) << (8 * i);
    all[j] = v;
  }
}

}  // namespace terse::comm
