// The tcp transport's own wire messages (transport.h), apart from the frames every transport carries (frame.h):
//
// (How many connections may be in their job-token handshake at once, and for how long, is handshake_slots.h's.)
//
// Hello, sent once per connection right after the job-token handshake (auth.h), by the connecting rank, and answered
// with an acknowledgement of the same layout by the accepting rank:
//
//   offset  size  field
//        0     4  magic        "TRSH" (hello) or "TRSK" (acknowledgement), little-endian
//        4     2  version      kHelloVersion
//        6     2  label bytes  <= kMaxLabelBytes; the host label follows the 16 bytes
//        8     4  rank         the sender's rank
//       12     4  world size   the sender's world size (a hello from another job's size is refused)
//
// Control frames (frame.h, OpKind::kControl), told apart by their tag: a heartbeat (no payload) on an idle connection,
// an abort notice (payload: the reason, at most kMaxControlBytes), and a goodbye (no payload) as the last frame a
// transport sends before it closes the connection, so the peer can tell an orderly end from a crash.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/comm/frame.h"
#include "core/common/error.h"

namespace terse::comm::tcp_wire {

inline constexpr Tag kHeartbeatTag = 1;
inline constexpr Tag kAbortTag = 2;
inline constexpr Tag kByeTag = 3;
// Bounds what a peer can make this rank allocate for one control frame (an abort reason is a line of text).
inline constexpr uint64_t kMaxControlBytes = 4096;

inline constexpr uint32_t kHelloMagic = 0x48535254u;  // bytes 'T' 'R' 'S' 'H'
inline constexpr uint32_t kAckMagic = 0x4B535254u;    // bytes 'T' 'R' 'S' 'K'
inline constexpr uint16_t kHelloVersion = 1;
inline constexpr std::size_t kHelloBytes = 16;
inline constexpr std::size_t kMaxLabelBytes = 255;

using HelloBytes = std::array<std::byte, kHelloBytes>;

struct Hello {
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint16_t label_bytes = 0;
};

inline HelloBytes encodeHello(uint32_t magic, uint32_t rank, uint32_t world_size, std::string_view label) {
  HelloBytes out{};
  auto put = [&](std::size_t at, uint64_t v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
  };
  put(0, magic, 4);
  put(4, kHelloVersion, 2);
  put(6, std::min(label.size(), kMaxLabelBytes), 2);
  put(8, rank, 4);
  put(12, world_size, 4);
  return out;
}

// Throws InvalidPayload for a wrong magic, version or label length.
inline Hello decodeHello(std::span<const std::byte> b, uint32_t magic) {
  auto get = [&](std::size_t at, std::size_t n) {
    uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
    return v;
  };
  TERSE_CHECK(b.size() == kHelloBytes, InvalidPayload, "tcp hello of " << b.size() << " bytes");
  TERSE_CHECK(get(0, 4) == magic, InvalidPayload,
              "not a terse tcp transport hello (magic 0x" << std::hex << get(0, 4) << ", expected 0x" << magic << ")");
  TERSE_CHECK(get(4, 2) == kHelloVersion, InvalidPayload,
              "tcp hello version " << get(4, 2) << ", this build speaks " << kHelloVersion);
  Hello h;
  h.label_bytes = static_cast<uint16_t>(get(6, 2));
  TERSE_CHECK(h.label_bytes <= kMaxLabelBytes, InvalidPayload,
              "tcp hello: host label of " << h.label_bytes << " bytes exceeds " << kMaxLabelBytes);
  h.rank = static_cast<uint32_t>(get(8, 4));
  h.world_size = static_cast<uint32_t>(get(12, 4));
  return h;
}

// Text from a peer, safe to put in a message or a log line.
inline std::string printable(std::string_view s) {
  std::string out(s.substr(0, 1024));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) c = '?';
  return out;
}

}  // namespace terse::comm::tcp_wire
