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
  TERSE_CHECK(op >= 1 && op <= 5, InvalidPayload, "ps request: unknown op " << int{op});
  PsRequestHeader h;
  h.op = static_cast<PsOp>(op);
  const auto dt = static_cast<uint8_t>(p[7]);
  h.dtype = static_cast<DType>(dt);
  if (h.op == PsOp::kPull)
    TERSE_CHECK(isPsPullDtype(h.dtype), InvalidPayload, "ps request: pull dtype " << int{dt} << " is not f32/f16/bf16");
  else
    TERSE_CHECK(dt == 0, InvalidPayload, "ps request: dtype field " << int{dt} << " must be 0 outside a pull");
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
  return static_cast<PsOp>(request[6]) == PsOp::kPush ? get64(request.data() + 16) : comm::kNoTensor;
}

uint64_t psPullBodyBytes(const PsPlan& plan, int shard, DType dtype) {
  const auto [b, e] = plan.ranges[static_cast<std::size_t>(shard)];
  return plan.shard_pieces[static_cast<std::size_t>(shard)].size() * 8 + (e - b) * dtypeSize(dtype);
}

std::size_t psMaxReplyBytes(const PsPlan& plan, int shard) {
  return kPsReplyHeaderBytes + std::max<uint64_t>(psPullBodyBytes(plan, shard, DType::kF32), kPsMaxErrorText);
}

void encodePsPullBody(std::span<const uint64_t> versions, std::span<const float> values, DType dtype,
                      std::span<std::byte> out) noexcept {
  std::byte* body = out.data();
  for (std::size_t i = 0; i < versions.size(); ++i) put64(body + 8 * i, versions[i]);
  std::byte* v = body + 8 * versions.size();
  if (dtype == DType::kF32) {
    if (!values.empty()) std::memcpy(v, values.data(), values.size() * sizeof(float));
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) {
      const uint16_t x = dtype == DType::kF16 ? sdk::floatToHalf(values[i]) : sdk::floatToBf16(values[i]);
      std::memcpy(v + 2 * i, &x, 2);  // the host is little-endian (as frame.h's inproc path assumes)
    }
  }
}

void decodePsPullBody(std::span<const std::byte> body, DType dtype, std::span<uint64_t> versions,
                      std::span<float> values) {
  const uint64_t expected = versions.size() * 8 + values.size() * dtypeSize(dtype);
  TERSE_CHECK(body.size() == expected, InvalidPayload,
              "ps pull reply: body of " << body.size() << " B, expected " << expected);
  const std::byte* p = body.data();
  for (std::size_t i = 0; i < versions.size(); ++i) versions[i] = get64(p + 8 * i);
  const std::byte* v = p + 8 * versions.size();
  if (dtype == DType::kF32) {
    if (!values.empty()) std::memcpy(values.data(), v, values.size() * sizeof(float));
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) {
      uint16_t x;
      std::memcpy(&x, v + 2 * i, 2);
      values[i] = dtype == DType::kF16 ? sdk::halfToFloat(x) : sdk::bf16ToFloat(x);
    }
  }
}

}  // namespace terse::train
