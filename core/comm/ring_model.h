// The byte model of the ring collectives per rank, without frame headers: what nccl-tests' busbw assumes, what the
// NCCL and torch.distributed communicators report (they cannot measure), and what `terse plugins show` predicts. The
// host communicator's transports measure the real frames instead (allreduce_ring.h: the same 2(n-1)/n plus the
// chunk remainders and a 32-byte header per frame, tests/comm/traffic_test.cc).
#pragma once

#include <cstdint>

#include "core/comm/collective.h"

namespace terse::comm {

// A ring allreduce of `bytes` (reduce-scatter then allgather, Patarasuk and Yuan 2009) sends and receives 2(n-1)/n x
// bytes per rank, rounded down; split so that the product cannot overflow for any message that fits in memory.
constexpr uint64_t ringAllreduceBytes(uint64_t bytes, int n) noexcept {
  if (n <= 1) return 0;
  const auto nn = static_cast<uint64_t>(n), f = 2 * (nn - 1);
  return bytes / nn * f + bytes % nn * f / nn;
}

// A ring allgather of one block of `block_bytes` per rank sends and receives the n - 1 other ranks' blocks.
constexpr uint64_t ringAllgatherBytes(uint64_t block_bytes, int n) noexcept {
  return n <= 1 ? 0 : static_cast<uint64_t>(n - 1) * block_bytes;
}

// One call of a modeled collective: `bytes` each way, one frame per direction when it moves anything.
constexpr WireBytes symmetricWire(uint64_t bytes) noexcept {
  const uint64_t frames = bytes != 0 ? 1 : 0;
  return WireBytes{bytes, bytes, frames, frames};
}

}  // namespace terse::comm
