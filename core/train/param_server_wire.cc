// Encodes and validates the parameter server's frames (param_server_wire.h).
#include "core/train/param_server_wire.h"

#include <algorithm>
#include <cstring>

#include "core/common/error.h"
#include "terse/sdk/half.hpp"

namespace terse::train {
namespace {

void put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint16_t get16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<uint16_t>(p[0]) | (static_cast<uint16_t>(p[1]) << 8));
}
uint32_t get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

bool isPsPullDtype(DType d) noexcept {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
}

void encodePsRequest(const PsRequestHeader& h, std::span<std::byte, kPsRequestHeaderBytes> out) noexcept {
  std::byte* p = out.data();
  put32(p, kPsRequestMagic);
  put16(p + 4, kPsWireVersion);
  p[6] = static_cast<std::byte>(h.op);
  p[7] = static_cast<std::byte>(h.dtype);
  put64(p + 8, h.step);
  put64(p + 16, h.piece);
  put64(p + 24, h.offset);
  put64(p + 32, h.numel);
  put64(p + 40, h.worker_version);
  put64(p + 48, h.payload_bytes);
}

PsRequestHeader decodePsRequest(std::span<const std::byte> frame) {
  TERSE_CHECK(
      frame.size() >= kPsRequestHeaderBytes, InvalidPayload,
      "ps request: frame of " << frame.size() << " B is shorter than the " << kPsRequestHeaderBytes << "-byte header");
  const std::byte* p = frame.data();
  TERSE_CHECK(get32(p) == kPsRequestMagic, InvalidPayload, "ps request: bad magic 0x" << std::hex << get32(p));
  TERSE_CHECK(get16(p + 4) == kPsWireVersion, InvalidPayload, "ps request: unknown version " << get16(p + 4));
  const auto op = static_cast<uint8_t>(p[6]);
  TERSE_CHECK(op >= 1 && op <= 8, InvalidPayload, "ps request: unknown op " << int{op});
  PsRequestHeader h;
  h.op = static_cast<PsOp>(op);
  const auto dt = static_cast<uint8_t>(p[7]);
  h.dtype = static_cast<DType>(dt);
  if (h.op == PsOp::kPull || h.op == PsOp::kPullRows)
    TERSE_CHECK(isPsPullDtype(h.dtype), InvalidPayload, "ps request: pull dtype " << int{dt} << " is not f32/f16/bf16");
  else
    TERSE_CHECK(dt == 0, InvalidPayload,
                "ps request: dtype field " << int{dt} << " must be 0 outside a pull (dense or rows)");
  h.step = get64(p + 8);
  h.piece = get64(p + 16);
  h.offset = get64(p + 24);
  h.numel = get64(p + 32);
  h.worker_version = get64(p + 40);
  h.payload_bytes = get64(p + 48);
  TERSE_CHECK(h.payload_bytes == frame.size() - kPsRequestHeaderBytes, InvalidPayload,
              "ps request: header says " << h.payload_bytes << " payload bytes, the frame carries "
                                         << frame.size() - kPsRequestHeaderBytes);
  return h;
}

void encodePsReply(const PsReplyHeader& h, std::span<std::byte, kPsReplyHeaderBytes> out) noexcept {
  std::byte* p = out.data();
  put32(p, kPsReplyMagic);
  put16(p + 4, kPsWireVersion);
  p[6] = static_cast<std::byte>(h.status);
  p[7] = static_cast<std::byte>(h.dtype);
  put64(p + 8, h.step);
  put64(p + 16, h.piece);
  put64(p + 24, h.payload_bytes);
}

