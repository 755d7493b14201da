// Frames: the unit every transport moves between two ranks. A frame is a fixed 32-byte header followed by `length`
// payload bytes. The header is what a receiver reads off an untrusted byte stream (the tcp transport's sockets), so
// it is encoded explicitly little-endian and validated field by field before anything trusts its length; the inproc
// transport stores the same encoded bytes and runs the same validation, so both transports count and check frames
// identically and a test can inject a corrupted header into either.
//
//   offset  size  field
//        0     4  magic    "TRSF" (0x46535254 little-endian)
//        4     2  version  kFrameVersion (1)
//        6     1  kind     OpKind: which operation the frame belongs to (byte accounting, protocol checks)
//        7     1  flags    0 (reserved; a nonzero value is rejected so a later version can use it)
//        8     8  tag      matching key: a receive takes the first frame of its peer with the same tag
//       16     8  tensor   accounting label (the tensor or chunk id the op serves; kNoTensor when none)
//       24     8  length   payload bytes after the header, <= the receiver's max frame size
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

namespace terse::comm {

// What a frame is part of. Byte accounting is kept per kind; a receive checks the kind it expects, so two operations
// that collide on a tag are a clear protocol error instead of silently mixed data.
enum class OpKind : uint8_t {
  kP2P = 0,        // point-to-point send/recv called directly on a transport
  kAllreduce = 1,  // ring or recursive-doubling allreduce
  kAllgather = 2,  // allgatherv, including the exchange of sizes before it
  kBroadcast = 3,
  kBarrier = 4,
  kControl = 5,  // transport-internal messages (tcp: handshake, abort notices)
};
inline constexpr std::size_t kNumOpKinds = 6;
std::string_view opKindName(
    OpKind kind) noexcept;  // "p2p", "allreduce", "allgather", "broadcast", "barrier", "control"

using Tag = uint64_t;
// Collective operations draw their tags from a per-communicator sequence with this bit set; tags a user passes to
// point-to-point send/recv must leave it clear, so the two can never collide.
inline constexpr Tag kCollectiveTagBit = Tag{1} << 63;
inline constexpr uint64_t kNoTensor = std::numeric_limits<uint64_t>::max();

inline constexpr uint32_t kFrameMagic = 0x46535254u;  // bytes 'T' 'R' 'S' 'F'
inline constexpr uint16_t kFrameVersion = 1;
inline constexpr std::size_t kFrameHeaderBytes = 32;
// Default ceiling on one frame's payload; collectives split larger messages into several frames.
inline constexpr uint64_t kDefaultMaxFrameBytes = uint64_t{1} << 30;

// The bytes a frame of `payload` bytes occupies on the wire; byte accounting and emulated pacing use this.
constexpr uint64_t frameWireBytes(uint64_t payload) noexcept {
  return kFrameHeaderBytes + payload;
}

// The fields of a header a sender chooses (magic, version and flags are fixed).
struct FrameMeta {
  OpKind kind = OpKind::kP2P;
  Tag tag = 0;
  uint64_t tensor = kNoTensor;
};

struct FrameHeader {
  FrameMeta meta;
  uint64_t length = 0;
};

using EncodedHeader = std::array<std::byte, kFrameHeaderBytes>;

EncodedHeader encodeFrameHeader(const FrameHeader& header) noexcept;

// Parses and validates a header read from a peer. Throws InvalidPayload naming `where` (e.g. "frame from rank 2 to
// rank 0"), the field and its value for: a wrong magic, an unknown version, an unknown kind, nonzero flags, or a length
// above max_length.
FrameHeader decodeFrameHeader(std::span<const std::byte> bytes, uint64_t max_length, std::string_view where);

}  // namespace terse::comm
