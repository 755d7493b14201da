#include "core/comm/frame.h"

#include <cstring>
#include <sstream>

#include "core/common/error.h"

namespace terse::comm {
namespace {

// Explicit little-endian so the tcp transport's frames mean the same on any host.
template <class T>
void putLe(std::byte* p, T v) noexcept {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    p[i] = static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF);
}
template <class T>
T getLe(const std::byte* p) noexcept {
  uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

std::string_view opKindName(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::kP2P:
      return "p2p";
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kControl:
      return "control";
  }
  return "?";
}

EncodedHeader encodeFrameHeader(const FrameHeader& h) noexcept {
  EncodedHeader out{};
  putLe<uint32_t>(out.data() + 0, kFrameMagic);
  putLe<uint16_t>(out.data() + 4, kFrameVersion);
  putLe<uint8_t>(out.data() + 6, static_cast<uint8_t>(h.meta.kind));
  putLe<uint8_t>(out.data() + 7, 0);
  putLe<uint64_t>(out.data() + 8, h.meta.tag);
  putLe<uint64_t>(out.data() + 16, h.meta.tensor);
  putLe<uint64_t>(out.data() + 24, h.length);
  return out;
}

FrameHeader decodeFrameHeader(std::span<const std::byte> bytes, uint64_t max_length, std::string_view where) {
  TERSE_CHECK(bytes.size() == kFrameHeaderBytes, InvalidPayload,
              where << ": header of " << bytes.size() << " bytes, expected " << kFrameHeaderBytes);
  const auto magic = getLe<uint32_t>(bytes.data() + 0);
  TERSE_CHECK(magic == kFrameMagic, InvalidPayload,
              where << ": bad magic 0x" << std::hex << magic << ", expected 0x" << kFrameMagic
                    << " (not a terse frame, or the stream lost its framing)");
  const auto version = getLe<uint16_t>(bytes.data() + 4);
  TERSE_CHECK(version == kFrameVersion, InvalidPayload,
              where << ": frame version " << version << ", this build speaks version " << kFrameVersion);
  const auto kind = getLe<uint8_t>(bytes.data() + 6);
  TERSE_CHECK(kind < kNumOpKinds, InvalidPayload, where << ": unknown op kind " << static_cast<int>(kind));
  const auto flags = getLe<uint8_t>(bytes.data() + 7);
  TERSE_CHECK(flags == 0, InvalidPayload,
              where << ": reserved flags 0x" << std::hex << static_cast<int>(flags) << " must be 0");
  FrameHeader h;
  h.meta.kind = static_cast<OpKind>(kind);
  h.meta.tag = getLe<uint64_t>(bytes.data() + 8);
  h.meta.tensor = getLe<uint64_t>(bytes.data() + 16);
  h.length = getLe<uint64_t>(bytes.data() + 24);
  TERSE_CHECK(h.length <= max_length, InvalidPayload,
              where << ": payload length " << h.length << " exceeds the limit of " << max_length << " bytes");
  return h;
}

}  // namespace terse::comm