PsReplyHeader decodePsReply(std::span<const std::byte> frame) {
  TERSE_CHECK(frame.size() >= kPsReplyHeaderBytes, InvalidPayload,
              "ps reply: frame of " << frame.size() << " B is shorter than its header");
  const std::byte* p = frame.data();
  TERSE_CHECK(get32(p) == kPsReplyMagic, InvalidPayload, "ps reply: bad magic 0x" << std::hex << get32(p));
  TERSE_CHECK(get16(p + 4) == kPsWireVersion, InvalidPayload, "ps reply: unknown version " << get16(p + 4));
  PsReplyHeader h;
  const auto st = static_cast<uint8_t>(p[6]);
  TERSE_CHECK(st <= 1, InvalidPayload, "ps reply: unknown status " << int{st});
  h.status = static_cast<PsStatus>(st);
  h.dtype = static_cast<DType>(static_cast<uint8_t>(p[7]));
  TERSE_CHECK(isPsPullDtype(h.dtype), InvalidPayload, "ps reply: dtype " << int(static_cast<uint8_t>(p[7])));
  h.step = get64(p + 8);
  h.piece = get64(p + 16);
  h.payload_bytes = get64(p + 24);
  TERSE_CHECK(h.payload_bytes == frame.size() - kPsReplyHeaderBytes, InvalidPayload,
              "ps reply: header says " << h.payload_bytes << " payload bytes, the frame carries "
                                       << frame.size() - kPsReplyHeaderBytes);
  return h;
}

uint64_t psRequestLabel(std::span<const std::byte> request) noexcept {
  const auto op = static_cast<PsOp>(request[6]);
  return op == PsOp::kPush || op == PsOp::kPushRows ? get64(request.data() + 16) : comm::kNoTensor;
}

uint64_t psPullBodyBytes(const PsPlan& plan, int shard, DType dtype) {
  const auto [b, e] = plan.ranges[static_cast<std::size_t>(shard)];
  return plan.shard_pieces[static_cast<std::size_t>(shard)].size() * 8 + (e - b) * dtypeSize(dtype);
}

std::size_t psMaxReplyBytes(const PsPlan& plan, int shard, std::span<const uint64_t> delta_pull_max_payloads) {
  uint64_t body = std::max<uint64_t>(psPullBodyBytes(plan, shard, DType::kF32), kPsMaxErrorText);
  if (!delta_pull_max_payloads.empty()) body = std::max(body, psDeltaPullMaxBodyBytes(delta_pull_max_payloads));
  return kPsReplyHeaderBytes + body;
}

uint64_t psDeltaPullMaxBodyBytes(std::span<const uint64_t> max_payloads) {
  uint64_t n = 8 * max_payloads.size() + 8;  // versions, checksum
  for (uint64_t m : max_payloads) n += 8 + psPad8(m);
  return n;
}

uint64_t encodePsDeltaPullChecksum(std::span<std::byte> body, uint64_t at, uint64_t checksum) noexcept {
  put64(body.data() + at, checksum);
  return at + 8;
}

uint64_t psValuesChecksum(std::span<const float> values) noexcept {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t lane[4] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9ce484222325cbf2ull, 0x2325cbf29ce48422ull};
  const std::size_t n = values.size();
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) {
      uint32_t bits;
      std::memcpy(&bits, &values[i + static_cast<std::size_t>(k)], 4);
      lane[k] = (lane[k] ^ bits) * kPrime;
    }
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], 4);
    lane[0] = (lane[0] ^ bits) * kPrime;
  }
  uint64_t h = n;
  for (uint64_t l : lane) h = (h ^ l) * kPrime;
  return h;
}

uint64_t encodePsDeltaPullEntry(std::span<std::byte> body, uint64_t at, uint64_t payload_bytes) noexcept {
  put64(body.data() + at, payload_bytes);
  const uint64_t end = at + 8 + payload_bytes, padded = at + 8 + psPad8(payload_bytes);
  std::fill(body.begin() + static_cast<std::ptrdiff_t>(end), body.begin() + static_cast<std::ptrdiff_t>(padded),
            std::byte{0});
  return padded - at;
}

PsDeltaPullBody decodePsDeltaPullBody(std::span<const std::byte> body, std::span<uint64_t> versions,
                                      std::span<const uint64_t> max_payloads) {
  const std::size_t pieces = versions.size();
  TERSE_CHECK(max_payloads.size() == pieces, InvalidArgument,
              "ps delta pull: " << max_payloads.size() << " payload bounds for " << pieces << " pieces");
  TERSE_CHECK(body.size() / 8 >= pieces, InvalidPayload,
              "ps delta pull reply: body of " << body.size() << " B is shorter than its " << pieces << " versions");
  for (std::size_t i = 0; i < pieces; ++i) versions[i] = get64(body.data() + 8 * i);
  PsDeltaPullBody out;
  uint64_t at = 8 * pieces;
  for (std::size_t i = 0; i < pieces; ++i) {
    TERSE_CHECK(body.size() - at >= 8, InvalidPayload,
                "ps delta pull reply: the body ends before piece " << i << "'s length (" << body.size() << " B)");
    const uint64_t n = get64(body.data() + at);
    at += 8;
    TERSE_CHECK(n <= max_payloads[i], InvalidPayload,
                "ps delta pull reply: piece " << i << "'s payload of " << n << " B exceeds the pull compressor's "
                                              << max_payloads[i] << " B");
    // n first: padding a length near 2^64 would wrap around to a small one.
    TERSE_CHECK(n <= body.size() - at && psPad8(n) <= body.size() - at, InvalidPayload,
                "ps delta pull reply: piece " << i << "'s payload of " << n << " B runs past the body's end ("
                                              << body.size() << " B)");
    out.payloads.push_back(body.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(n)));
    for (uint64_t j = n; j < psPad8(n); ++j)
      TERSE_CHECK(body[static_cast<std::size_t>(at + j)] == std::byte{0}, InvalidPayload,
                  "ps delta pull reply: piece " << i << "'s padding is not zero");
    at += psPad8(n);
  }
  TERSE_CHECK(body.size() - at == 8, InvalidPayload,
              "ps delta pull reply: " << body.size() - at << " B after the last piece, expected the 8-byte checksum");
  out.checksum = get64(body.data() + at);
  return out;
}

namespace {

// Values cast to `dtype` at `out`; returns the bytes written.
std::size_t putValues(std::byte* out, std::span<const float> values, DType dtype) {
  if (dtype == DType::kF32) {
    if (!values.empty()) std::memcpy(out, values.data(), values.size() * sizeof(float));
    return values.size() * sizeof(float);
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    const uint16_t x = dtype == DType::kF16 ? sdk::floatToHalf(values[i]) : sdk::floatToBf16(values[i]);
    std::memcpy(out + 2 * i, &x, 2);  // the host is little-endian (as frame.h's inproc path assumes)
  }
  return values.size() * 2;
}

std::size_t getValues(const std::byte* in, std::span<float> values, DType dtype) {
  if (dtype == DType::kF32) {
    if (!values.empty()) std::memcpy(values.data(), in, values.size() * sizeof(float));
    return values.size() * sizeof(float);
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    uint16_t x;
    std::memcpy(&x, in + 2 * i, 2);
    values[i] = dtype == DType::kF16 ? sdk::halfToFloat(x) : sdk::bf16ToFloat(x);
  }
  return values.size() * 2;
}

// Reads k row ids at `p` for piece `piece` into `out`, checking each (`what` names the frame in the message).
void readRowIds(const PsPlan& plan, const PsPiece& piece, const std::byte* p, uint64_t k, std::vector<uint32_t>& out,
                const char* what) {
  const uint64_t rows = pieceTensorRows(plan, piece);
  const auto [first, last] = pieceRows(plan, piece);
  out.resize(static_cast<std::size_t>(k));
  for (uint64_t i = 0; i < k; ++i) {
    const uint32_t id = get32(p + 4 * i);
    TERSE_CHECK(id < rows, InvalidPayload,
                what << ": row id " << id << " (entry " << i << ") outside the tensor's " << rows << " rows");
    TERSE_CHECK(id >= first && id < last, InvalidPayload,
                what << ": row id " << id << " (entry " << i << ") lies outside piece " << piece.id << " (rows "
                     << first << ".." << last - 1 << ")");
    if (i > 0) {
      TERSE_CHECK(id != out[i - 1], InvalidPayload, what << ": duplicate row id " << id << " (entry " << i << ")");
      TERSE_CHECK(id > out[i - 1], InvalidPayload,
                  what << ": row ids not ascending: " << id << " after " << out[i - 1] << " (entry " << i << ")");
    }
    out[i] = id;
  }
}

}  // namespace

void encodePsPullBody(std::span<const uint64_t> versions, std::span<const float> values, DType dtype,
                      std::span<std::byte> out) noexcept {
  std::byte* body = out.data();
  for (std::size_t i = 0; i < versions.size(); ++i) put64(body + 8 * i, versions[i]);
  putValues(body + 8 * versions.size(), values, dtype);
}

void decodePsPullBody(std::span<const std::byte> body, DType dtype, std::span<uint64_t> versions,
                      std::span<float> values) {
  const uint64_t expected = versions.size() * 8 + values.size() * dtypeSize(dtype);
  TERSE_CHECK(body.size() == expected, InvalidPayload,
              "ps pull reply: body of " << body.size() << " B, expected " << expected);
  const std::byte* p = body.data();
  for (std::size_t i = 0; i < versions.size(); ++i) versions[i] = get64(p + 8 * i);
  getValues(p + 8 * versions.size(), values, dtype);
}

uint64_t psRowElements(const PsPlan& plan, const PsPiece& p, std::span<const uint32_t> ids) {
  uint64_t n = 0;
  for (uint32_t r : ids) {
    const RowSegment s = rowSegment(plan, p, r);
    n += s.end - s.begin;
  }
  return n;
}

uint64_t psRowPushBytes(const PsPlan& plan, const PsPiece& p, std::span<const uint32_t> ids) {
  return kPsRowPushHeaderBytes + 4 * ids.size() + 4 * psRowElements(plan, p, ids);
}

void encodePsRowPush(const PsPlan& plan, const PsPiece& p, std::span<const uint32_t> ids, const float* grad,
                     std::span<std::byte> out) noexcept {
  std::byte* o = out.data();
  put32(o, static_cast<uint32_t>(ids.size()));
  put32(o + 4, static_cast<uint32_t>(plan.row_length[p.tensor]));
  o += kPsRowPushHeaderBytes;
  for (uint32_t r : ids) put32(o, r), o += 4;
  for (uint32_t r : ids) {
    const RowSegment s = rowSegment(plan, p, r);
    o += putValues(o, std::span<const float>(grad + s.begin, s.end - s.begin), DType::kF32);
  }
}

std::vector<uint32_t> decodePsRowPush(const PsPlan& plan, const PsPiece& p, std::span<const std::byte> payload) {
  TERSE_CHECK(payload.size() >= kPsRowPushHeaderBytes, InvalidPayload,
              "row push: payload size " << payload.size() << " B is shorter than its 8-byte header");
  const uint64_t k = get32(payload.data()), len = get32(payload.data() + 4);
  TERSE_CHECK(
      len == plan.row_length[p.tensor], InvalidPayload,
      "row push: row length " << len << ", tensor " << p.tensor << " has rows of " << plan.row_length[p.tensor]);
  TERSE_CHECK(k <= (payload.size() - kPsRowPushHeaderBytes) / 4, InvalidPayload,
              "row push: row count " << k << " needs " << 4 * k << " B of ids, the payload carries "
                                     << payload.size() - kPsRowPushHeaderBytes);
  std::vector<uint32_t> ids;
  readRowIds(plan, p, payload.data() + kPsRowPushHeaderBytes, k, ids, "row push");
  const uint64_t expected = psRowPushBytes(plan, p, ids);
  TERSE_CHECK(payload.size() == expected, InvalidPayload,
              "row push: payload size " << payload.size() << " B, its " << k << " row ids imply " << expected);
  return ids;
}

std::vector<std::byte> encodePsRowPull(const PsPlan& plan, int shard, std::span<const std::vector<uint32_t>> ids) {
  const auto& pieces = plan.shard_pieces[static_cast<std::size_t>(shard)];
  std::size_t n = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i)
    if (isRowSparse(plan, plan.pieces[pieces[i]])) n += 4 + 4 * ids[i].size();
  std::vector<std::byte> out(n);
  std::byte* o = out.data();
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (!isRowSparse(plan, plan.pieces[pieces[i]])) continue;
    put32(o, static_cast<uint32_t>(ids[i].size())), o += 4;
    for (uint32_t r : ids[i]) put32(o, r), o += 4;
  }
  return out;
}

std::vector<std::vector<uint32_t>> decodePsRowPull(const PsPlan& plan, int shard, std::span<const std::byte> payload) {
  const auto& pieces = plan.shard_pieces[static_cast<std::size_t>(shard)];
  std::vector<std::vector<uint32_t>> ids(pieces.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const PsPiece& p = plan.pieces[pieces[i]];
    if (!isRowSparse(plan, p)) continue;
    TERSE_CHECK(payload.size() - at >= 4, InvalidPayload,
                "row pull: payload size " << payload.size() << " B ends before piece " << p.id << "'s row count");
    const uint64_t k = get32(payload.data() + at);
    at += 4;
    TERSE_CHECK(k <= (payload.size() - at) / 4, InvalidPayload,
                "row pull: row count " << k << " of piece " << p.id << " needs " << 4 * k << " B, "
                                       << payload.size() - at << " remain");
    readRowIds(plan, p, payload.data() + at, k, ids[i], "row pull");
    at += 4 * k;
  }
  TERSE_CHECK(at == payload.size(), InvalidPayload,
              "row pull: payload size " << payload.size() << " B, its row counts account for " << at);
  return ids;
}

uint64_t psRowPullBodyBytes(const PsPlan& plan, int shard, std::span<const std::vector<uint32_t>> ids, DType dtype) {
  const auto& pieces = plan.shard_pieces[static_cast<std::size_t>(shard)];
  uint64_t n = 8 * pieces.size();
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const PsPiece& p = plan.pieces[pieces[i]];
    n += (isRowSparse(plan, p) ? psRowElements(plan, p, ids[i]) : p.numel) * dtypeSize(dtype);
  }
  return n;
}

void encodePsRowPullBody(const PsPlan& plan, int shard, std::span<const std::vector<uint32_t>> ids,
                         std::span<const uint64_t> versions, std::span<const float> values, DType dtype,
                         std::span<std::byte> out) noexcept {
  const auto& pieces = plan.shard_pieces[static_cast<std::size_t>(shard)];
  const uint64_t begin = plan.ranges[static_cast<std::size_t>(shard)].first;
  std::byte* o = out.data();
  for (std::size_t i = 0; i < versions.size(); ++i) put64(o + 8 * i, versions[i]);
  o += 8 * versions.size();
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const PsPiece& p = plan.pieces[pieces[i]];
    const float* v = values.data() + (p.flat_begin - begin);
    if (!isRowSparse(plan, p)) {
      o += putValues(o, std::span<const float>(v, p.numel), dtype);
      continue;
    }
    for (uint32_t r : ids[i]) {
      const RowSegment s = rowSegment(plan, p, r);
      o += putValues(o, std::span<const float>(v + s.begin, s.end - s.begin), dtype);
    }
  }
}

void decodePsRowPullBody(const PsPlan& plan, int shard, std::span<const std::vector<uint32_t>> ids,
                         std::span<const std::byte> body, DType dtype, std::span<uint64_t> versions,
                         std::span<float> params) {
  const uint64_t expected = psRowPullBodyBytes(plan, shard, ids, dtype);
  TERSE_CHECK(body.size() == expected, InvalidPayload,
              "ps row pull reply: body of " << body.size() << " B, expected " << expected);
  const auto& pieces = plan.shard_pieces[static_cast<std::size_t>(shard)];
  const std::byte* in = body.data();
  for (std::size_t i = 0; i < versions.size(); ++i) versions[i] = get64(in + 8 * i);
  in += 8 * versions.size();
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const PsPiece& p = plan.pieces[pieces[i]];
    float* v = params.data() + p.flat_begin;
    if (!isRowSparse(plan, p)) {
      in += getValues(in, std::span<float>(v, p.numel), dtype);
      continue;
    }
    for (uint32_t r : ids[i]) {
      const RowSegment s = rowSegment(plan, p, r);
      in += getValues(in, std::span<float>(v + s.begin, s.end - s.begin), dtype);
    }
  }
}

}  // namespace terse::train
